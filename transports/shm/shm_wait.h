// The waits of a ShmGroup (shm_group.h, "Waiting") and the publication that ends them: a rank
// advances a counter with a release store and bumps its progress word (published); a waiter
// spins on the peer's counter, then sleeps on that word (a futex) while watching its deadline,
// the peers' abort flags and, every 50 ms, whether their processes still exist. Inline here:
// every collective over the segment goes through them (shm_group.cc, shm_lines.cc,
// shm_calls.cc). Abort, liveness and the failure of a wait: shm_wait.cc.
#ifndef MTXCOMM_TRANSPORTS_SHM_SHM_WAIT_H_
#define MTXCOMM_TRANSPORTS_SHM_SHM_WAIT_H_

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "lib/base/clock.h"
#include "lib/base/membarrier.h"
#include "lib/base/spin.h"
#include "transports/shm/shm_group.h"
#include "transports/shm/shm_segment.h"

namespace mtxcomm {
namespace shm {

constexpr int kOversubscribedYields = 20000;  // see waitFor

// The futex word is in memory shared between processes: no FUTEX_PRIVATE_FLAG.
inline void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void futexWait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration left) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace shm

inline void ShmGroup::published(Control& c) {
  if (!asymmetric_) {
    publishedFenced(c);
    return;
  }
  // No fence: the sleeper's membarrier (waitUntil) orders this rank's stores before its load
  // of sleepers. A locked instruction here made every publication wait until the lines just
  // written had left this core (their readers' copies invalidated): one cross-core round trip
  // per call, 35-130 ns on the Zen 4 guest, where the stores otherwise drain while the caller
  // goes on. Only the thread running this rank's calls publishes here (abort and destroy use
  // publishedFenced), so the increment needs no atomic read-modify-write.
  c.progress.store(c.progress.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_relaxed) > 0) shm::futexWake(&c.progress);
}

inline void ShmGroup::publishedFenced(Control& c) {
  // seq_cst with the sleeper's increment of sleepers and its load of progress (waitFor): either
  // this sees the sleeper, or the sleeper sees the new progress value and does not sleep.
  c.progress.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) > 0) shm::futexWake(&c.progress);
}

inline void ShmGroup::waitFor(int p, Counter counter, uint64_t target, const char* what,
                              int parity) {
  auto value = [this, counter](int r) -> uint64_t {
    Control& c = control(r);
    switch (counter) {
      case Counter::kLinesRead:
        return c.linesRead.load(std::memory_order_acquire);
      case Counter::kArrived:
        return c.arrived.load(std::memory_order_acquire);
      case Counter::kConsumed:
        return c.consumed.load(std::memory_order_acquire);
      case Counter::kSmallPosted:
        return c.smallPosted.load(std::memory_order_acquire);
      case Counter::kSmallConsumed:
        return c.smallConsumed.load(std::memory_order_acquire);
      case Counter::kCall:
        return c.callSeq.load(std::memory_order_acquire);
      case Counter::kPosted:
        break;
    }
    return c.posted.load(std::memory_order_acquire);
  };
  waitUntil(p, value, target, what);
  if (parity < 0) return;
  Control& c = control(p);
  checkSameCall(p, counter == Counter::kPosted ? c.postCall[parity].load() : c.call[parity].load());
}

