// Algorithm selection: a forced algorithm that declines falls back visibly, an unknown name is an
// error, the automatic rule by size, every registered algorithm is described and found by name,
// and the communicator reports the algorithm it ran.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "algos/registry.h"
#include "common/test_util.h"
#include "harness.h"
#include "lib/base/error.h"
#include "lib/comm/config.h"
#include "lib/comm/cost_model.h"
#include "lib/comm/select.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using testing::runRanks;
using testutil::contains;

// Alltoall: shm on one node with a segment, pairwise without; shm declines (and auto falls to
// pairwise) when a slot has less than 64 bytes per rank.
TEST(Selection, AlltoallShmOnOneNodePairwiseOtherwise) {
  CollArgs a;
  a.coll = Collective::kAlltoall;
  a.count = 100;
  a.elemSize = 4;
  EXPECT_STREQ(defaultAlgorithm(a, CommInfo{4, nullptr})->name, "pairwise");
  Selection s = selectAlgorithm(a, CommInfo{4, nullptr}, "shm", 0);
  EXPECT_STREQ(s.algorithm->name, "pairwise");
  EXPECT_TRUE(contains(s.why, "shared-memory")) << s.why;
  // declines reads only whether a group exists: any non-null pointer stands for one here.
  int standIn = 0;
  CommInfo info{4, reinterpret_cast<ShmGroup*>(&standIn)};
  EXPECT_STREQ(defaultAlgorithm(a, info)->name, "shm");
  info.nranks = 65;
  info.shmSlotBytes = 4096;  // 63 bytes per rank
  EXPECT_EQ(alltoallShmSubSlotBytes(4096, 65), 0u);
  EXPECT_EQ(alltoallShmSubSlotBytes(4096, 64), 64u);
  EXPECT_STREQ(defaultAlgorithm(a, info)->name, "pairwise");
  Selection t = selectAlgorithm(a, info, "shm", 0);
  EXPECT_STREQ(t.algorithm->name, "pairwise");
  EXPECT_TRUE(contains(t.why, "under 64 bytes")) << t.why;
}

// The shm cost model counts two synchronisations per chunk, and the chunk of allreduce and
// reduce_scatter is CommInfo::shmReductionChunkBytes where set (half the slot on a 2 MiB L2):
// 4 MiB in 512 KiB chunks is 8 chunks, 16 synchronisations, against 4 whole 1 MiB slots.
TEST(Selection, ShmCostCountsTheReductionsChunks) {
  CostParams cp;
  cp.intra.alpha = 1e-3;  // the synchronisations dominate
  int standIn = 0;
  CommInfo info{2, reinterpret_cast<ShmGroup*>(&standIn)};
  info.cost = &cp;
  info.shmSlotBytes = size_t{1} << 20;
  CollArgs a;
  a.count = size_t{1} << 20;  // 4 MiB of float32
  a.elemSize = 4;
  for (Collective coll : {Collective::kAllreduce, Collective::kBroadcast}) {
    a.coll = coll;
    const Algorithm* shm = findAlgorithm(coll, "shm");
    ASSERT_NE(shm, nullptr);
    info.shmReductionChunkBytes = 0;  // the slot
    const double whole = predictSeconds(*shm, a, info);
    info.shmReductionChunkBytes = size_t{512} << 10;
    const double halves = predictSeconds(*shm, a, info);
    const double expected = coll == Collective::kAllreduce ? 8 * cp.intra.alpha : 0.0;
    EXPECT_NEAR(halves - whole, expected, 1e-9) << collectiveName(coll);
  }
}

