// Trust: ranks that disagree at init (configuration, build) or on a call over shared memory.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/trust_fixture.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "mtxcomm/mtxcomm.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/shm/shm_group.h"

namespace mtxcomm {
namespace {

using namespace trusttest;  // NOLINT: the Trust fixture, kTimeout, secondsSince

// ---- Agreement at init ----------------------------------------------------------------------

// Variables that must agree, set differently on some ranks, fail init on every rank naming
// each variable, its values and the ranks that hold them.
TEST_F(Trust, ConfigurationsThatDisagreeAreNamedOnEveryRank) {
  auto transports = makeInprocTransports(3);
  runThreads(3, [&](int rank) {
    Config cfg;
    if (rank == 2) cfg.segmentBytes = 65536;
    if (rank == 1) cfg.shm = "off";
    Comm comm(std::move(transports[rank]), cfg, 0);
    expectError([&] { comm.agreeConfig(); }, MTXCOMM_INVALID_USAGE,
                {"MTXCOMM_SEGMENT_BYTES differs: 1048576 on ranks 0,1, 65536 on rank 2",
                 "MTXCOMM_SHM differs: auto on ranks 0,2, off on rank 1"});
  });
  // And the same configuration passes.
  transports = makeInprocTransports(3);
  runThreads(3, [&](int rank) {
    Comm comm(std::move(transports[rank]), Config(), 0);
    comm.agreeConfig();
  });
}

// A rank of another mtxcomm build (another version, or a shared-memory segment laid out
// differently) is refused at init, before any segment is shared, naming the builds and ranks.
TEST_F(Trust, RanksOfAnotherBuildAreRefusedAtInit) {
  auto transports = makeInprocTransports(2);
  std::string verdict;
  runThreads(2, [&](int rank) {
    if (rank == 0) {
      Comm comm(std::move(transports[0]), Config(), 0);
      expectError([&] { comm.agreeConfig(); }, MTXCOMM_INVALID_USAGE,
                  {"mtxcomm build differs: ", ", shared-memory layout ",
                   "on rank 0, 9.9.9, shared-memory layout 0badcafe on rank 1",
                   "every rank must load the same mtxcomm library"});
      return;
    }
    // Rank 1 speaks the agreement's protocol as another build would: its record, then rank 0's
    // verdict.
    Transport& t = *transports[1];
    std::vector<char> record(8192, '\0'), answer(4096, '\0');
    const std::string mine = "mtxcomm build=9.9.9, shared-memory layout 0badcafe\n";
    std::memcpy(record.data(), mine.data(), mine.size());
    std::vector<RequestPtr> reqs;
    reqs.push_back(t.isend(0, Transport::kMaxTag, record.data(), record.size()));
    reqs.push_back(t.irecv(0, Transport::kMaxTag, answer.data(), answer.size()));
    t.waitAll(reqs, Clock::now() + kTimeout);
    verdict = answer.data();
  });
  EXPECT_EQ(verdict.rfind("mtxcomm build differs: ", 0), 0u) << verdict;
}

// ---- Calls that disagree over shared memory ----------------------------------------------------

// A code expected in the call, or kByNextCall: the call may succeed (a broadcast's root, and a
// reader with more than one peer, return before every peer has entered the call), and then the
// rank's next call (a barrier, or `next`) fails with MTXCOMM_INVALID_USAGE, before it moves a
// byte.
constexpr mtxcomm_result_t kByNextCall = static_cast<mtxcomm_result_t>(-1);

// Runs one call per rank over shm (n ranks, MTXCOMM_TIMEOUT 30 s) and expects codes[rank] on
// each rank within 3 s, the message naming parts; where a rank learns it at its next call, the
// next call's message names them. Under the given chunking; without one, a call of more bytes
// than the smallest slot (whose chunks then depend on the machine's L2) runs under each
// chunking a machine can pick.
void expectPromptError(int n,
                       const std::function<mtxcomm_result_t(mtxcomm_comm_t, int, float*)>& call,
                       const std::vector<mtxcomm_result_t>& codes,
                       const std::vector<std::string>& parts, size_t count = 256,
                       const std::function<mtxcomm_result_t(mtxcomm_comm_t, float*)>& next = {},
                       const std::optional<testing::ShmChunking>& chunking = {}) {
  if (!chunking && count * sizeof(float) > testing::shmChunkings().front().slotBytes) {
    for (const testing::ShmChunking& c : testing::shmChunkings()) {
      SCOPED_TRACE(c.name);
      expectPromptError(n, call, codes, parts, count, next, c);
    }
    return;
  }
  Config cfg;
  cfg.timeoutSeconds = 30;
  if (chunking) cfg = testing::withChunking(cfg, *chunking);
  testing::runRanks(
      n,
      [&](mtxcomm_comm_t comm, int rank) {
        ASSERT_TRUE(unwrapComm(comm)->hasShm());
        std::vector<float> buf(count, static_cast<float>(rank + 1));
        const auto start = Clock::now();
        mtxcomm_result_t rc = call(comm, rank, buf.data());
        if (codes[rank] == kByNextCall) {
          if (rc == MTXCOMM_SUCCESS) rc = next ? next(comm, buf.data()) : mtxcomm_barrier(comm);
          EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE)
              << "rank " << rank << ": " << mtxcomm_get_last_error(comm);
        } else {
          EXPECT_EQ(rc, codes[rank]) << "rank " << rank << ": " << mtxcomm_get_last_error(comm);
        }
        EXPECT_LT(secondsSince(start), 3.0);
        if (rc == MTXCOMM_INVALID_USAGE) {
          const std::string msg = mtxcomm_get_last_error(comm);
          for (const auto& part : parts) EXPECT_TRUE(contains(msg, part)) << msg;
        }
      },
      cfg);
}

// The chunking the environment forces (tests/run_chunkings.sh) reaches every rank of a test
// that leaves it to the machine, and a test's own chunking wins over it.
TEST_F(Trust, ForcedChunkingReachesEveryRank) {
  setenv("MTXCOMM_SHM_SLOT_BYTES", "1M", 1);
  setenv("MTXCOMM_SHM_CHUNK_BYTES", "512K", 1);
  for (const bool own : {false, true}) {
    const Config cfg =
        own ? testing::withChunking(Config(), testing::shmChunkings().front()) : Config();
    testing::runRanks(
        3,
        [own](mtxcomm_comm_t c, int) {
          ShmGroup* g = unwrapComm(c)->notifier();
          ASSERT_NE(g, nullptr);
          EXPECT_EQ(g->slotBytes(), own ? size_t{256} << 10 : size_t{1} << 20);
          EXPECT_EQ(g->reductionChunkBytes(), own ? size_t{256} << 10 : size_t{512} << 10);
        },
        cfg);
  }
  unsetenv("MTXCOMM_SHM_SLOT_BYTES");
  unsetenv("MTXCOMM_SHM_CHUNK_BYTES");
}

// Both ranks write their own broadcast and wait for nobody. A broadcast of one chunk (at most
// the slot) returns at once on both, and each learns it at its next call; one of several
// chunks may find it in the call, when a root waits to reuse a set of slots and meets the
// other's call there (or at the next call, when it finds the peer not yet arrived). Under every
// chunking a machine can pick (1 MiB is one chunk in 1 MiB slots, several in smaller ones).
TEST_F(Trust, BroadcastWhereEachRankNamesItselfRootIsAnError) {
  for (const testing::ShmChunking& chunking : testing::shmChunkings()) {
    SCOPED_TRACE(chunking.name);
    for (const size_t count : {size_t{256}, size_t{1} << 18}) {
      std::vector<std::string> parts = {"root 0", "root 1"};
      if (count * sizeof(float) <= chunking.slotBytes) {
        parts.push_back("found when this rank entered call");
      }
      expectPromptError(
          2,
          [count](mtxcomm_comm_t c, int rank, float* b) {
            return mtxcomm_broadcast(b, b, count, MTXCOMM_FLOAT32, rank, c, nullptr);
          },
          {kByNextCall, kByNextCall}, parts, count, {}, chunking);
    }
  }
}

// Runs body(comm, rank) on n ranks over shm, as threads, each destroying its communicator
// itself when body returns (the harness destroys them one by one afterwards), and returns what
// each destroy returned; messages[rank] is mtxcomm_get_last_error then.
std::vector<mtxcomm_result_t> runAndDestroy(int n, const Config& cfg,
                                            const std::function<void(mtxcomm_comm_t, int)>& body,
                                            std::vector<std::string>* messages) {
  auto comms = testing::makeInprocComms(n, cfg);
  std::vector<mtxcomm_result_t> codes(n, MTXCOMM_SUCCESS);
  messages->assign(n, "");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      unwrapComm(comms[r])->setup();
      body(comms[r], r);
      codes[r] = mtxcomm_comm_destroy(comms[r]);
      (*messages)[r] = mtxcomm_get_last_error(comms[r]);
    });
  }
  for (auto& t : threads) t.join();
  return codes;
}