template <class Word>
void ShmGroup::waitUntil(int p, const Word& word, uint64_t target, const char* what) {
  Control& c = control(p);
  if (word(p) < target) {
    // Spin kSpinMicros, then sleep on the peer's progress word (a futex) until it advances a
    // counter: a waiter never holds a core that the peer — or a framework thread of this rank —
    // needs. Yield-polling there kept the core until the scheduler's next tick: a
    // 4 MiB allreduce beside TensorFlow's compute thread on the same core took 20 ms (16 chunk
    // hand-offs of a time slice each), 1.9 ms with the futex. When the group's own ranks
    // outnumber the cores, the peer needs this very core: spin kOversubscribedSpinMicros, then
    // yield it (up to
    // kOversubscribedYields times: a hand-off costs no system call on either side), then sleep
    // (small allreduces at 4 ranks on 2 cores: 9 us with yields, 29 us with the futex alone).
    // The spin reads nothing but the word: most waits end there, and the checks below (the
    // peer's call, the clock, this process's pid) would each cost more than the wait itself
    // (a cross-core line, a vDSO call, a system call).
    if (spinUntil(spinPauses_, [&] { return word(p) >= target; })) return;
    if (waitRecord_) waitRecord_->note(p);  // the flight recorder
    checkPeerCall(p);  // a peer in another call (or one it rejected) never gets there
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(timeoutSeconds_));
    // Peer liveness is checked every 50 ms of waiting, whatever the phase of the backoff (the
    // clock is read every 64 yields: well under a millisecond while yielding).
    Clock::time_point nextCheck = start + std::chrono::milliseconds(50);
    for (int k = 0; oversubscribed_ && k < 1000 && word(p) < target; ++k) {
      sched_yield();
      if ((k & 63) == 63 && Clock::now() >= nextCheck) break;  // liveness below
    }
    // The idle peers a notify left asleep (setIdle) come by themselves with their own work; one
    // still missing after kOwedWakeDelay of this wait is woken (a peer that will not submit: its
    // engine must still take part in the cycle, for the stall verdict that follows).
    const auto owedDue = start + kOwedWakeDelay;
    while (word(p) < target) {
      const auto now = Clock::now();
      if (!owed_.empty() && now >= owedDue) payOwedWakes();
      if (now >= nextCheck) {
        nextCheck = now + std::chrono::milliseconds(50);
        // Dead processes first (the root cause), then peers that aborted because of one.
        for (int q = 0; q < size_; ++q) {
          if (q == rank_) continue;
          Control& cq = control(q);
          // A peer that already got there may have finished and exited normally.
          const bool there = word(q) >= target;
          // A zombie is dead too: a launcher that reaps late (a parent waiting for another
          // rank first) would otherwise hide it until the timeout.
          if (!there && !cq.aborted.load() && peerProcessGone(q)) {
            failPeer(q, what, false);
          }
          // A peer that destroyed its communicator before this call will never join it.
          if (cq.left.load(std::memory_order_acquire) &&
              cq.callSeq.load(std::memory_order_acquire) < call_.seq) {
            failPeer(q, what, false);
          }
          checkPeerCall(q);
        }
        for (int q = 0; q < size_; ++q) {
          if (q != rank_ && control(q).aborted.load(std::memory_order_acquire)) {
            // A peer's abort seen after p got there (p left a barrier and aborted its next
            // call, or q did after meeting p there): this wait is over, the abort is the next
            // wait's. The acquire above makes p's word, stored before that abort, visible.
            if (word(p) >= target) return;
            failPeer(q, what, false);
          }
        }
        if (now > deadline) failPeer(p, what, true);
      }
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      // The peer publishes without a fence (published): a barrier on every core running a
      // rank makes its stores before its load of sleepers visible here, or lets it see this
      // sleeper (the asymmetric Dekker of membarrier(2)).
      if (asymmetric_) globalMembarrier();
      const uint32_t seen = c.progress.load(std::memory_order_seq_cst);
      if (word(p) < target) {
        shm::futexWait(
            &c.progress, seen,
            std::min<Clock::duration>(
                (owed_.empty() ? nextCheck : std::min(nextCheck, owedDue)) - Clock::now(),
                std::chrono::milliseconds(50)));
      }
      c.sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (cancel_) cancel_->check();
      if (c.aborted.load(std::memory_order_acquire) && word(p) < target) failPeer(p, what, false);
      if (word(p) < target) checkPeerCall(p);
    }
  }
}

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_SHM_SHM_WAIT_H_
