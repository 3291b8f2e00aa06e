// Trust: dead handles, and a communicator destroyed, aborted or forked from another thread.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/trust_fixture.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "lib/comm/c_api.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"

namespace mtxcomm {
namespace {

using namespace trusttest;  // NOLINT: the Trust fixture, kTimeout, secondsSince

// ---- Handles and threads --------------------------------------------------------------------

TEST_F(Trust, DestroyedAndGarbageHandlesAreInvalidArguments) {
  auto comms = testing::makeInprocComms(1);
  mtxcomm_comm_t comm = comms[0];
  float x = 1;
  ASSERT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
            MTXCOMM_SUCCESS);
  ASSERT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);
  EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
            MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "not a live communicator"))
      << mtxcomm_get_last_error(nullptr);
  EXPECT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_INVALID_ARGUMENT);  // twice
  EXPECT_EQ(mtxcomm_comm_abort(comm), MTXCOMM_INVALID_ARGUMENT);
  int rank = -1;
  EXPECT_EQ(mtxcomm_comm_rank(comm, &rank), MTXCOMM_INVALID_ARGUMENT);
  uint64_t garbage[8] = {0xdeadbeef, 1, 2, 3, 4, 5, 6, 7};
  auto bogus = reinterpret_cast<mtxcomm_comm_t>(garbage);
  EXPECT_EQ(mtxcomm_barrier(bogus), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_destroy(bogus), MTXCOMM_INVALID_ARGUMENT);
}

// Runs call() on this thread while a watchdog thread aborts (or destroys) comm after 300 ms:
// expects call to end within 1.5 s with a message naming what happened (the handle is gone:
// this thread's record). Returns call's result.
template <class Call>
mtxcomm_result_t callEndedByRetire(bool useAbort, mtxcomm_comm_t comm, Call&& call) {
  std::thread watchdog([&] {
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_EQ(useAbort ? mtxcomm_comm_abort(comm) : mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);
  });
  const auto start = Clock::now();
  const mtxcomm_result_t rc = call();
  const double took = secondsSince(start);
  watchdog.join();
  EXPECT_LT(took, 1.5);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(comm),
                       useAbort ? "aborted (mtxcomm_comm_abort, another thread)"
                                : "destroyed (mtxcomm_comm_destroy, another thread)"))
      << mtxcomm_get_last_error(comm);
  return rc;
}

// A watchdog thread aborts (or destroys) a communicator whose collective is blocked on a peer
// that never calls: the collective returns promptly with an error naming what happened, over
// shm and over the point-to-point path.
void abortFromAnotherThread(bool useAbort, const std::string& shm) {
  SCOPED_TRACE((useAbort ? "abort, shm " : "destroy, shm ") + shm);
  Config cfg;
  cfg.timeoutSeconds = 30;
  cfg.shm = shm;
  auto comms = testing::makeInprocComms(2, cfg);
  runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
  std::vector<float> b(1 << 16, 1.0f);
  // One call on each rank first: this thread's next call on comms[0] then holds the handle the
  // fast way (handle_registry.h, HandleLease: a hazard slot, no reference), which
  // retireHandle() must wait for too.
  std::thread peer([&] {
    float y = 1;
    EXPECT_EQ(mtxcomm_allreduce(&y, &y, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1], nullptr),
              MTXCOMM_SUCCESS);
  });
  float x = 1;
  EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0], nullptr),
            MTXCOMM_SUCCESS);
  peer.join();
  EXPECT_EQ(x, 2.0f);
  EXPECT_NE(callEndedByRetire(useAbort, comms[0],
                              [&] {
                                return mtxcomm_allreduce(b.data(), b.data(), b.size(),
                                                         MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0],
                                                         nullptr);
                              }),
            MTXCOMM_SUCCESS);
  // The peer, joining the collective late, fails with a remote error (rank 0 was cancelled;
  // it is not a disagreement on the call).
  EXPECT_EQ(mtxcomm_allreduce(b.data(), b.data(), b.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1],
                              nullptr),
            MTXCOMM_REMOTE_ERROR)
      << mtxcomm_get_last_error(comms[1]);
  mtxcomm_comm_destroy(comms[1]);
}