// A disagreement no later call finds is not lost: destroy runs the checks still pending and
// returns MTXCOMM_INVALID_USAGE on every rank, with the message the next call would have given
// (every rank names itself root of a one-chunk broadcast, which returns at once on both: the
// line boxes, the small slots, one slot; under every chunking).
TEST_F(Trust, DestroyAfterADisagreeingBroadcastReturnsTheErrorOnEveryRank) {
  for (const testing::ShmChunking& chunking : testing::shmChunkings()) {
    SCOPED_TRACE(chunking.name);
    for (const size_t count : {size_t{16}, size_t{256}, chunking.slotBytes / sizeof(float)}) {
      SCOPED_TRACE("count " + std::to_string(count));
      Config cfg = testing::withChunking(Config(), chunking);
      cfg.timeoutSeconds = 30;
      std::vector<mtxcomm_result_t> calls(2, MTXCOMM_INTERNAL_ERROR);
      std::vector<std::string> messages;
      const auto start = Clock::now();
      const auto destroys = runAndDestroy(
          2, cfg,
          [&](mtxcomm_comm_t c, int rank) {
            std::vector<float> buf(count, static_cast<float>(rank + 1));
            calls[rank] =
                mtxcomm_broadcast(buf.data(), buf.data(), count, MTXCOMM_FLOAT32, rank, c, nullptr);
            // Each kept its own data: the call moved nothing between them.
            EXPECT_EQ(buf[count - 1], static_cast<float>(rank + 1));
          },
          &messages);
      EXPECT_LT(secondsSince(start), 3.0);
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(calls[r], MTXCOMM_SUCCESS) << "rank " << r;
        EXPECT_EQ(destroys[r], MTXCOMM_INVALID_USAGE) << "rank " << r << ": " << messages[r];
        for (const char* part : {"mtxcomm_comm_destroy", "the ranks disagree on the call", "root 0",
                                 "root 1", "found when this rank destroyed the communicator"}) {
          EXPECT_TRUE(contains(messages[r], part)) << "rank " << r << ": " << messages[r];
        }
      }
    }
  }
}

