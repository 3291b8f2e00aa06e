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
