// Communicator queries and construction through the C API: split by color, then key, then rank
// (the parent unaffected), and the local rank and size on this node.
#include <gtest/gtest.h>

#include "common/api_checks.h"
#include "harness.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using testing::runRanks;
using testutil::expectUsable;

TEST(Api, SplitFollowsColorThenKeyThenRank) {
  runRanks(5, [](mtxcomm_comm_t comm, int rank) {
    mtxcomm_comm_t sub = nullptr;
    // Odd ranks get color 1, even ranks color 0, rank 4 opts out; key reverses the order.
    int color = rank == 4 ? MTXCOMM_UNDEFINED : rank % 2;
    ASSERT_EQ(mtxcomm_comm_split(comm, color, -rank, &sub), MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    if (rank == 4) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      int subRank = -1, subSize = 0;
      mtxcomm_comm_rank(sub, &subRank);
      mtxcomm_comm_size(sub, &subSize);
      EXPECT_EQ(subSize, 2);
      // color 0: ranks {0, 2} ordered by key -rank: 2 first. color 1: {1, 3}: 3 first.
      EXPECT_EQ(subRank, (rank == 2 || rank == 3) ? 0 : 1);
      int v = rank + 1, sum = 0;
      ASSERT_EQ(mtxcomm_allreduce(&v, &sum, 1, MTXCOMM_INT32, MTXCOMM_SUM, sub, nullptr),
                MTXCOMM_SUCCESS);
      EXPECT_EQ(sum, rank % 2 == 0 ? 1 + 3 : 2 + 4);
      mtxcomm_comm_destroy(sub);
    }
    // The parent still works, and its traffic never mixed with the children's.
    expectUsable(comm, 5);
  });
}

TEST(Api, LocalRankAndSizeCountTheRanksOnThisNode) {
  // Threads of one process are on one node.
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    int lr = -1, ls = -1;
    ASSERT_EQ(mtxcomm_comm_local_rank(comm, &lr), MTXCOMM_SUCCESS);
    ASSERT_EQ(mtxcomm_comm_local_size(comm, &ls), MTXCOMM_SUCCESS);
    EXPECT_EQ(lr, rank);
    EXPECT_EQ(ls, 3);
    EXPECT_EQ(mtxcomm_comm_local_rank(comm, nullptr), MTXCOMM_INVALID_ARGUMENT);
  });
}

}  // namespace
}  // namespace mtxcomm