// Ranks that agree destroy with success, also when a peer enters the broadcast late (the
// destroy waits for it) and over three ranks; a rank whose peer destroys without ever making
// the call it waits to check fails its destroy naming that peer, at once.
TEST_F(Trust, DestroyWaitsForLatePeersAndNamesOneThatNeverCame) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  for (const int n : {2, 3}) {
    std::vector<std::string> messages;
    const auto destroys = runAndDestroy(
        n, cfg,
        [n](mtxcomm_comm_t c, int rank) {
          if (rank == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::vector<float> buf(64, static_cast<float>(rank));
          EXPECT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, 0, c, nullptr),
                    MTXCOMM_SUCCESS);
          EXPECT_EQ(buf[63], 0.0f);
        },
        &messages);
    for (int r = 0; r < n; ++r) EXPECT_EQ(destroys[r], MTXCOMM_SUCCESS) << messages[r];
  }
  std::vector<std::string> messages;
  const auto start = Clock::now();
  const auto destroys = runAndDestroy(
      2, cfg,
      [](mtxcomm_comm_t c, int rank) {
        if (rank == 1) return;  // destroys without the broadcast
        std::vector<float> buf(64, 1.0f);
        EXPECT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, 0, c, nullptr),
                  MTXCOMM_SUCCESS);
      },
      &messages);
  EXPECT_LT(secondsSince(start), 3.0);
  EXPECT_EQ(destroys[1], MTXCOMM_SUCCESS) << messages[1];
  EXPECT_EQ(destroys[0], MTXCOMM_REMOTE_ERROR) << messages[0];
  EXPECT_TRUE(contains(messages[0], "rank 1 destroyed its communicator after call #"))
      << messages[0];
  EXPECT_TRUE(contains(messages[0], "destroy's check of an earlier call")) << messages[0];
}

