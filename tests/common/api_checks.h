// Checks shared by the C API tests: after a rejected call the communicator must still work.
#ifndef MTXCOMM_TESTS_COMMON_API_CHECKS_H_
#define MTXCOMM_TESTS_COMMON_API_CHECKS_H_

#include <gtest/gtest.h>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace testutil {

// A 2-element float32 sum allreduce on comm of n ranks: {1, 2} from every rank gives {n, 2n}.
inline void expectUsable(mtxcomm_comm_t comm, int n) {
  float in[2] = {1.0f, 2.0f}, out[2] = {0, 0};
  ASSERT_EQ(mtxcomm_allreduce(in, out, 2, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
            MTXCOMM_SUCCESS)
      << mtxcomm_get_last_error(comm);
  EXPECT_EQ(out[0], 1.0f * n);
  EXPECT_EQ(out[1], 2.0f * n);
}

}  // namespace testutil
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_API_CHECKS_H_
