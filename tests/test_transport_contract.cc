// The transport contract (transports/transport.h) over every transport that can be made in one
// process, ranks as threads: inproc; tcp, bootstrapped through a file: store; ucx, when built
// with UCX (each rank a UCX worker of its own). One value-parameterized suite: a parameter is a
// transport, a case of tests/common/transport_contract.h and a number of ranks, named
// "<transport>_<case>_np<ranks>". The MPI transport runs the same cases under mpirun
// (tests/mp/mp_transport_contract.cc). What each transport does where the contract leaves a
// choice, and where it deviates, is in the Traits of transport_contract.h.
//
// shm (transports/shm) is not a point-to-point transport: a ShmGroup is the ranks of one node
// sharing a segment, set up over a Transport, with barriers, per-rank data slots and abort
// flags. Of the contract, these parts apply to it and are checked here (ShmGroupContract, over
// inproc transports for the setup): addressing (rank r's slot holds rank r's data, seen by
// every peer after a barrier), a wait nobody joins times out naming the peer, abort reaches the
// peers as MTXCOMM_REMOTE_ERROR with the reason, and the counterpart of a size mismatch — ranks
// that disagree on the call fail naming both calls (MTXCOMM_INVALID_USAGE). Tags, matching,
// ordering, zero-byte messages, split views and self-sends have no counterpart. A peer process
// that dies, or exits normally after its last barrier, needs real processes: tests/shm.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "common/transport_contract.h"
#include "lib/base/call.h"
#include "lib/base/store.h"
#include "lib/comm/stores.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/shm/shm_group.h"
#include "transports/tcp/tcp_transport.h"
#if MTXCOMM_HAVE_UCX
#include "common/ucx_transports.h"
#endif

