// The one clock of deadlines and timeouts across the library.
#ifndef MTXCOMM_LIB_BASE_CLOCK_H_
#define MTXCOMM_LIB_BASE_CLOCK_H_

#include <chrono>

namespace mtxcomm {

using Clock = std::chrono::steady_clock;

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_CLOCK_H_
