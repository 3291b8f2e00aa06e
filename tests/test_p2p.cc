// Point-to-point in the C API (mtxcomm_isend, mtxcomm_irecv, mtxcomm_test, mtxcomm_wait,
// mtxcomm_request_free, mtxcomm_send, mtxcomm_recv): ranks as threads over the in-process
// transport and over TCP, through the real C API. The shared cases (tests/common/p2p_cases.h)
// also run as processes under mpirun and the store bootstrap (tests/mp/mp_p2p.cc). Here besides:
// a wait that times out, a peer that aborts during a receive, destroy with requests pending, and
// the cost of the point-to-point view at setup.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/p2p_cases.h"
#include "common/test_util.h"
#include "harness.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/comm/stores.h"
#include "transports/shm/shm_p2p.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace {

using p2pcases::Ctx;
using p2pcases::P2pCheck;

using Case = std::function<void(const Ctx&, P2pCheck&)>;

// Runs a case on n ranks as threads over the in-process transport.
void onInproc(int n, const Case& fn) {
  testing::runRanks(n, [&](mtxcomm_comm_t comm, int rank) {
    P2pCheck ck(rank);
    fn(p2pcases::ctxOf(comm), ck);
    for (const std::string& f : ck.failures()) ADD_FAILURE() << f;
  });
}

// Runs a case on n ranks as threads, each with its own TCP transport. shm "off": no shared
// memory (the collectives of the concurrency case share the sockets with point-to-point);
// "on": the ranks share a segment, and the user's messages go through the shared-memory rings
// (transports/shm/shm_p2p.h), which this checks.
void onTcp(int n, const Case& fn, const char* shm = "off") {
  const std::string spec = testutil::tcpSpec();
  std::vector<std::unique_ptr<Store>> stores(n);
  std::vector<mtxcomm_comm_t> comms(n);
  const std::chrono::milliseconds timeout(20000);
  testutil::runThreads(n, [&](int rank) {
    stores[rank] = makeStore(spec, rank, n, timeout, testutil::testSecret());
    Config cfg;
    cfg.shm = shm;
    auto comm = std::make_unique<Comm>(makeTcpTransport(*stores[rank], rank, n, timeout), cfg, 0);
    comm->setup();
    EXPECT_STREQ(comm->p2p()->transportName(), std::string(shm) == "off" ? "tcp" : "shm");
    comms[rank] = wrapComm(std::move(comm));
  });
  testutil::runThreads(n, [&](int rank) {
    P2pCheck ck(rank);
    fn(p2pcases::ctxOf(comms[rank]), ck);
    for (const std::string& f : ck.failures()) ADD_FAILURE() << f;
  });
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

Case all() {
  return [](const Ctx& c, P2pCheck& ck) { p2pcases::allCases(c.comm, ck); };
}

TEST(P2pInproc, AllCases_np1) { onInproc(1, all()); }
TEST(P2pInproc, AllCases_np2) { onInproc(2, all()); }
TEST(P2pInproc, AllCases_np3) { onInproc(3, all()); }
TEST(P2pInproc, Ring_np4) { onInproc(4, p2pcases::ring); }
TEST(P2pInproc, Exchange_np4) {
  onInproc(4, [](const Ctx& c, P2pCheck& ck) { p2pcases::exchange(c, ck, size_t{16} << 20); });
}
TEST(P2pTcp, AllCases_np2) { onTcp(2, all()); }
TEST(P2pTcp, AllCases_np3) { onTcp(3, all()); }
TEST(P2pTcp, Ring_np4) { onTcp(4, p2pcases::ring); }
TEST(P2pShm, AllCases_np2) { onTcp(2, all(), "on"); }
TEST(P2pShm, AllCases_np3) { onTcp(3, all(), "on"); }
TEST(P2pShm, Ring_np4) { onTcp(4, p2pcases::ring, "on"); }
// Messages of 1 B to 3x the ring in both directions at once, posted before and after the
// receives (the unexpected queue, a message streamed while its receive is posted).
TEST(P2pShm, ExchangeAroundTheRingSize_np2) {
  onTcp(
      2,
      [](const Ctx& c, P2pCheck& ck) {
        const size_t ring = ShmP2pTransport::ringBytesFor(2);
        for (size_t bytes : {size_t{1}, ring / 2 - 16, ring - 16, ring, ring + 1, 3 * ring}) {
          p2pcases::exchange(c, ck, bytes);
        }
      },
      "on");
}

// A wait past its timeout fails the request with MTXCOMM_TIMEOUT naming the peer, and every other
// pending request with it; later posts quote it. Collectives go on.
TEST(P2pInproc, WaitTimeoutFailsTheChannel) {
  testing::runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    if (rank == 0) {
      int a = 0, b = 0;
      mtxcomm_request_t ra = nullptr, rb = nullptr;
      ASSERT_EQ(mtxcomm_irecv(&a, 1, MTXCOMM_INT32, 1, 1, comm, &ra), MTXCOMM_SUCCESS);
      ASSERT_EQ(mtxcomm_irecv(&b, 1, MTXCOMM_INT32, 1, 2, comm, &rb), MTXCOMM_SUCCESS);
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(mtxcomm_wait(ra, 0.2), MTXCOMM_TIMEOUT);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
      const std::string msg = mtxcomm_get_last_error(comm);
      EXPECT_TRUE(testutil::contains(msg, "rank 0")) << msg;
      EXPECT_TRUE(testutil::contains(msg, "receive from peer rank 1 (tag 1")) << msg;
      EXPECT_EQ(mtxcomm_wait(rb, 0), MTXCOMM_TIMEOUT);
      EXPECT_TRUE(testutil::contains(mtxcomm_get_last_error(comm), "tag 2")) << msg;
      EXPECT_EQ(mtxcomm_request_free(ra), MTXCOMM_SUCCESS);
      EXPECT_EQ(mtxcomm_request_free(rb), MTXCOMM_SUCCESS);
      mtxcomm_request_t rc = nullptr;
      EXPECT_EQ(mtxcomm_isend(&a, 1, MTXCOMM_INT32, 1, 1, comm, &rc), MTXCOMM_INVALID_USAGE);
      EXPECT_TRUE(testutil::contains(mtxcomm_get_last_error(comm), "timed out"));
    }
    int x = 1;
    EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_INT32, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(x, 2);
  });
}