// Three ranks, two of which agree on a root the third does not name (roots 0,1,1 and 0,0,2),
// small (the ring of small slots) and large (the chunked slots): every rank fails, in the call
// or at its next one (the root of the two that agree, and its reader, have seen nothing wrong
// when the call returns).
TEST_F(Trust, BroadcastWhereTwoRanksAgreeOnARootTheThirdDoesNotNameFailsEveryRank) {
  for (const std::vector<int>& roots : {std::vector<int>{0, 1, 1}, std::vector<int>{0, 0, 2}}) {
    for (const size_t count : {size_t{256}, size_t{1} << 18}) {
      expectPromptError(
          3,
          [&roots, count](mtxcomm_comm_t c, int rank, float* b) {
            return mtxcomm_broadcast(b, b, count, MTXCOMM_FLOAT32, roots[rank], c, nullptr);
          },
          {kByNextCall, kByNextCall, kByNextCall}, {"root"}, count);
    }
  }
}

// A reader that waits on a root in another call fails in that call, as a rank in another
// collective that waits on the root does; the root learns it at its next call.
TEST_F(Trust, BroadcastWhereAReaderNamesAnotherRootFailsItAtOnce) {
  // Roots 0, 0, 1: rank 2 waits for rank 1's post, rank 1 is reading rank 0's.
  for (const size_t count : {size_t{256}, size_t{1} << 18}) {
    expectPromptError(
        3,
        [count](mtxcomm_comm_t c, int rank, float* b) {
          return mtxcomm_broadcast(b, b, count, MTXCOMM_FLOAT32, rank == 2 ? 1 : 0, c, nullptr);
        },
        {kByNextCall, kByNextCall, MTXCOMM_INVALID_USAGE}, {"root"}, count);
  }
}

TEST_F(Trust, BroadcastAgainstAllreduceIsAnError) {
  expectPromptError(
      2,
      [](mtxcomm_comm_t c, int rank, float* b) {
        return rank == 0 ? mtxcomm_broadcast(b, b, 256, MTXCOMM_FLOAT32, 0, c, nullptr)
                         : mtxcomm_allreduce(b, b, 256, MTXCOMM_FLOAT32, MTXCOMM_SUM, c, nullptr);
      },
      {kByNextCall, MTXCOMM_INVALID_USAGE}, {"broadcast", "allreduce"});
}

TEST_F(Trust, BarrierAgainstBroadcastIsAnError) {
  expectPromptError(2,
                    [](mtxcomm_comm_t c, int rank, float* b) {
                      return rank == 1
                                 ? mtxcomm_barrier(c)
                                 : mtxcomm_broadcast(b, b, 256, MTXCOMM_FLOAT32, 0, c, nullptr);
                    },
                    {kByNextCall, MTXCOMM_INVALID_USAGE}, {"barrier", "broadcast"});
}