namespace mtxcomm {
namespace {

using contract::kTimeout;
using testutil::Barrier;
using testutil::expectError;
using testutil::runThreads;
using testutil::TempDir;
using testutil::testSecret;

// n transports of one kind, and what must outlive them (stores, a directory).
struct Made {
  std::vector<std::unique_ptr<Transport>> transports;
  std::shared_ptr<void> keep;
};

struct Kind {
  contract::Traits traits;
  std::function<Made(int n)> make;
};

Made makeInproc(int n) {
  Made m;
  m.transports = makeInprocTransports(n);
  return m;
}

Made makeTcp(int n) {
  struct Keep {
    TempDir dir;
    std::vector<std::unique_ptr<Store>> stores;
  };
  auto keep = std::make_shared<Keep>();
  keep->stores.resize(n);
  Made m;
  m.transports.resize(n);
  runThreads(n, [&](int r) {
    keep->stores[r] = makeStore(keep->dir.fileSpec(), r, n, kTimeout, testSecret());
    m.transports[r] = makeTcpTransport(*keep->stores[r], r, n, kTimeout);
  });
  m.keep = keep;
  return m;
}

#if MTXCOMM_HAVE_UCX
Made makeUcx(int n) {
  Made m;
  for (RoutedTransport& rt : testutil::makeUcxTransports(n)) {
    m.transports.push_back(std::move(rt.transport));
  }
  return m;
}
#endif

const std::vector<Kind>& kinds() {
  static const std::vector<Kind> all = {
    {contract::inprocTraits(), makeInproc},
    {contract::tcpTraits(), makeTcp},
#if MTXCOMM_HAVE_UCX
    {contract::ucxTraits(), makeUcx},
#endif
  };
  return all;
}

struct Param {
  const Kind* kind;
  const contract::Case* c;
  int ranks;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.kind->traits.name << " " << p.c->name << " on " << p.ranks << " ranks";
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const Kind& k : kinds()) {
    for (const contract::Case& c : contract::allCases()) {
      for (int n : c.inProcessRanks) out.push_back({&k, &c, n});
    }
  }
  return out;
}

class TransportContract : public ::testing::TestWithParam<Param> {};

TEST_P(TransportContract, Case) {
  const Param& p = GetParam();
  Made made = p.kind->make(p.ranks);
  ASSERT_EQ(made.transports.size(), static_cast<size_t>(p.ranks));
  for (const auto& t : made.transports) ASSERT_NE(t, nullptr);
  Barrier barrier(p.ranks);
  runThreads(p.ranks, [&](int r) {
    contract::Env e;
    e.rank = r;
    e.size = p.ranks;
    e.transport = std::move(made.transports[r]);
    e.barrier = [&] { barrier.wait(); };
    e.traits = p.kind->traits;
    contract::runRank(e, *p.c, [&] { barrier.breakAll(); });
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportContract, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const Param& p = info.param;
                           return p.kind->traits.name + "_" + p.c->name + "_np" +
                                  std::to_string(p.ranks);
                         });

// ---- shm ------------------------------------------------------------------------------------

// Runs fn(group, rank) on n threads, each with a ShmGroup of n ranks set up over inproc.
void onShmGroup(int n, double timeoutSeconds, const std::function<void(ShmGroup&, int)>& fn) {
  auto transports = makeInprocTransports(n);
  runThreads(n, [&](int r) {
    auto group = ShmGroup::create(*transports[r], 1, 4096, timeoutSeconds);
    EXPECT_EQ(group->rank(), r);
    EXPECT_EQ(group->size(), n);
    fn(*group, r);
  });
}

TEST(ShmGroupContract, EveryRanksSlotIsSeenByEveryPeerAfterABarrier) {
  const int n = 3;
  onShmGroup(n, 10.0, [&](ShmGroup& g, int rank) {
    for (int round = 0; round < 4; ++round) {  // both slot sets, twice
      const int set = g.nextSet();
      std::vector<uint8_t> mine(g.slotBytes());
      contract::fill(mine, rank, round);
      std::memcpy(g.slot(set, rank), mine.data(), mine.size());
      g.barrier("test exchange");
      for (int q = 0; q < n; ++q) {
        std::vector<uint8_t> theirs(g.slot(set, q), g.slot(set, q) + g.slotBytes());
        EXPECT_EQ(contract::firstWrong(theirs, q, round), -1) << "slot of rank " << q;
      }
      g.finishChunk();
    }
  });
}

TEST(ShmGroupContract, BarrierNobodyJoinsTimesOutNamingThePeer) {
  std::atomic<bool> rank0Done{false};
  onShmGroup(2, 10.0, [&](ShmGroup& g, int rank) {
    if (rank == 1) {  // never arrives; waits until rank 0 has given up
      while (!rank0Done.load()) std::this_thread::sleep_for(contract::milliseconds(5));
      return;
    }
    g.setTimeout(0.2);
    auto start = Clock::now();
    expectError([&] { g.barrier("test barrier"); }, MTXCOMM_TIMEOUT,
                {"timed out after 0.2 s in test barrier waiting for peer rank 1 (shared memory)"});
    EXPECT_GE(Clock::now() - start, contract::milliseconds(200));
    rank0Done = true;
  });
}

TEST(ShmGroupContract, AbortReachesPeersWithTheReason) {
  onShmGroup(3, 20.0, [&](ShmGroup& g, int rank) {
    if (rank == 2) {
      std::this_thread::sleep_for(contract::milliseconds(100));
      g.abort("disk on fire");
      return;
    }
    auto start = Clock::now();
    expectError([&] { g.barrier("test barrier"); }, MTXCOMM_REMOTE_ERROR,
                {"peer rank 2 aborted: disk on fire (while this rank was in test barrier)"});
    EXPECT_LT(Clock::now() - start, contract::milliseconds(3000));
  });
}

TEST(ShmGroupContract, RanksThatDisagreeOnTheCallFailNamingBoth) {
  onShmGroup(2, 10.0, [&](ShmGroup& g, int rank) {
    CollArgs a;
    a.count = rank == 0 ? 10 : 20;
    g.setCall(callSignature(a, 1));
    const std::string mine = rank == 0 ? "count 10" : "count 20";
    const std::string theirs = rank == 0 ? "count 20" : "count 10";
    expectError([&] { g.barrier("allreduce (shm)"); }, MTXCOMM_INVALID_USAGE,
                {"the ranks disagree on the call", "this rank called allreduce(" + mine,
                 "peer rank " + std::to_string(1 - rank) + " called allreduce(" + theirs});
  });
}

// The line-tagged exchange: every rank gets every rank's bytes, at every size up to kLineBytes,
// over more exchanges than there are line boxes (each box rewritten only after every peer read
// it), with one rank now and then late so that the others run ahead as far as they can.
TEST(ShmGroupContract, LineExchangeDeliversEveryRanksBytesAcrossBoxReuse) {
  const int n = 3;
  onShmGroup(n, 10.0, [&](ShmGroup& g, int rank) {
    for (int round = 0; round < 80; ++round) {
      const size_t bytes = 1 + (round * 37) % ShmGroup::kLineBytes;
      if (rank == 2 && round % 7 == 0) std::this_thread::sleep_for(contract::milliseconds(2));
      std::vector<uint8_t> mine(bytes);
      contract::fill(mine, rank, round);
      CollArgs a;
      a.coll = Collective::kAllgather;
      a.count = bytes;
      g.setCall(callSignature(a, static_cast<uint64_t>(round) + 1));
      std::vector<uint8_t> all(bytes * n, 0xEE);
      g.exchangeLines(mine.data(), bytes, reinterpret_cast<char*>(all.data()), "test lines");
      for (int q = 0; q < n; ++q) {
        std::vector<uint8_t> theirs(all.begin() + q * bytes, all.begin() + (q + 1) * bytes);
        ASSERT_EQ(contract::firstWrong(theirs, q, round), -1)
            << "rank " << q << "'s bytes, round " << round << ", " << bytes << " bytes";
      }
    }
  });
}

// A peer in the exchange with another call fails both, naming both calls; a peer that never
// comes times out naming it.
TEST(ShmGroupContract, LineExchangeWithAnotherCallFailsNamingBoth) {
  onShmGroup(2, 10.0, [&](ShmGroup& g, int rank) {
    CollArgs a;
    a.count = rank == 0 ? 3 : 5;
    g.setCall(callSignature(a, 1));
    const uint32_t v = 7;
    char all[8];
    expectError([&] { g.exchangeLines(&v, sizeof(v), all, "allreduce (shm, lines)"); },
                MTXCOMM_INVALID_USAGE,
                {"the ranks disagree on the call", "peer rank " + std::to_string(1 - rank)});
  });
  std::atomic<bool> rank0Done{false};
  onShmGroup(2, 10.0, [&](ShmGroup& g, int rank) {
    if (rank == 1) {
      while (!rank0Done.load()) std::this_thread::sleep_for(contract::milliseconds(5));
      return;
    }
    g.setTimeout(0.2);
    const uint32_t v = 7;
    char all[8];
    expectError([&] { g.exchangeLines(&v, sizeof(v), all, "test lines"); }, MTXCOMM_TIMEOUT,
                {"timed out after 0.2 s in test lines waiting for peer rank 1"});
    rank0Done = true;
  });
}

}  // namespace
}  // namespace mtxcomm
