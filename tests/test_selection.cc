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
