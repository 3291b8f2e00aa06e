// Errors from peers through the C API: a timeout names this rank, the awaited peer, the
// collective and the algorithm, then poisons the communicator; an aborted peer is a remote error
// naming it, long before the timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "harness.h"
#include "lib/comm/config.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"

namespace mtxcomm {
namespace {

using testing::makeInprocComms;
using testing::runRanks;
using testutil::contains;

TEST(Api, TimeoutNamesThePeerThenPoisons) {
  for (const char* shm : {"off", "auto"}) {
    Config cfg;
    cfg.timeoutSeconds = 0.3;
    cfg.shm = shm;
    const std::string algo = cfg.shm == "off" ? "recursive_doubling" : "shm";
    std::atomic<bool> rank0Done{false};
    runRanks(
        2,
        [&](mtxcomm_comm_t comm, int rank) {
          if (rank == 1) {
            // Never joins; waits until rank 0 has given up.
            while (!rank0Done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            return;
          }
          float x[4] = {1, 2, 3, 4};
          auto t0 = std::chrono::steady_clock::now();
          mtxcomm_result_t rc =
              mtxcomm_allreduce(x, x, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
          double secs =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          rank0Done = true;
          EXPECT_EQ(rc, MTXCOMM_TIMEOUT);
          EXPECT_GE(secs, 0.3);
          // Not a speed check: only "gave up, did not hang" (a loaded host stretches it).
          EXPECT_LT(secs, 120.0);
          std::string msg = mtxcomm_get_last_error(comm);
          EXPECT_TRUE(contains(msg, "rank 0")) << msg;
          EXPECT_TRUE(contains(msg, "peer rank 1")) << msg;
          EXPECT_TRUE(contains(msg, "allreduce")) << msg;
          EXPECT_TRUE(contains(msg, "algorithm " + algo)) << msg;
          // Poisoned: the next call fails at once and points back to the first error.
          EXPECT_EQ(mtxcomm_barrier(comm), MTXCOMM_INVALID_USAGE);
          std::string again = mtxcomm_get_last_error(comm);
          EXPECT_TRUE(contains(again, "first error was")) << again;
          EXPECT_TRUE(contains(again, "peer rank 1")) << again;
        },
        cfg);
  }
}

TEST(Api, AbortedPeerIsARemoteErrorNamingIt) {
  Config cfg;
  cfg.timeoutSeconds = 20;  // the errors must come long before this
  auto comms = makeInprocComms(3, cfg);
  std::vector<mtxcomm_result_t> rc(3, MTXCOMM_SUCCESS);
  std::vector<std::string> msg(3);
  std::vector<double> secs(3, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> x(1 << 16, 1.0f);
      auto t0 = std::chrono::steady_clock::now();
      rc[r] = mtxcomm_allreduce(x.data(), x.data(), x.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM,
                                comms[r], nullptr);
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      msg[r] = mtxcomm_get_last_error(comms[r]);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  mtxcomm_comm_abort(comms[2]);
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rc[r], MTXCOMM_REMOTE_ERROR) << msg[r];
    EXPECT_TRUE(contains(msg[r], "peer rank 2")) << msg[r];
    // REMOTE_ERROR, not TIMEOUT: the abort reached them before the 20 s timeout.
    EXPECT_LT(secs[r], cfg.timeoutSeconds);
    mtxcomm_comm_destroy(comms[r]);
  }
}

// An event-driven engine sleeps in mtxcomm_comm_wait_notify while it waits for a peer's work;
// a peer that aborts sends no notification, so the wait itself must notice (and, over the
// same check, a peer process that died: tests/shm's idle_kill test).
TEST(Api, AnIdleWaitForNotificationsEndsWhenAPeerAborts) {
  Config cfg;
  cfg.timeoutSeconds = 20;
  auto comms = makeInprocComms(3, cfg);
  std::vector<mtxcomm_result_t> rc(2, MTXCOMM_SUCCESS);
  std::vector<std::string> msg(2);
  std::vector<double> secs(2, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      unwrapComm(comms[r])->setup(nullptr);
      ASSERT_EQ(mtxcomm_barrier(comms[r]), MTXCOMM_SUCCESS) << mtxcomm_get_last_error(comms[r]);
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        mtxcomm_comm_abort(comms[2]);
        return;
      }
      mtxcomm_notify_state_t seen{}, now{};
      ASSERT_EQ(mtxcomm_comm_notify_state(comms[r], &seen), MTXCOMM_SUCCESS)
          << mtxcomm_get_last_error(comms[r]);
      const auto t0 = std::chrono::steady_clock::now();
      rc[r] = mtxcomm_comm_wait_notify(comms[r], &seen, 60.0, &now);
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      msg[r] = mtxcomm_get_last_error(comms[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rc[r], MTXCOMM_REMOTE_ERROR) << "rank " << r << ": " << msg[r];
    EXPECT_TRUE(contains(msg[r], "peer rank 2 aborted")) << msg[r];
    // Not a speed check: well before the 60 s the wait was given (checks every 200 ms).
    EXPECT_LT(secs[r], 30.0);
    mtxcomm_comm_destroy(comms[r]);
  }
}

}  // namespace
}  // namespace mtxcomm
