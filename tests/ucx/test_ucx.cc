// The UCX transport in one process: each rank is a thread with its own UCX worker, bootstrapped
// over the in-process transport by the same route (transports/route) init_from_env uses, forced
// to UCX (tests/common/ucx_transports.h). Collectives through the public C API against the
// closed-form data of tests/common, the per-peer route table, the eager limit and messages above
// 1 GiB. The transport contract (size mismatch, timeout naming the peer, abort frames, split
// views, ...) runs over UCX in tests/test_transport_contract.cc.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "common/ucx_transports.h"
#include "lib/base/error.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "mp/mp_check.h"
#include "transports/route/route.h"
#include "transports/ucx/ucx_transport.h"

namespace mtxcomm {
namespace {

using testdata::Case;

using testutil::contains;
using testutil::makeUcxTransports;
using testutil::runThreads;

Clock::time_point in(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<long>(seconds * 1e6));
}

// Whether a file whose path contains needle is mapped into this process (/proc/self/maps).
bool mapped(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

// Before main: what the loader mapped for this program and its libraries, before any test ran.
const bool kUcsMappedAtStart = mapped("libucs");

// UCX is not linked: the first UCX worker loads it (transports/ucx/ucx_api.h).
TEST(Ucx, LoadedByTheFirstWorkerNotWithTheLibrary) {
  EXPECT_FALSE(kUcsMappedAtStart) << "libucs was loaded with the program";
  std::string why;
  auto w = openUcxWorker(0, /*acrossNodes=*/false, &why);
  ASSERT_TRUE(w) << why;
  EXPECT_TRUE(mapped("libucp")) << "a UCX worker without libucp";
  EXPECT_TRUE(mapped("libucs")) << "a UCX worker without libucs";
}

TEST(Ucx, RouteTableNamesEveryPeer) {
  const int n = 3;
  auto ts = makeUcxTransports(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_STREQ(ts[r].transport->name(), "ucx");
    ASSERT_EQ(ts[r].routes.size(), static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      const std::string& line = ts[r].routes[p];
      if (p == r) {
        EXPECT_TRUE(contains(line, "this rank")) << line;
      } else {
        EXPECT_TRUE(contains(line, "peer rank " + std::to_string(p) + ":")) << line;
        EXPECT_TRUE(contains(line, "(this node)")) << line;
        EXPECT_TRUE(contains(line, "point-to-point over ucx")) << line;
      }
    }
  }
}

// Every algorithm of allreduce, broadcast, allgather and reduce-scatter, with the point-to-point
// algorithms (no shared-memory segment), checked bitwise on every rank.
TEST(Ucx, CollectivesMatchTheFormula) {
  for (int n : {2, 3, 4}) {
    for (Collective coll : {Collective::kAllreduce, Collective::kBroadcast, Collective::kAllgather,
                            Collective::kReduceScatter}) {
      for (const char* algo : algorithmNames(coll)) {
        if (std::string(algo) == "shm" || std::string(algo) == "adasum") continue;
        Config cfg;
        cfg.shm = "off";
        cfg.timeoutSeconds = 30;
        cfg.algo[static_cast<int>(coll)] = algo;
        auto ts = makeUcxTransports(n);
        std::vector<Case> cases;
        mp::appendCases(cases, coll, algo, n, {MTXCOMM_INT32, MTXCOMM_BFLOAT16, MTXCOMM_FLOAT32},
                        {MTXCOMM_SUM, MTXCOMM_MAX}, {0, 1, static_cast<size_t>(n) + 1, 70001});
        runThreads(n, [&](int r) {
          mtxcomm_comm_t comm =
              wrapComm(std::make_unique<Comm>(std::move(ts[r].transport), cfg, 0));
          for (const Case& c : cases) {
            const mp::Outcome o = mp::runCase(comm, r, n, c);
            EXPECT_EQ(o, mp::Outcome::kPass) << "rank " << r << ": " << c.describe(n);
            if (o == mp::Outcome::kCallFailed) break;
          }
          mtxcomm_comm_destroy(comm);
        });
      }
    }
  }
}

// MTXCOMM_UCX_EAGER_LIMIT sets UCX's rendezvous threshold only where UCX has no RDMA device,
// and never over the user's UCX_RNDV_THRESH.
TEST(Ucx, EagerLimitAppliesWithoutRdmaUnlessUcxIsTold) {
  std::string why;
  auto w = openUcxWorker(size_t{4} << 20, /*acrossNodes=*/true, &why);
  ASSERT_TRUE(w) << why;
  const std::string choice = ucxProtocolChoice(*w);
  std::printf("this node: %s\n", choice.c_str());
  if (choice.rfind("RDMA device ", 0) == 0) {
    EXPECT_TRUE(contains(choice, "UCX's own rendezvous threshold")) << choice;
  } else {
    EXPECT_EQ(choice,
              "no RDMA device (TCP between nodes): messages up to 4194304 bytes go eagerly "
              "(MTXCOMM_UCX_EAGER_LIMIT)");
    auto w0 = openUcxWorker(0, /*acrossNodes=*/true, &why);
    ASSERT_TRUE(w0) << why;
    EXPECT_TRUE(contains(ucxProtocolChoice(*w0), "MTXCOMM_UCX_EAGER_LIMIT=0"))
        << ucxProtocolChoice(*w0);
  }
  auto w1 = openUcxWorker(size_t{4} << 20, /*acrossNodes=*/false, &why);
  ASSERT_TRUE(w1) << why;
  EXPECT_EQ(ucxProtocolChoice(*w1), "all ranks on one node: UCX's own rendezvous threshold");
  ASSERT_EQ(setenv("UCX_RNDV_THRESH", "65536", 1), 0);
  auto wu = openUcxWorker(size_t{4} << 20, /*acrossNodes=*/true, &why);
  unsetenv("UCX_RNDV_THRESH");
  ASSERT_TRUE(wu) << why;
  EXPECT_EQ(ucxProtocolChoice(*wu), "rendezvous threshold UCX_RNDV_THRESH=65536");
}

// Messages below and above UCX's rendezvous threshold (eager and rendezvous), both directions at
// once, arrive intact. (These threads are on one node, where MTXCOMM_UCX_EAGER_LIMIT does not
// apply; the threshold is set through UCX's own variable instead.)
TEST(Ucx, MessagesOnBothSidesOfTheEagerLimitArriveIntact) {
  const size_t limit = size_t{64} << 10;
  ASSERT_EQ(setenv("UCX_RNDV_THRESH", "65536", 1), 0);
  auto ts = makeUcxTransports(2);
  unsetenv("UCX_RNDV_THRESH");
  for (size_t bytes : {limit / 2, limit, limit + 1, size_t{8} << 20}) {
    runThreads(2, [&](int r) {
      Transport& t = *ts[r].transport;
      std::vector<unsigned char> out(bytes), got(bytes, 0);
      for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 7 + r * 13);
      std::vector<RequestPtr> reqs;
      reqs.push_back(t.irecv(1 - r, 9, got.data(), bytes));
      reqs.push_back(t.isend(1 - r, 9, out.data(), bytes));
      t.waitAll(reqs, in(30));
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i) {
        wrong += got[i] != static_cast<unsigned char>(i * 7 + (1 - r) * 13);
      }
      EXPECT_EQ(wrong, 0u) << "rank " << r << ", " << bytes << " bytes";
    });
  }
}

// A message above 1 GiB goes as several UCX messages of at most 1 GiB with one tag, and the
// receiver reassembles it: every byte checked.
TEST(Ucx, MessageAboveOneGibArrivesIntact) {
  const size_t bytes = (size_t{1} << 30) + 13;
  auto ts = makeUcxTransports(2);
  runThreads(2, [&](int r) {
    Transport& t = *ts[r].transport;
    std::vector<unsigned char> buf(bytes, 0);
    std::vector<RequestPtr> reqs;
    if (r == 0) {
      for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<unsigned char>(i % 251);
      reqs.push_back(t.isend(1, 4, buf.data(), bytes));
    } else {
      reqs.push_back(t.irecv(0, 4, buf.data(), bytes));
    }
    t.waitAll(reqs, in(120));
    if (r == 1) {
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i) wrong += buf[i] != static_cast<unsigned char>(i % 251);
      EXPECT_EQ(wrong, 0u);
    }
  });
}

}  // namespace
}  // namespace mtxcomm
