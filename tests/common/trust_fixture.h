// The Trust fixture and helpers shared by the trust tests (tests/test_trust_*.cc, one program).
// The trust cases of the bootstrap and the communicator, written as attacks where the finding
// was one: a stranger that dumps or rewrites the TCP store, impersonates a rank, stays silent,
// floods, or amplifies; a file planted by another user in a shared store directory; ranks that
// disagree on their size, rank, configuration or call; a handle used after destroy, or aborted
// from a watchdog thread. Each attack ends with the job's results correct, the stranger refused
// (and logged at WARN with its address), and init delayed by at most a few seconds.
// Ranks are threads of one process, each with its own store client, transport and communicator.
#ifndef MTXCOMM_TESTS_COMMON_TRUST_FIXTURE_H_
#define MTXCOMM_TESTS_COMMON_TRUST_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>

#include "common/test_util.h"
#include "lib/base/clock.h"
#include "lib/base/log.h"

namespace mtxcomm {
namespace trusttest {

using std::chrono::milliseconds;
using testutil::contains;
using testutil::expectError;
using testutil::runThreads;
constexpr milliseconds kTimeout(20000);

inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One class for the suite in every file of the program: GoogleTest refuses a suite whose tests
// use different fixture classes, as a class in each file's unnamed namespace would be.
class Trust : public ::testing::Test {
 protected:
  void SetUp() override { setLogLevel(LogLevel::kWarn); }
};

}  // namespace trusttest
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_TRUST_FIXTURE_H_