// A peer that aborts while this rank waits in a receive from it: MTXCOMM_REMOTE_ERROR naming it,
// well before the timeout.
TEST(P2pInproc, PeerAbortDuringReceive) {
  auto comms = testing::makeInprocComms(2);
  testutil::runThreads(2, [&](int rank) {
    unwrapComm(comms[rank])->setup();
    if (rank == 0) {
      double v = 0;
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(mtxcomm_recv(&v, 1, MTXCOMM_FLOAT64, 1, 0, comms[0]), MTXCOMM_REMOTE_ERROR);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
      const std::string msg = mtxcomm_get_last_error(comms[0]);
      EXPECT_TRUE(testutil::contains(msg, "rank 0: receive from peer rank 1")) << msg;
      EXPECT_TRUE(testutil::contains(msg, "peer rank 1 aborted")) << msg;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_EQ(mtxcomm_comm_abort(comms[1]), MTXCOMM_SUCCESS);
    }
  });
  mtxcomm_comm_destroy(comms[0]);
}

// Destroy with requests pending: they complete with an error naming the destroy, the handles
// stay valid until freed, and the destroy does not wait for a peer.
TEST(P2pInproc, DestroyCompletesPendingRequests) {
  auto comms = testing::makeInprocComms(2);
  testutil::runThreads(2, [&](int rank) { unwrapComm(comms[rank])->setup(); });
  int v = 0;
  mtxcomm_request_t r = nullptr;
  ASSERT_EQ(mtxcomm_irecv(&v, 1, MTXCOMM_INT32, 1, 0, comms[0], &r), MTXCOMM_SUCCESS);
  std::thread waiter([&] { EXPECT_EQ(mtxcomm_wait(r, 0), MTXCOMM_INVALID_USAGE); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(mtxcomm_comm_destroy(comms[0]), MTXCOMM_SUCCESS);
  waiter.join();
  int done = 0;
  EXPECT_EQ(mtxcomm_test(r, &done), MTXCOMM_INVALID_USAGE);
  EXPECT_EQ(done, 1);
  EXPECT_TRUE(testutil::contains(mtxcomm_get_last_error(nullptr), "destroyed"))
      << mtxcomm_get_last_error(nullptr);
  EXPECT_EQ(mtxcomm_request_free(r), MTXCOMM_SUCCESS);
  mtxcomm_comm_destroy(comms[1]);
}

// The point-to-point view made at setup, and what it cost (printed; the tests' record).
TEST(P2pTcp, SetupCost_np4) {
  onTcp(4, [](const Ctx& c, P2pCheck& ck) {
    const double s = unwrapComm(c.comm)->p2pSetupSeconds();
    ck.expect(s > 0 && s < 1, "setup cost " + std::to_string(s));
    if (c.rank == 0) std::printf("point-to-point view over tcp, np 4: %.1f us\n", s * 1e6);
  });
}

}  // namespace
}  // namespace mtxcomm