// A small reduce goes through the line boxes (the non-roots write and return, the root reads
// them): ranks that name different roots, or a reduce against an allreduce, still fail on every
// rank, in the call or at the next one, naming what differs; the same with the slots' path.
TEST_F(Trust, ReduceWhereRanksNameDifferentRootsFailsEveryRank) {
  for (const std::vector<int>& roots :
       {std::vector<int>{0, 1}, std::vector<int>{0, 0, 1}, std::vector<int>{1, 0, 0}}) {
    for (const size_t count : {size_t{16}, size_t{1} << 18}) {
      const int n = static_cast<int>(roots.size());
      expectPromptError(
          n,
          [&roots, count](mtxcomm_comm_t c, int rank, float* b) {
            return mtxcomm_reduce(b, b, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, roots[rank], c,
                                  nullptr);
          },
          std::vector<mtxcomm_result_t>(roots.size(), kByNextCall), {"root"}, count);
    }
  }
}

// Ranks that each name another rank root write their small reduce and wait for nobody: each
// learns it at its next call once the peers have entered theirs (50 ms later here), even when
// that is another small reduce (a rank that only writes small reduces must not run on for
// kMaxDeferred calls before it looks); the same for a count that only the root sees differ.
TEST_F(Trust, SmallReduceWhereNobodyIsRootFailsAtTheNextReduce) {
  auto nextReduce = [](mtxcomm_comm_t c, float* b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return mtxcomm_reduce(b, b, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, 0, c, nullptr);
  };
  for (const std::vector<int>& roots : {std::vector<int>{1, 0}, std::vector<int>{1, 2, 0}}) {
    expectPromptError(
        static_cast<int>(roots.size()),
        [&roots](mtxcomm_comm_t c, int rank, float* b) {
          return mtxcomm_reduce(b, b, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, roots[rank], c, nullptr);
        },
        std::vector<mtxcomm_result_t>(roots.size(), kByNextCall), {"root"}, 8, nextReduce);
  }
  expectPromptError(
      3,
      [](mtxcomm_comm_t c, int rank, float* b) {
        return mtxcomm_reduce(b, b, rank == 2 ? 5 : 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, 0, c, nullptr);
      },
      {MTXCOMM_INVALID_USAGE, kByNextCall, kByNextCall}, {"count"}, 8, nextReduce);
}

TEST_F(Trust, ReduceAgainstAllreduceIsAnError) {
  for (const size_t count : {size_t{16}, size_t{1} << 18}) {
    expectPromptError(
        2,
        [count](mtxcomm_comm_t c, int rank, float* b) {
          return rank == 0
                     ? mtxcomm_reduce(b, b, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, 0, c, nullptr)
                     : mtxcomm_allreduce(b, b, count, MTXCOMM_FLOAT32, MTXCOMM_SUM, c, nullptr);
        },
        {kByNextCall, kByNextCall}, {"reduce", "allreduce"}, count);
  }
}

// A root that runs on through broadcasts only learns of a disagreeing reader within
// ShmGroup::kMaxDeferred broadcasts (when its deferred checks are full), never later, and the
// reader fails at once.
TEST_F(Trust, ARootThatOnlyBroadcastsLearnsOfADisagreementWithinItsDeferredChecks) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  // The reader names fewer elements (the same path, tagged lines) or more (another path, the
  // small slots) than the root's 64.
  for (const size_t readerCount : {size_t{32}, size_t{2048}}) {
    testing::runRanks(
        2,
        [&](mtxcomm_comm_t comm, int rank) {
          std::vector<float> buf(std::max<size_t>(readerCount, 64), static_cast<float>(rank + 1));
          const auto start = Clock::now();
          const std::string readers = "count " + std::to_string(readerCount);
          if (rank == 1) {
            EXPECT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), readerCount, MTXCOMM_FLOAT32, 0,
                                        comm, nullptr),
                      MTXCOMM_INVALID_USAGE);
            EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "count 64"))
                << mtxcomm_get_last_error(comm);
          } else {
            mtxcomm_result_t rc = MTXCOMM_SUCCESS;
            size_t calls = 0;
            while (rc == MTXCOMM_SUCCESS && calls < 4 * ShmGroup::kMaxDeferred) {
              rc = mtxcomm_broadcast(buf.data(), buf.data(), 64, MTXCOMM_FLOAT32, 0, comm, nullptr);
              ++calls;
            }
            EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE) << mtxcomm_get_last_error(comm);
            EXPECT_LE(calls, ShmGroup::kMaxDeferred + 1);
            EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), readers))
                << mtxcomm_get_last_error(comm);
          }
          EXPECT_LT(secondsSince(start), 3.0);
        },
        cfg);
  }
}

