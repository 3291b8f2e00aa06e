// Notifications for event-driven engines over a ShmGroup (shm_group.h, "Notifications"; the C
// API's mtxcomm_comm_notify and its kin, include/mtxcomm/mtxcomm_engine.h): asking the peers to
// join a cycle and waking them, sleeping until asked, idle ranks woken late, and the cycle each
// rank has entered.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "lib/base/error.h"
#include "lib/base/spin.h"
#include "transports/shm/shm_group.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_wait.h"

namespace mtxcomm {

using shm::futexWait;
using shm::futexWake;

void ShmGroup::notify(uint64_t cycle) {
  owed_.clear();
  enterCycle(cycle);  // first: a peer that sees the request also sees this rank in the cycle
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Control& c = control(q);
    uint64_t old = c.notifyCycle.load(std::memory_order_relaxed);
    while (old < cycle &&
           !c.notifyCycle.compare_exchange_weak(old, cycle, std::memory_order_seq_cst)) {
    }
    // seq_cst with the peer's store of notifyIdle and its load of notifyCycle (setIdle, then
    // notifyState): either this sees it no longer idle, or it sees the new cycle and does not
    // sleep. A wrong guess costs only time: the owed wake is paid once this rank's next wait
    // has slept kOwedWakeDelay.
    if (c.notifyIdle.load(std::memory_order_seq_cst) != 0) {
      owed_.push_back(q);
      continue;
    }
    wake(c);
  }
  owedCall_ = 0;  // the next collective entered (the engine's exchange)
}

void ShmGroup::wake(Control& c) {
  // seq_cst with the waiter's increment of notifyWaiters and the futex's compare of wakeSeq
  // (waitNotify): either this sees the waiter, or the waiter sees the new token and does not
  // sleep. A busy peer (in its cycle) costs no system call.
  c.wakeSeq.fetch_add(1, std::memory_order_seq_cst);
  if (c.notifyWaiters.load(std::memory_order_seq_cst) > 0) futexWake(&c.wakeSeq);
}

void ShmGroup::payOwedWakes() {
  for (int q : owed_) wake(control(q));
  owed_.clear();
}

void ShmGroup::setIdle(bool idle) {
  control(rank_).notifyIdle.store(idle ? 1 : 0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the caller's notifyState
}

ShmGroup::NotifyState ShmGroup::notifyState() const {
  Control& c = control(rank_);
  NotifyState st;
  st.token = c.wakeSeq.load(std::memory_order_acquire);
  st.cycle = c.notifyCycle.load(std::memory_order_acquire);
  return st;
}

ShmGroup::NotifyState ShmGroup::waitNotify(const NotifyState& seen, Clock::time_point deadline) {
  Control& c = control(rank_);
  // A peer that dies or aborts while this rank sleeps here sends no notification: every
  // kIdleCheck of sleep, look for one, so that an engine waiting for a peer's submission (which
  // will never come) runs its next exchange and fails naming that peer, instead of sleeping
  // until its stall timeout. The first slice checks nothing: a busy engine pays no system call.
  constexpr auto kIdleCheck = std::chrono::milliseconds(200);
  for (bool slept = false;; slept = true) {
    if (cancel_) cancel_->check();  // destroy or abort from another thread (Comm::cancel wakes)
    const NotifyState now = notifyState();
    if (now.token != seen.token || now.cycle != seen.cycle) return now;
    if (slept) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        Control& cq = control(q);
        if (cq.aborted.load(std::memory_order_acquire)) {
          fail(MTXCOMM_REMOTE_ERROR, "peer rank ", q,
               " aborted while this rank was idle: ", cq.reason);
        }
        // A peer that destroyed its communicator first (an orderly exit) is not a dead one.
        if (!cq.left.load(std::memory_order_acquire) && peerProcessGone(q)) {
          fail(MTXCOMM_REMOTE_ERROR, "peer rank ", q, " (pid ", cq.pid.load(),
               ", on this node) has exited while this rank was idle");
        }
      }
    }
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return now;
    c.notifyWaiters.fetch_add(1, std::memory_order_seq_cst);
    futexWait(&c.wakeSeq, static_cast<uint32_t>(seen.token),
              std::min<Clock::duration>(left, kIdleCheck));
    c.notifyWaiters.fetch_sub(1, std::memory_order_relaxed);
  }
}

void ShmGroup::wakeup() { wake(control(rank_)); }

void ShmGroup::enterCycle(uint64_t cycle) {
  std::atomic<uint64_t>& entered = control(rank_).enteredCycle;
  if (entered.load(std::memory_order_relaxed) < cycle) {
    entered.store(cycle, std::memory_order_release);
  }
}

int ShmGroup::peersInCycle(uint64_t cycle, bool spin) const {
  auto count = [&] {
    int n = 0;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_ && control(q).enteredCycle.load(std::memory_order_acquire) >= cycle) ++n;
    }
    return n;
  };
  int n = count();
  if (spin && n < size_ - 1) spinUntil(spinPauses_, [&] { return (n = count()) == size_ - 1; });
  return n;
}

}  // namespace mtxcomm