TEST(Selection, ForcedAlgorithmThatDeclinesFallsBackVisibly) {
  CollArgs a;
  a.coll = Collective::kAllgather;
  a.count = 10;
  a.elemSize = 4;
  Selection s = selectAlgorithm(a, CommInfo{3, nullptr}, "recursive_doubling", 0);
  EXPECT_STREQ(s.algorithm->name, "ring");
  EXPECT_TRUE(contains(s.why, "power-of-two")) << s.why;
  Selection t = selectAlgorithm(a, CommInfo{4, nullptr}, "recursive_doubling", 0);
  EXPECT_STREQ(t.algorithm->name, "recursive_doubling");
  try {
    selectAlgorithm(a, CommInfo{4, nullptr}, "bogus", 0);
    ADD_FAILURE() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE);
  }
  // The automatic rule by size.
  CollArgs r;
  r.coll = Collective::kAllreduce;
  r.elemSize = 4;
  r.count = 16;
  EXPECT_STREQ(defaultAlgorithm(r, CommInfo{8, nullptr})->name, "recursive_doubling");
  r.count = 1 << 20;
  EXPECT_STREQ(defaultAlgorithm(r, CommInfo{8, nullptr})->name, "ring");
  // Every registered algorithm has a description and is found by its name.
  for (const Algorithm& alg : algorithms()) {
    EXPECT_EQ(findAlgorithm(alg.coll, alg.name), &alg);
    EXPECT_GT(std::strlen(alg.description), 10u);
  }
}

// Op adasum goes to the adasum algorithm alone: on one node with a segment (not shm), on
// several nodes (not hierarchical), and when another algorithm is forced (a visible fallback);
// the adasum algorithm declines every other op, and has a finite predicted time.
TEST(Selection, AdasumRunsOnlyOnTheAdasumAlgorithm) {
  CollArgs a;
  a.coll = Collective::kAllreduce;
  a.count = 1000;
  a.elemSize = 4;
  a.dtype = MTXCOMM_FLOAT32;
  a.op = MTXCOMM_ADASUM;
  int standIn = 0;
  const CommInfo shm{4, reinterpret_cast<ShmGroup*>(&standIn)};
  const Topology twoNodes = Topology::forTest({0, 0, 1, 1});
  CommInfo nodes{4, nullptr};
  nodes.topo = &twoNodes;
  for (const CommInfo& info : {CommInfo{4, nullptr}, CommInfo{5, nullptr}, shm, nodes}) {
    EXPECT_STREQ(defaultAlgorithm(a, info)->name, "adasum");
    for (const Algorithm& alg : algorithms()) {
      if (alg.coll != Collective::kAllreduce) continue;
      const bool isAdasum = std::string(alg.name) == "adasum";
      EXPECT_EQ(isAdasumAlgorithm(alg), isAdasum) << alg.name;
      EXPECT_EQ(algorithmDeclines(alg, a, info) == nullptr, isAdasum) << alg.name;
      Selection s = selectAlgorithm(a, info, alg.name, 0);
      EXPECT_STREQ(s.algorithm->name, "adasum") << "forced " << alg.name;
      if (!isAdasum) {
        EXPECT_TRUE(contains(s.why, "fallback")) << s.why;
      }
    }
  }
  Selection s = selectAlgorithm(a, shm, "auto", 0);
  EXPECT_EQ(s.why, "auto: op adasum");
  EXPECT_LT(s.predicted, 1.0);
  // Every other op: adasum declines, even when forced.
  const Algorithm* adasum = findAlgorithm(Collective::kAllreduce, "adasum");
  ASSERT_NE(adasum, nullptr);
  for (mtxcomm_op_t op : {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX}) {
    a.op = op;
    EXPECT_NE(algorithmDeclines(*adasum, a, CommInfo{4, nullptr}), nullptr);
    EXPECT_STRNE(defaultAlgorithm(a, CommInfo{4, nullptr})->name, "adasum");
    EXPECT_STRNE(selectAlgorithm(a, CommInfo{4, nullptr}, "adasum", 0).algorithm->name, "adasum");
  }
}

TEST(Selection, LastAlgorithmReflectsTheForcedChoice) {
  Config cfg;
  cfg.algo[static_cast<int>(Collective::kAllreduce)] = "rabenseifner";
  runRanks(
      3,
      [](mtxcomm_comm_t comm, int) {
        float x[8] = {0};
        ASSERT_EQ(mtxcomm_allreduce(x, x, 8, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
                  MTXCOMM_SUCCESS);
        EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), "rabenseifner");
      },
      cfg);
}

}  // namespace
}  // namespace mtxcomm