// Two ranks that each name itself the root (both return at once), then broadcast from
// alternating roots: each rank is a reader of its only peer every other call (nothing deferred
// then), and still learns of the disagreement within kMaxDeferred calls of it.
TEST_F(Trust, AlternatingRootsLearnOfADisagreementWithinTheDeferredBound) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  testing::runRanks(
      2,
      [&](mtxcomm_comm_t comm, int rank) {
        std::vector<int8_t> buf(100, static_cast<int8_t>(rank + 1));
        ASSERT_EQ(mtxcomm_broadcast(buf.data(), buf.data(), 100, MTXCOMM_INT8, rank, comm, nullptr),
                  MTXCOMM_SUCCESS);
        mtxcomm_result_t rc = MTXCOMM_SUCCESS;
        size_t calls = 0;
        while (rc == MTXCOMM_SUCCESS && calls < 4 * ShmGroup::kMaxDeferred) {
          const int root = static_cast<int>((calls + 1) % 2);
          rc = mtxcomm_broadcast(buf.data(), buf.data(), 100, MTXCOMM_INT8, root, comm, nullptr);
          ++calls;
        }
        EXPECT_EQ(rc, MTXCOMM_INVALID_USAGE) << mtxcomm_get_last_error(comm);
        EXPECT_LE(calls, ShmGroup::kMaxDeferred) << "rank " << rank;
        EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "root 1") &&
                    contains(mtxcomm_get_last_error(comm), "root 0"))
            << mtxcomm_get_last_error(comm);
      },
      cfg);
}

// The root rejects its own call (a bad argument): the other rank learns it at once.
TEST_F(Trust, ACallRejectedOnTheRootOnlyIsAnErrorOnEveryRank) {
  expectPromptError(
      2,
      [](mtxcomm_comm_t c, int rank, float* b) {
        return mtxcomm_broadcast(rank == 0 ? nullptr : b, b, 256, MTXCOMM_FLOAT32, 0, c, nullptr);
      },
      {MTXCOMM_INVALID_ARGUMENT, MTXCOMM_INVALID_USAGE}, {"peer rank 0 rejected this call"});
}

// A peer that destroys its communicator early (and stays alive) fails the ranks that wait on it
// at once, naming it.
TEST_F(Trust, PeerThatDestroysItsCommunicatorEarlyFailsItsPeersAtOnce) {
  Config cfg;
  cfg.timeoutSeconds = 30;
  auto comms = testing::makeInprocComms(2, cfg);
  runThreads(2, [&](int rank) {
    unwrapComm(comms[rank])->setup();
    std::vector<float> b(64, 1.0f);
    ASSERT_EQ(mtxcomm_allreduce(b.data(), b.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[rank],
                                nullptr),
              MTXCOMM_SUCCESS);
    if (rank == 1) {
      mtxcomm_comm_destroy(comms[1]);
      comms[1] = nullptr;
      std::this_thread::sleep_for(milliseconds(2000));  // alive, but gone from the communicator
      return;
    }
    const auto start = Clock::now();
    EXPECT_EQ(
        mtxcomm_allreduce(b.data(), b.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, comms[0], nullptr),
        MTXCOMM_REMOTE_ERROR);
    EXPECT_LT(secondsSince(start), 1.0);
    EXPECT_TRUE(contains(mtxcomm_get_last_error(comms[0]),
                         "peer rank 1 destroyed its communicator after call #"))
        << mtxcomm_get_last_error(comms[0]);
  });
  mtxcomm_comm_destroy(comms[0]);
}

}  // namespace
}  // namespace mtxcomm
