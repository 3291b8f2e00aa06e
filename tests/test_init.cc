// mtxcomm_comm_init_from_env without a launcher: a communicator of size 1, and an error naming
// MTXCOMM_STORE when MTXCOMM_RANK/MTXCOMM_SIZE ask for more ranks without a store.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/test_util.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using testutil::contains;

TEST(InitFromEnv, SingleProcessWithoutLauncherIsSizeOne) {
  // Not under a launcher, whatever started this test.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                        "SLURM_STEP_ID", "MTXCOMM_STORE", "MTXCOMM_RANK", "MTXCOMM_SIZE"}) {
    unsetenv(v);
  }
  mtxcomm_comm_t comm = nullptr;
  ASSERT_EQ(mtxcomm_comm_init_from_env(&comm), MTXCOMM_SUCCESS) << mtxcomm_get_last_error(nullptr);
  int size = 0;
  mtxcomm_comm_size(comm, &size);
  EXPECT_EQ(size, 1);
  double d[2] = {1.5, 2.5}, o[2] = {0, 0};
  EXPECT_EQ(mtxcomm_allreduce(d, o, 2, MTXCOMM_FLOAT64, MTXCOMM_MAX, comm, nullptr),
            MTXCOMM_SUCCESS);
  EXPECT_EQ(o[1], 2.5);
  mtxcomm_comm_destroy(comm);
  setenv("MTXCOMM_RANK", "0", 1);
  setenv("MTXCOMM_SIZE", "2", 1);
  EXPECT_EQ(mtxcomm_comm_init_from_env(&comm), MTXCOMM_INVALID_USAGE);
  EXPECT_EQ(comm, nullptr);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "MTXCOMM_STORE"));
  unsetenv("MTXCOMM_RANK");
  unsetenv("MTXCOMM_SIZE");
}

}  // namespace
}  // namespace mtxcomm
