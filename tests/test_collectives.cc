// The threaded correctness matrix: communicator sizes 1-9, 12 and 16; every collective x
// algorithm x datatype x op; counts 0, 1, size-1, size, size+1 (and a prime above 10^6 for
// every collective x algorithm x datatype, 7 datatypes at 5 and 8 ranks); in place and out of
// place. Each rank fills its input from a closed-form formula and checks its own output against
// the formula's reduction, bitwise, and checks that an out-of-place call left its send buffer
// untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "algos/registry.h"
#include "common/test_data.h"
#include "harness.h"
#include "lib/base/dtype.h"
#include "lib/base/reduce.h"

namespace mtxcomm {
namespace {

using testing::runRanks;

using namespace testdata;  // NOLINT: the shared data, Case and helpers

// Runs one case on one rank and checks it. Returns false (after reporting) on a mismatch.
void runCase(mtxcomm_comm_t comm, int rank, int n, const Case& c) {
  Comm* impl = unwrapComm(comm);
  impl->mutableConfig().algo[static_cast<int>(c.coll)] = c.algo;
  CaseBuffers b(c, rank, n, /*poisonInPlaceAllgather=*/false);
  const mtxcomm_result_t rc = callCollective(c, comm, rank, b.sendArg, b.recvArg);
  ASSERT_EQ(rc, MTXCOMM_SUCCESS) << c.describe(n) << ": " << mtxcomm_get_last_error(comm);
  if (!c.inPlace) {
    ASSERT_EQ(0, std::memcmp(b.sendCopy.data(), b.sendStore.data(), b.inCount * b.es))
        << c.describe(n) << ": the send buffer was written";
  }

  // Expected output of this rank.
  const OutputCheck chk = checkOutput(b, c, rank, n);
  if (!chk.ok()) {
    FAIL() << c.describe(n) << ": first wrong element " << chk.firstWrong << " of "
           << chk.checkCount;
  }
}

std::vector<size_t> smallCounts(int n) {
  std::vector<size_t> v = {0, 1, static_cast<size_t>(n) + 1, static_cast<size_t>(n)};
  if (n > 1) v.push_back(static_cast<size_t>(n) - 1);
  return v;
}

// Every case for size n with counts from countsFor. alltoall: only alltoall (and alltoallv,
// which has its own tests so that they can be run alone), or every other collective.
std::vector<Case> matrix(int n, const std::vector<size_t>& counts,
                         const std::vector<mtxcomm_datatype_t>& dtypes, bool allOps,
                         bool alltoall = false) {
  std::vector<Case> cases;
  for (Collective coll : kColls) {
    if ((coll == Collective::kAlltoall) != alltoall) continue;
    for (const char* algo : algorithmNames(coll)) {
      // On one node hierarchical declines and falls back; its matrix, on emulated nodes, is
      // tests/test_hierarchical.cc.
      if (std::string(algo) == "hierarchical") continue;
      // adasum computes op adasum only (not elementwise: no closed-form data here); for the
      // other ops it falls back to the automatic choice, which the matrix runs anyway. Its
      // tests are tests/test_adasum.cc.
      if (std::string(algo) == "adasum") continue;
      if (coll == Collective::kBarrier) {
        cases.push_back({coll, algo, MTXCOMM_INT8, MTXCOMM_SUM, 0, false, 0});
        continue;
      }
      const bool reduces = collectiveReduces(coll);
      const bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce;
      for (mtxcomm_datatype_t dt : dtypes) {
        for (mtxcomm_op_t op : kOps) {
          if (!reduces && op != MTXCOMM_SUM) continue;
          if (!allOps && op != MTXCOMM_SUM && op != MTXCOMM_AVG) continue;
          if (reduces && !opApplies(dt, op)) continue;  // bool AVG: BoolReductions below
          for (size_t count : counts) {
            if (coll == Collective::kAlltoall) {
              cases.push_back({coll, algo, dt, op, count, false, 0});
              cases.push_back({coll, algo, dt, op, count, false, 0, /*vcounts=*/true});
              continue;
            }
            for (bool inPlace : {false, true}) {
              for (int root : {0, n - 1}) {
                if (!rooted && root != 0) continue;
                if (rooted && root == 0 && n > 1 && !inPlace && count != counts.front()) {
                  // root 0 and root n-1 both run for every count; keep both.
                }
                cases.push_back({coll, algo, dt, op, count, inPlace, root});
                if (!rooted || n == 1) break;
              }
            }
          }
        }
      }
    }
  }
  return cases;
}

class CollectiveMatrix : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveMatrix, SmallCountsEveryAlgorithmDatatypeOp) {
  const int n = GetParam();
  const auto cases = matrix(n, smallCounts(n), allDatatypes(), /*allOps=*/true);
  ASSERT_GT(cases.size(), 100u);
  runRanks(n, [&](mtxcomm_comm_t comm, int rank) {
    for (const Case& c : cases) {
      runCase(comm, rank, n, c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

// Alltoall and alltoallv, every algorithm and datatype, the small counts.
TEST_P(CollectiveMatrix, AlltoallSmallCountsEveryAlgorithmDatatype) {
  const int n = GetParam();
  const auto cases = matrix(n, smallCounts(n), allDatatypes(), true, /*alltoall=*/true);
  ASSERT_GT(cases.size(), 100u);
  runRanks(n, [&](mtxcomm_comm_t comm, int rank) {
    for (const Case& c : cases) {
      runCase(comm, rank, n, c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

// A prime count above 10^6: every collective x algorithm x datatype (SUM and AVG), at the
// sizes where it is affordable on a 2-core CI machine (1-5 and 8; the other sizes run the
// small-count and multi-segment suites). At 5 and 8 ranks (threads on 2 cores, 60% of the
// matrix's time) one datatype of each element size and kind: the kernels do not depend on the
// communicator's size, and every datatype runs at 1-4 ranks and in the small-count suite.
class PrimeCountMatrix : public ::testing::TestWithParam<int> {};

std::vector<mtxcomm_datatype_t> primeCountDatatypes(int n) {
  if (n < 5) return allDatatypes();
  return {MTXCOMM_INT8,    MTXCOMM_BOOL,    MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16,
          MTXCOMM_FLOAT32, MTXCOMM_FLOAT64, MTXCOMM_INT64};
}

TEST_P(PrimeCountMatrix, EveryAlgorithmDatatype) {
  const int n = GetParam();
  const auto dtypes = primeCountDatatypes(n);
  auto cases = matrix(n, {kPrimeCount}, dtypes, /*allOps=*/false);
  const auto a2a = matrix(n, {kPrimeCount}, dtypes, false, /*alltoall=*/true);
  cases.insert(cases.end(), a2a.begin(), a2a.end());
  // Allgather and reduce_scatter scale their buffers by n: keep one count per rank of 10^6/n.
  for (Case& c : cases) {
    if (c.coll == Collective::kAllgather || c.coll == Collective::kReduceScatter ||
        c.coll == Collective::kAlltoall) {
      c.count = kPrimeCount / n;
    }
  }
  runRanks(n, [&](mtxcomm_comm_t comm, int rank) {
    for (const Case& c : cases) {
      if (c.inPlace && c.dt != MTXCOMM_FLOAT32 && c.dt != MTXCOMM_BFLOAT16) continue;
      runCase(comm, rank, n, c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

// Runs every case on n ranks (threads) of communicators made with cfg, in order.
void runCases(int n, const std::vector<Case>& cases, const Config& cfg) {
  runRanks(
      n,
      [&](mtxcomm_comm_t comm, int rank) {
        for (const Case& c : cases) {
          runCase(comm, rank, n, c);
          if (::testing::Test::HasFatalFailure()) return;
        }
      },
      cfg);
}

// Many segments at small sizes: a 4 KiB segment with counts that do not divide.
TEST_P(CollectiveMatrix, SmallSegmentsAllOpsFloat32AndInt32) {
  const int n = GetParam();
  Config cfg;
  cfg.segmentBytes = 4096;
  cfg.shmSlotBytes = 4096;  // many shm chunks too
  const size_t count = 10007;
  auto cases = matrix(n, {count}, {MTXCOMM_FLOAT32, MTXCOMM_INT32, MTXCOMM_FLOAT16}, true);
  const auto a2a = matrix(n, {count}, {MTXCOMM_FLOAT32, MTXCOMM_INT8}, true, /*alltoall=*/true);
  cases.insert(cases.end(), a2a.begin(), a2a.end());
  runCases(n, cases, cfg);
}

// Broadcasts larger than one shm slot go in chunks of a quarter slot (algos/broadcast_shm.cc,
// chunkBytes): 256 KiB slots, 3.4 slots of float32 and an odd number of int8 bytes, roots 0 and
// n-1, in place and out of place; and a 4 KiB slot, where the chunk is the whole slot.
TEST_P(CollectiveMatrix, ShmBroadcastsLargerThanASlot) {
  const int n = GetParam();
  for (size_t slot : {size_t{256} << 10, size_t{4} << 10}) {
    SCOPED_TRACE(strCat("slot ", slot));
    Config cfg;
    cfg.shmSlotBytes = slot;
    std::vector<Case> cases;
    for (bool inPlace : {false, true}) {
      for (int root : {0, n - 1}) {
        cases.push_back({Collective::kBroadcast, "shm", MTXCOMM_FLOAT32, MTXCOMM_SUM,
                         slot * 34 / 10 / 4, inPlace, root});
        cases.push_back({Collective::kBroadcast, "shm", MTXCOMM_INT8, MTXCOMM_SUM, slot * 2 + 4097,
                         inPlace, root});
      }
    }
    runCases(n, cases, cfg);
    if (::testing::Test::HasFailure()) return;
  }
}

// Chunks move through the slot's positions (ShmGroup::nextSet(bytes)): a run of broadcasts,
// allreduces, allgathers and reduce_scatters of 4-40 KiB on 128 KiB slots (3-32 positions),
// datatypes, roots, counts and in-place varying from call to call, so that a reader that read a
// position before its writer rewrote it, or a writer that overwrote a position a peer had not
// finished, would see another call's bytes.
TEST_P(CollectiveMatrix, ShmChunksMoveThroughTheSlot) {
  const int n = GetParam();
  Config cfg;
  cfg.shmSlotBytes = size_t{128} << 10;
  const mtxcomm_datatype_t dtypes[] = {MTXCOMM_FLOAT32, MTXCOMM_INT32, MTXCOMM_INT8};
  const size_t bytes[] = {4100, 16384, 8192, 40000, 12004, 5000};
  std::vector<Case> cases;
  for (int i = 0; i < 48; ++i) {
    const mtxcomm_datatype_t dt = dtypes[i % 3];
    const size_t es = dt == MTXCOMM_INT8 ? 1 : 4;
    const size_t count = bytes[i % 6] / es;
    const bool inPlace = (i / 5) % 2 == 1;
    switch (i % 4) {
      case 0:
        cases.push_back(
            {Collective::kBroadcast, "shm", dt, MTXCOMM_SUM, count, inPlace, (i / 4) % n});
        break;
      case 1:
        cases.push_back({Collective::kAllreduce, "shm", dt, MTXCOMM_SUM, count, inPlace, 0});
        break;
      case 2:
        cases.push_back({Collective::kAllgather, "shm", dt, MTXCOMM_SUM, count, inPlace, 0});
        break;
      default:
        cases.push_back({Collective::kReduceScatter, "shm", dt, MTXCOMM_MAX, count, inPlace, 0});
    }
  }
  runCases(n, cases, cfg);
}

// The shm reductions may run in chunks smaller than the slot (ShmGroup::reductionChunkBytes:
// half of it where only half a slot's working set fits in the L2): allreduces and
// reduce_scatters of several 20 KiB chunks in 64 KiB slots, counts that do not divide, in place
// and out of place, between broadcasts and allgathers that still use whole slots.
TEST_P(CollectiveMatrix, ShmReductionsInChunksSmallerThanTheSlot) {
  const int n = GetParam();
  Config cfg;
  cfg.shmSlotBytes = size_t{64} << 10;
  cfg.shmReductionChunkBytes = size_t{20} << 10;
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    const bool inPlace = i % 3 == 1;
    const size_t count = 5 * 1024 + 7 * static_cast<size_t>(i) * 1001;  // 20 KiB-213 KiB of float32
    const mtxcomm_datatype_t dt = i % 2 ? MTXCOMM_INT32 : MTXCOMM_FLOAT32;
    cases.push_back({Collective::kAllreduce, "shm", dt, MTXCOMM_SUM, count, inPlace, 0});
    cases.push_back(
        {Collective::kReduceScatter, "shm", dt, MTXCOMM_SUM, count / n + 1, inPlace, 0});
    if (i % 4 == 0) {
      cases.push_back({Collective::kBroadcast, "shm", dt, MTXCOMM_SUM, count, inPlace, i % n});
    }
    if (i % 4 == 2) {
      cases.push_back({Collective::kAllgather, "shm", dt, MTXCOMM_SUM, count / n + 3, inPlace, 0});
    }
  }
  runCases(n, cases, cfg);
}

// The shm reduce: line boxes (at most 256 bytes), whole chunks reduced by the root and sliced
// ones (16 KiB and up, from 3 ranks), each root, in place and out of place, SUM and AVG,
// several chunks in 64 KiB slots, with broadcasts and allreduces in between.
TEST_P(CollectiveMatrix, ShmReduceEveryRootWholeAndSliced) {
  const int n = GetParam();
  Config cfg;
  cfg.shmSlotBytes = size_t{64} << 10;
  const size_t bytes[] = {200, 4100, 30000, 65536, 70000, 150000, 12, 40000};
  std::vector<Case> cases;
  for (int i = 0; i < 40; ++i) {
    const mtxcomm_datatype_t dt = i % 3 == 2 ? MTXCOMM_INT32 : MTXCOMM_FLOAT32;
    const size_t count = bytes[i % 8] / 4;
    const bool inPlace = (i / 3) % 2 == 1;
    const mtxcomm_op_t op = dt == MTXCOMM_FLOAT32 && i % 4 == 3 ? MTXCOMM_AVG : MTXCOMM_SUM;
    cases.push_back({Collective::kReduce, "shm", dt, op, count, inPlace, i % n});
    if (i % 5 == 4) {
      cases.push_back({Collective::kBroadcast, "shm", dt, MTXCOMM_SUM, count, inPlace, 0});
    }
    if (i % 7 == 6) {
      cases.push_back({Collective::kAllreduce, "shm", dt, MTXCOMM_MAX, count, inPlace, 0});
    }
  }
  runCases(n, cases, cfg);
}

// bool reductions are logical across ranks: SUM and MAX give OR, PROD and MIN give AND, written
// as 0/1 whatever true bytes the ranks pass (0x02, 0x80, 0xff: a byte-wise sum, product, min or
// max would give other bytes), for every algorithm of allreduce, reduce and reduce_scatter, in
// place and out of place.
TEST(BoolReductions, MixedValuesAcrossRanksGiveOrAndAnd) {
  constexpr size_t kBlock = 8;
  // Element e of rank r's block.
  auto byteOf = [](int r, int n, size_t e) -> uint8_t {
    switch (e) {
      case 0:
        return 0x02;  // true everywhere
      case 1:
        return 0;  // false everywhere
      case 2:
        return r == n - 1 ? 0xff : 0;  // true on the last rank only
      case 3:
        return r == 0 ? 0 : 0x01;  // false on rank 0 only
      case 4:
        return r % 2 ? 0x80 : 0x01;  // true everywhere: 0x80 + 0x80 wraps to 0, 0x01 * 0x80 = 0x80
      case 5:
        return r % 2 ? 0 : 0xff;  // alternating
      case 6:
        return 0x80;  // true everywhere; a byte sum wraps to 0 on even counts of ranks
      default:
        return r == 0 ? 0x02 : 0x01;  // true everywhere; the byte max is 2
    }
  };
  for (int n : {1, 2, 3, 4, 5, 7}) {
    for (Collective coll :
         {Collective::kAllreduce, Collective::kReduce, Collective::kReduceScatter}) {
      for (const char* algo : algorithmNames(coll)) {
        if (std::string(algo) == "hierarchical") continue;  // declines on one node
        Config cfg;
        cfg.algo[static_cast<int>(coll)] = algo;
        runRanks(
            n,
            [&](mtxcomm_comm_t comm, int rank) {
              const bool scatter = coll == Collective::kReduceScatter;
              const size_t inCount = scatter ? kBlock * n : kBlock;
              for (mtxcomm_op_t op : {MTXCOMM_SUM, MTXCOMM_MAX, MTXCOMM_PROD, MTXCOMM_MIN}) {
                const bool isAnd = op == MTXCOMM_PROD || op == MTXCOMM_MIN;
                for (bool inPlace : {false, true}) {
                  SCOPED_TRACE(::testing::Message()
                               << collectiveName(coll) << "/" << algo << " n=" << n << " "
                               << opName(op) << (inPlace ? " in place" : " out of place"));
                  std::vector<uint8_t> send(inCount), recv(inCount, 0x5a);
                  for (size_t i = 0; i < inCount; ++i) send[i] = byteOf(rank, n, i % kBlock);
                  if (inPlace) recv = send;
                  const uint8_t* sendArg = inPlace ? recv.data() : send.data();
                  uint8_t* recvArg = recv.data() + (inPlace && scatter ? rank * kBlock : 0);
                  mtxcomm_result_t rc = MTXCOMM_INTERNAL_ERROR;
                  if (coll == Collective::kAllreduce) {
                    rc = mtxcomm_allreduce(sendArg, recvArg, kBlock, MTXCOMM_BOOL, op, comm,
                                           nullptr);
                  } else if (coll == Collective::kReduce) {
                    rc = mtxcomm_reduce(sendArg, recvArg, kBlock, MTXCOMM_BOOL, op, n - 1, comm,
                                        nullptr);
                  } else {
                    rc = mtxcomm_reduce_scatter(sendArg, recvArg, kBlock, MTXCOMM_BOOL, op, comm,
                                                nullptr);
                  }
                  ASSERT_EQ(rc, MTXCOMM_SUCCESS) << mtxcomm_get_last_error(comm);
                  if (coll == Collective::kReduce && rank != n - 1) continue;
                  for (size_t e = 0; e < kBlock; ++e) {
                    bool any = false, all = true;
                    for (int r = 0; r < n; ++r) {
                      any = any || byteOf(r, n, e) != 0;
                      all = all && byteOf(r, n, e) != 0;
                    }
                    EXPECT_EQ(+recvArg[e], (isAnd ? all : any) ? 1 : 0) << "element " << e;
                  }
                  // The cases whose answer is known by heart, so the reference cannot hide a bug.
                  EXPECT_EQ(+recvArg[0], 1);
                  EXPECT_EQ(+recvArg[1], 0);
                  EXPECT_EQ(+recvArg[4], 1);
                  EXPECT_EQ(+recvArg[6], 1);
                  EXPECT_EQ(+recvArg[7], 1);
                  if (n > 1) {
                    EXPECT_EQ(+recvArg[2], isAnd ? 0 : 1);
                    EXPECT_EQ(+recvArg[3], isAnd ? 0 : 1);
                    EXPECT_EQ(+recvArg[5], isAnd ? 0 : 1);
                  } else {
                    EXPECT_EQ(+recvArg[2], 1);  // one rank: its own value, as 0/1
                    EXPECT_EQ(+recvArg[3], 0);
                  }
                  if (!inPlace) {
                    for (size_t i = 0; i < inCount; ++i) {
                      ASSERT_EQ(send[i], byteOf(rank, n, i % kBlock)) << "send buffer written";
                    }
                  }
                }
              }
            },
            cfg);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, PrimeCountMatrix, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Sizes, CollectiveMatrix,
                         ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace mtxcomm
