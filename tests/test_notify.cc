// Notifications between progress engines (mtxcomm_comm_notify, wait_notify, set_idle): a
// notify wakes a busy peer at once; an idle peer (mtxcomm_comm_set_idle) is left asleep, and is
// woken only when the notifier's next collective has waited for it (ShmGroup::kOwedWakeDelay).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "harness.h"
#include "lib/base/clock.h"
#include "lib/base/spin.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"

namespace mtxcomm {
namespace {

// The shm waits spin a time, not a count of pauses (whose latency varies 10-140 cycles across
// x86 models): pausesFor is linear in the time asked, and a spin of that many pauses lasts at
// least about that long (the calibration keeps its fastest timing; a preempted or slower later
// spin only lasts longer, so only the lower bound is checked, at half the time asked).
TEST(Spin, PausesForATimeLastAtLeastAboutThatTime) {
  const int small = pausesFor(20.0), large = pausesFor(400.0);
  ASSERT_GE(small, 1);
  EXPECT_GE(large, 19 * small);
  EXPECT_LE(large, 21 * small);
  EXPECT_EQ(pausesFor(1e-9), 1);
  std::atomic<unsigned> word{0};
  const auto start = Clock::now();
  spinUntil(large, [&] { return word.load(std::memory_order_relaxed) != 0; });
  const double micros = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  EXPECT_GE(micros, 200.0) << large << " pauses";
}

using testing::makeInprocComms;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sleeps in mtxcomm_comm_wait_notify from the state seen, for at most timeout seconds: the
// seconds it slept (negative when the wait failed, which is also reported).
double timedWait(mtxcomm_comm_t comm, const mtxcomm_notify_state_t& seen, double timeout,
                 mtxcomm_notify_state_t* now) {
  const auto t0 = Clock::now();
  const mtxcomm_result_t rc = mtxcomm_comm_wait_notify(comm, &seen, timeout, now);
  EXPECT_EQ(rc, MTXCOMM_SUCCESS) << mtxcomm_get_last_error(comm);
  return rc == MTXCOMM_SUCCESS ? since(t0) : -1;
}

// Two ranks as threads, their shared-memory group set up (and a barrier passed, unless
// barrierFirst is false): body(comm, rank).
template <class Body>
void twoRanks(Body body, bool barrierFirst = true) {
  auto comms = makeInprocComms(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      unwrapComm(comms[r])->setup(nullptr);
      if (barrierFirst) {
        ASSERT_EQ(mtxcomm_barrier(comms[r]), MTXCOMM_SUCCESS) << mtxcomm_get_last_error(comms[r]);
      }
      body(comms[r], r);
    });
  }
  for (auto& t : threads) t.join();
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

TEST(Notify, ABusyPeerIsWokenAtOnce) {
  std::atomic<bool> asleep{false};
  double woke = -1;
  mtxcomm_notify_state_t got{};
  twoRanks([&](mtxcomm_comm_t comm, int rank) {
    if (rank == 1) {
      mtxcomm_notify_state_t seen{};
      ASSERT_EQ(mtxcomm_comm_notify_state(comm, &seen), MTXCOMM_SUCCESS);
      asleep = true;
      woke = timedWait(comm, seen, 60.0, &got);
      return;
    }
    while (!asleep) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(mtxcomm_comm_notify(comm, 7), MTXCOMM_SUCCESS);
  });
  EXPECT_EQ(got.cycle, 7u);
  EXPECT_LT(woke, 30.0);  // not a speed check: far from the 60 s it was given
}

TEST(Notify, AnIdlePeerIsLeftAsleepUntilTheNotifierWaitsForIt) {
  std::atomic<bool> asleep{false};
  std::atomic<bool> notified{false};
  Clock::time_point collectiveAt{};
  std::atomic<bool> inCollective{false};
  double firstSleep = -1;
  mtxcomm_notify_state_t first{}, second{};
  std::vector<int32_t> gathered(2, -1);
  twoRanks([&](mtxcomm_comm_t comm, int rank) {
    if (rank == 1) {
      ASSERT_EQ(mtxcomm_comm_set_idle(comm, 1), MTXCOMM_SUCCESS);
      mtxcomm_notify_state_t seen{};
      ASSERT_EQ(mtxcomm_comm_notify_state(comm, &seen), MTXCOMM_SUCCESS);
      asleep = true;
      // A short wait: the notify comes during it, and leaves this idle rank asleep to its end.
      firstSleep = timedWait(comm, seen, 0.15, &first);
      ASSERT_TRUE(notified) << "the wait ended before the notify";
      // The state says a cycle was asked; sleep again until woken.
      ASSERT_EQ(mtxcomm_comm_wait_notify(comm, &first, 20.0, &second), MTXCOMM_SUCCESS);
      EXPECT_TRUE(inCollective) << "woken before the notifier's collective waited";
      const int32_t mine = 11;
      ASSERT_EQ(mtxcomm_allgather(&mine, gathered.data(), 1, MTXCOMM_INT32, comm, nullptr),
                MTXCOMM_SUCCESS);
      return;
    }
    while (!asleep) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    notified = true;
    ASSERT_EQ(mtxcomm_comm_notify(comm, 3), MTXCOMM_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past rank 1's short wait
    collectiveAt = Clock::now();
    inCollective = true;
    const int32_t mine = 10;
    std::vector<int32_t> all(2, -1);
    ASSERT_EQ(mtxcomm_allgather(&mine, all.data(), 1, MTXCOMM_INT32, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(all, (std::vector<int32_t>{10, 11}));
    EXPECT_LT(since(collectiveAt), 10.0);  // the owed wake came: not the 20 s rank 1 slept for
  });
  EXPECT_EQ(first.cycle, 3u);
  EXPECT_GE(firstSleep, 0.14) << "the notify woke an idle rank";
  EXPECT_EQ(gathered, (std::vector<int32_t>{10, 11}));
}

// The notifier's collective wakes the idle peer after kOwedWakeDelay (1 ms) of waiting for it:
// well before the 50 ms of a liveness check or the peer's own 200 ms check, also when the notify
// is the communicator's first call (its sequence numbers then start past setup's). The median
// of 3 trials, so that one slow thread wake-up on a busy machine does not decide.
TEST(Notify, AnIdlePeerIsWokenSoonAfterTheNotifierWaitsForIt) {
  for (bool barrierFirst : {true, false}) {
    std::vector<double> waited;
    for (int trial = 0; trial < 3; ++trial) {
      std::atomic<bool> asleep{false};
      double took = -1;
      twoRanks(
          [&](mtxcomm_comm_t comm, int rank) {
            int32_t mine = rank, all[2] = {-1, -1};
            if (rank == 1) {
              ASSERT_EQ(mtxcomm_comm_set_idle(comm, 1), MTXCOMM_SUCCESS);
              mtxcomm_notify_state_t seen{}, now{};
              ASSERT_EQ(mtxcomm_comm_notify_state(comm, &seen), MTXCOMM_SUCCESS);
              asleep = true;
              ASSERT_EQ(mtxcomm_comm_wait_notify(comm, &seen, 20.0, &now), MTXCOMM_SUCCESS);
            } else {
              while (!asleep) std::this_thread::yield();
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
              ASSERT_EQ(mtxcomm_comm_notify(comm, 1), MTXCOMM_SUCCESS);
            }
            const auto t0 = Clock::now();
            ASSERT_EQ(mtxcomm_allgather(&mine, all, 1, MTXCOMM_INT32, comm, nullptr),
                      MTXCOMM_SUCCESS);
            if (rank == 0) took = since(t0);
            EXPECT_EQ(all[0], 0);
            EXPECT_EQ(all[1], 1);
          },
          barrierFirst);
      waited.push_back(took);
    }
    std::sort(waited.begin(), waited.end());
    EXPECT_LT(waited[1], 0.025) << (barrierFirst ? "after a barrier" : "as the first call")
                                << ": the owed wake came late";
  }
}

TEST(Notify, AnIdlePeerThatComesByItselfIsNeverWoken) {
  // Rank 1 is idle and asleep; rank 0 notifies and enters the collective; rank 1's own work
  // (here: a wakeup from its own process, as an engine's submission does) brings it there. The
  // notify's wake is then dropped: rank 1's next sleep is not cut short by it.
  std::atomic<bool> asleep{false}, notified{false};
  double secondSleep = -1;
  twoRanks([&](mtxcomm_comm_t comm, int rank) {
    int32_t mine = rank, all[2] = {-1, -1};
    if (rank == 1) {
      ASSERT_EQ(mtxcomm_comm_set_idle(comm, 1), MTXCOMM_SUCCESS);
      mtxcomm_notify_state_t seen{}, now{};
      ASSERT_EQ(mtxcomm_comm_notify_state(comm, &seen), MTXCOMM_SUCCESS);
      asleep = true;
      while (!notified) std::this_thread::yield();
      ASSERT_EQ(mtxcomm_comm_wakeup(comm), MTXCOMM_SUCCESS);  // this rank's own submission
      ASSERT_EQ(mtxcomm_comm_wait_notify(comm, &seen, 60.0, &now), MTXCOMM_SUCCESS);
      ASSERT_EQ(mtxcomm_allgather(&mine, all, 1, MTXCOMM_INT32, comm, nullptr), MTXCOMM_SUCCESS);
      EXPECT_EQ(all[0], 0);
      EXPECT_EQ(all[1], 1);
      // Asleep again, until a timeout: no late wake arrives from the first notify.
      ASSERT_EQ(mtxcomm_comm_notify_state(comm, &seen), MTXCOMM_SUCCESS);
      secondSleep = timedWait(comm, seen, 0.1, &now);
      ASSERT_EQ(mtxcomm_barrier(comm), MTXCOMM_SUCCESS);
      return;
    }
    while (!asleep) std::this_thread::yield();
    ASSERT_EQ(mtxcomm_comm_notify(comm, 1), MTXCOMM_SUCCESS);
    notified = true;
    ASSERT_EQ(mtxcomm_allgather(&mine, all, 1, MTXCOMM_INT32, comm, nullptr), MTXCOMM_SUCCESS);
    // A later collective, with rank 1 asleep for a while: it must not pay the first notify's
    // wake (rank 1's sleep above runs to its timeout).
    ASSERT_EQ(mtxcomm_barrier(comm), MTXCOMM_SUCCESS);
  });
  EXPECT_GE(secondSleep, 0.09);
}

TEST(Notify, SetIdleChecksItsCommunicator) {
  EXPECT_EQ(mtxcomm_comm_set_idle(nullptr, 1), MTXCOMM_INVALID_ARGUMENT);
}

// A rank counts the peers that entered a cycle (mtxcomm_comm_enter_cycle, or implied by
// mtxcomm_comm_notify) without waking anyone; with spin it waits for a peer that comes within
// the spin, and one that does not come leaves it after the spin, never asleep.
TEST(Notify, PeersInCycleCountsThePeersThatEnteredIt) {
  std::atomic<int> step{0};
  std::vector<int> seen[2];  // what each rank counted, in order
  double missMicros = -1;
  twoRanks([&](mtxcomm_comm_t comm, int rank) {
    auto count = [comm](uint64_t cycle, int spin) {
      int n = -1;
      EXPECT_EQ(mtxcomm_comm_peers_in_cycle(comm, cycle, spin, &n), MTXCOMM_SUCCESS);
      return n;
    };
    if (rank == 1) {
      while (step < 1) std::this_thread::yield();
      ASSERT_EQ(mtxcomm_comm_enter_cycle(comm, 1), MTXCOMM_SUCCESS);
      step = 2;
      while (step < 3) std::this_thread::yield();
      ASSERT_EQ(mtxcomm_comm_notify(comm, 2), MTXCOMM_SUCCESS);
      step = 4;
      while (step < 5) cpuPause();
      ASSERT_EQ(mtxcomm_comm_enter_cycle(comm, 3), MTXCOMM_SUCCESS);  // within rank 0's spin
      seen[1].push_back(count(1, 0));                                 // rank 0 entered nothing
      return;
    }
    seen[0].push_back(count(1, 0));
    step = 1;
    while (step < 2) std::this_thread::yield();
    seen[0].push_back(count(1, 0));
    seen[0].push_back(count(2, 0));
    step = 3;
    while (step < 4) std::this_thread::yield();
    seen[0].push_back(count(2, 0));
    // Nobody enters cycle 9: the spin ends with 0, after about 22 us and well before a sleep.
    const auto t0 = Clock::now();
    seen[0].push_back(count(9, 1));
    missMicros = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    step = 5;
    // The peer may come later than the spin on a busy machine: then spin again.
    int n = 0;
    for (int k = 0; k < 100000 && n == 0; ++k) n = count(3, 1);
    seen[0].push_back(n);
  });
  // Rank 0: none; rank 1 in cycle 1; not in 2; in 2 (its notify); nobody in 9; in 3 (entered
  // during the spin). Rank 1: rank 0 entered nothing.
  EXPECT_EQ(seen[0], (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(seen[1], (std::vector<int>{0}));
  EXPECT_GE(missMicros, 10.0);
  EXPECT_LT(missMicros, 100000.0);
}

TEST(Notify, CycleCallsCheckTheirArguments) {
  int n = -1;
  EXPECT_EQ(mtxcomm_comm_enter_cycle(nullptr, 1), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_peers_in_cycle(nullptr, 1, 0, &n), MTXCOMM_INVALID_ARGUMENT);
  twoRanks([&](mtxcomm_comm_t comm, int) {
    EXPECT_EQ(mtxcomm_comm_peers_in_cycle(comm, 1, 0, nullptr), MTXCOMM_INVALID_ARGUMENT);
  });
}

}  // namespace
}  // namespace mtxcomm