// Threads calling on a handle while another destroys it: every call either runs on the live
// communicator or is rejected as not live; none touches a freed one (ASan and TSan builds run
// this). Each thread's calls after its first hold the handle without a lock
// (lib/comm/handle_registry.h, HandleLease).
TEST_F(Trust, CallsRacingADestroyEitherRunOrAreRejected) {
  constexpr int kThreads = 3;
  for (int round = 0; round < 30; ++round) {
    auto comms = testing::makeInprocComms(1);
    mtxcomm_comm_t comm = comms[0];
    std::atomic<int> started{0};
    std::vector<int> ran(kThreads, 0), rejected(kThreads, 0);
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t) {
      callers.emplace_back([&, t] {
        bool counted = false;
        for (;;) {
          int size = -1;
          const mtxcomm_result_t rc = mtxcomm_comm_size(comm, &size);
          if (rc == MTXCOMM_SUCCESS) {
            EXPECT_EQ(size, 1);
            ++ran[t];
          } else {
            EXPECT_EQ(rc, MTXCOMM_INVALID_ARGUMENT);
            EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "not a live communicator"))
                << mtxcomm_get_last_error(nullptr);
            ++rejected[t];
            break;
          }
          if (!counted && ran[t] >= 2) {
            started.fetch_add(1);
            counted = true;
          }
        }
      });
    }
    while (started.load() < kThreads) std::this_thread::yield();
    ASSERT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);
    for (auto& c : callers) c.join();
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_GE(ran[t], 2) << "thread " << t;
      EXPECT_EQ(rejected[t], 1) << "thread " << t;
    }
  }
}

// A thread asleep in mtxcomm_comm_wait_notify (a 60 s timeout) while another destroys or
// aborts the communicator: the wait ends at once with the reason, not at its timeout.
TEST_F(Trust, DestroyFromAnotherThreadEndsAWaitNotify) {
  for (bool useAbort : {false, true}) {
    SCOPED_TRACE(useAbort ? "abort" : "destroy");
    Config cfg;
    cfg.timeoutSeconds = 30;
    auto comms = testing::makeInprocComms(2, cfg);
    runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
    mtxcomm_notify_state_t seen{}, now{};
    ASSERT_EQ(mtxcomm_comm_notify_state(comms[0], &seen), MTXCOMM_SUCCESS);
    EXPECT_EQ(
        callEndedByRetire(useAbort, comms[0],
                          [&] { return mtxcomm_comm_wait_notify(comms[0], &seen, 60.0, &now); }),
        MTXCOMM_INVALID_USAGE);
    mtxcomm_comm_destroy(comms[1]);
  }
}

// fork() while another thread is inside a call: in the child, the parent's communicators are
// refused (MTXCOMM_INVALID_USAGE naming fork) and destroy forgets them at once (it hung on the
// dead thread's hold, and freeing them marked the parent's rank gone); the parent's ranks go on.
TEST_F(Trust, AForkedChildCannotUseOrBreakItsParentsCommunicators) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "fork() of a multi-threaded process is not supported under ThreadSanitizer";
#else
  Config cfg;
  cfg.timeoutSeconds = 30;
  auto comms = testing::makeInprocComms(2, cfg);
  runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
  std::vector<float> a(1024, 1.0f), b(1024, 2.0f);
  std::atomic<bool> inCall{false};
  mtxcomm_result_t rcA = MTXCOMM_INTERNAL_ERROR;
  std::thread caller([&] {
    int r = -1;
    EXPECT_EQ(mtxcomm_comm_rank(comms[0], &r), MTXCOMM_SUCCESS);  // the next call: a fast lease
    inCall = true;
    rcA = mtxcomm_allreduce(a.data(), a.data(), a.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0],
                            nullptr);  // waits for rank 1, which calls after the fork
  });
  while (!inCall) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(100));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);  // a hang is a failure the parent sees
    float x = 1;
    int code = 0;
    const mtxcomm_result_t used =
        mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1], nullptr);
    if (used != MTXCOMM_INVALID_USAGE) code |= 1;
    if (!contains(mtxcomm_get_last_error(comms[1]), "forked")) code |= 2;
    if (mtxcomm_comm_destroy(comms[0]) != MTXCOMM_SUCCESS) code |= 4;  // another thread's call
    if (mtxcomm_comm_destroy(comms[1]) != MTXCOMM_SUCCESS) code |= 8;
    if (mtxcomm_comm_destroy(comms[1]) != MTXCOMM_INVALID_ARGUMENT) code |= 16;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status)
                                 << " (SIGALRM: it hung)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 call not refused, 2 message, 4/8 destroy, 16 twice";
  // The parent's communicator still works: rank 1 joins the call in flight.
  EXPECT_EQ(mtxcomm_allreduce(b.data(), b.data(), b.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[1],
                              nullptr),
            MTXCOMM_SUCCESS)
      << mtxcomm_get_last_error(comms[1]);
  caller.join();
  EXPECT_EQ(rcA, MTXCOMM_SUCCESS) << mtxcomm_get_last_error(comms[0]);
  EXPECT_EQ(a[7], 3.0f);
  EXPECT_EQ(b[7], 3.0f);
  mtxcomm_comm_destroy(comms[0]);
  mtxcomm_comm_destroy(comms[1]);
#endif
}

TEST_F(Trust, AbortFromAnotherThreadEndsABlockedCollective) {
  abortFromAnotherThread(true, "auto");
  abortFromAnotherThread(true, "off");
  abortFromAnotherThread(false, "auto");
  abortFromAnotherThread(false, "off");
}

}  // namespace
}  // namespace mtxcomm
