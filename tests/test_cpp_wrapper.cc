// The thin C++ header (include/mtxcomm/mtxcomm.hpp): calls, errors thrown as mtxcomm::Error with
// code and message, split.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "harness.h"
#include "mtxcomm/mtxcomm.hpp"

namespace mtxcomm {
namespace {

using testing::makeInprocComms;
using testutil::contains;

TEST(CppWrapper, ThrowsErrorWithCodeAndMessage) {
  auto comms = makeInprocComms(1);
  Communicator c(comms[0]);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  float x = 3;
  c.allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_AVG);
  EXPECT_EQ(x, 3.0f);
  try {
    c.broadcast(&x, &x, 1, MTXCOMM_FLOAT32, 5);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), MTXCOMM_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(e.what(), "root 5")) << e.what();
  }
  Communicator sub = c.split(0, 0);
  EXPECT_EQ(sub.size(), 1);
}

TEST(CppWrapper, AlltoallAndAlltoallv) {
  testing::runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    Communicator c(comm);
    const int send[2] = {10 * rank, 10 * rank + 1};
    int recv[2] = {-1, -1};
    c.alltoall(send, recv, 1, MTXCOMM_INT32);
    EXPECT_EQ(recv[0], rank);
    EXPECT_EQ(recv[1], 10 + rank);
    const size_t ones[2] = {1, 1}, d[2] = {0, 1};
    c.alltoallv(send, ones, d, recv, ones, d, MTXCOMM_INT32);
    EXPECT_EQ(recv[1], 10 + rank);
    try {
      c.alltoall(recv, recv, 1, MTXCOMM_INT32);
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_ARGUMENT);
    }
  });
}

}  // namespace
}  // namespace mtxcomm
