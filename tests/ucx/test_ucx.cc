// The UCX transport in one process: each rank is a thread with its own UCX worker, bootstrapped
// over the in-process transport by the same route (transports/route) init_from_env uses, forced
// to UCX. Collectives through the public C API against the closed-form data of tests/common,
// the per-peer route table, and the transport contract: size mismatch, timeout naming the peer,
// abort frames, split views that never match each other's messages.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/base/error.h"
#include "mp/mp_check.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/route/route.h"
#include "transports/ucx/ucx_transport.h"

namespace mtxcomm {
namespace {

using testdata::Case;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// n UCX transports (with their route tables), made collectively on n threads.
std::vector<RoutedTransport> makeUcxTransports(int n) {
  auto inproc = makeInprocTransports(n);
  std::vector<RoutedTransport> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        [&, r] { out[r] = routeTransport(std::move(inproc[r]), "ucx", 30.0, size_t{4} << 20); });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Runs fn(rank) on n threads.
void onRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

Clock::time_point in(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<long>(seconds * 1e6));
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
        if (std::string(algo) == "shm") continue;
        Config cfg;
        cfg.shm = "off";
        cfg.timeoutSeconds = 30;
        cfg.algo[static_cast<int>(coll)] = algo;
        auto ts = makeUcxTransports(n);
        std::vector<Case> cases;
        mp::appendCases(cases, coll, algo, n, {MTXCOMM_INT32, MTXCOMM_BFLOAT16, MTXCOMM_FLOAT32},
                        {MTXCOMM_SUM, MTXCOMM_MAX}, {0, 1, static_cast<size_t>(n) + 1, 70001});
        onRanks(n, [&](int r) {
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

TEST(Ucx, SizeMismatchIsAnInternalErrorNamingThePeer) {
  auto ts = makeUcxTransports(2);
  onRanks(2, [&](int r) {
    Transport& t = *ts[r].transport;
    char buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<RequestPtr> reqs;
    if (r == 0) {
      reqs.push_back(t.isend(1, 5, buf, 8));
      try {
        t.waitAll(reqs, in(2));
      } catch (const Error&) {
        // The send may or may not complete, depending on whether the receiver failed first.
      }
    } else {
      reqs.push_back(t.irecv(0, 5, buf, 4));
      try {
        t.waitAll(reqs, in(10));
        ADD_FAILURE() << "a 4-byte receive matched an 8-byte send without an error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), MTXCOMM_INTERNAL_ERROR) << e.what();
        EXPECT_TRUE(contains(e.what(), "size mismatch")) << e.what();
        EXPECT_TRUE(contains(e.what(), "peer rank 0")) << e.what();
      }
    }
  });
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
    onRanks(2, [&](int r) {
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
  onRanks(2, [&](int r) {
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

TEST(Ucx, TimeoutNamesTheAwaitedPeer) {
  auto ts = makeUcxTransports(3);
  onRanks(3, [&](int r) {
    if (r != 1) return;  // ranks 0 and 2 never send
    Transport& t = *ts[r].transport;
    int a = 0, b = 0;
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.irecv(2, 7, &a, sizeof(a)));
    reqs.push_back(t.irecv(0, 7, &b, sizeof(b)));
    const auto t0 = Clock::now();
    try {
      t.waitAll(reqs, in(0.3));
      ADD_FAILURE() << "waitAll returned without messages";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_TIMEOUT) << e.what();
      EXPECT_TRUE(contains(e.what(), "from peer rank 2")) << e.what();
      EXPECT_TRUE(contains(e.what(), "over ucx")) << e.what();
    }
    EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));
    // The transport is failed now: later calls say so and quote the first error.
    try {
      t.waitAll(reqs, in(0.1));
      ADD_FAILURE() << "a failed transport accepted another wait";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE) << e.what();
      EXPECT_TRUE(contains(e.what(), "peer rank 2")) << e.what();
    }
  });
}

TEST(Ucx, AbortReachesEveryPeerWithItsReason) {
  const int n = 3;
  auto ts = makeUcxTransports(n);
  onRanks(n, [&](int r) {
    Transport& t = *ts[r].transport;
    if (r == 0) {
      t.abort("rank 0 ran out of patience");
      return;
    }
    // Waits on the other survivor, which never sends: the abort ends the wait, not the timeout.
    int x = 0;
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.irecv(r == 1 ? 2 : 1, 3, &x, sizeof(x)));
    const auto t0 = Clock::now();
    try {
      t.waitAll(reqs, in(20));
      ADD_FAILURE() << "rank " << r << ": waitAll returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_REMOTE_ERROR) << e.what();
      EXPECT_TRUE(contains(e.what(), "peer rank 0 aborted: rank 0 ran out of patience"))
          << e.what();
    }
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  });
}

// Two views of the same ranks with the same tags: each receive gets its own view's message.
TEST(Ucx, SplitViewsKeepTheirMessagesApart) {
  const int n = 4;
  auto ts = makeUcxTransports(n);
  onRanks(n, [&](int r) {
    Transport& world = *ts[r].transport;
    // Even and odd ranks, in reverse order: new rank i is members[i].
    std::vector<int> members = r % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{3, 1};
    auto sub = world.split(members, 1234 + r % 2);
    ASSERT_EQ(sub->size(), 2);
    ASSERT_EQ(sub->rank(), r < 2 ? 1 : 0);
    auto sub2 = world.split(members, 99 + r % 2);
    const int peer = 1 - sub->rank();
    int a = 100 + r, b = 200 + r, gotA = -1, gotB = -1;
    // sub2's message is sent first, so it is the older one when sub's receive is posted.
    std::vector<RequestPtr> reqs2;
    reqs2.push_back(sub2->isend(peer, 1, &b, sizeof(b)));
    std::vector<RequestPtr> reqs;
    reqs.push_back(sub->isend(peer, 1, &a, sizeof(a)));
    reqs.push_back(sub->irecv(peer, 1, &gotA, sizeof(gotA)));
    sub->waitAll(reqs, in(10));
    reqs2.push_back(sub2->irecv(peer, 1, &gotB, sizeof(gotB)));
    sub2->waitAll(reqs2, in(10));
    const int partner = members[peer];
    EXPECT_EQ(gotA, 100 + partner);
    EXPECT_EQ(gotB, 200 + partner);
    // A context id already in use on this rank is refused.
    EXPECT_THROW(world.split(members, 1234 + r % 2), Error);
  });
}

}  // namespace
}  // namespace mtxcomm
