// The run-time loading of NCCL (gpu/nccl_api.h), in CUDA builds with nccl.h: no GPU needed
// (dlopen and ncclGetVersion touch no device).
#include <gtest/gtest.h>

#include <string>

#include "gpu/device.h"
#include "gpu/nccl_api.h"

namespace mtxcomm {
namespace gpu {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The library CMake found beside the headers (MTXCOMM_TEST_NCCL_LIBRARY), by its path.
TEST(NcclApi, LoadsTheLibraryGivenByPath) {
  const std::string lib = MTXCOMM_TEST_NCCL_LIBRARY;
  if (lib.empty()) GTEST_SKIP() << "CMake found nccl.h but no libnccl beside it";
  const NcclLoad l = loadNccl(lib, "");
  ASSERT_EQ(l.error, "");
  EXPECT_GE(l.version, kMinNcclVersion);
  EXPECT_EQ(l.version / 10000, NCCL_MAJOR) << "the headers and the library disagree on NCCL's "
                                              "major version";
  EXPECT_FALSE(l.path.empty());
  for (auto fn : {reinterpret_cast<void*>(l.api.ncclAllReduce),
                  reinterpret_cast<void*>(l.api.ncclCommInitRank),
                  reinterpret_cast<void*>(l.api.ncclReduceScatter)}) {
    EXPECT_NE(fn, nullptr);
  }
  EXPECT_TRUE(contains(l.api.ncclGetErrorString(ncclInvalidArgument), "invalid argument"))
      << "not NCCL's own error table";
}

// MTXCOMM_NCCL_LIBRARY naming no file: the variable, the path and dlerror(), nothing else tried.
TEST(NcclApi, AMissingExplicitLibraryNamesTheVariableAndThePath) {
  const NcclLoad l = loadNccl("/nonexistent/libnccl.so.2", MTXCOMM_TEST_NCCL_LIBDIR);
  EXPECT_TRUE(contains(l.error, "MTXCOMM_NCCL_LIBRARY=/nonexistent/libnccl.so.2")) << l.error;
  EXPECT_TRUE(contains(l.error, "No such file")) << l.error;
  EXPECT_EQ(l.version, 0);
}

// A library that is not NCCL: the first missing function is named.
TEST(NcclApi, ALibraryThatIsNotNcclNamesTheMissingFunction) {
  const NcclLoad l = loadNccl("libm.so.6", "");
  EXPECT_TRUE(contains(l.error, "ncclGetVersion")) << l.error;
  EXPECT_TRUE(contains(l.error, "older than 2.13.0")) << l.error;
}

// The name and then a directory that has no NCCL (a name no loader finds stands for a machine
// without NCCL): both attempts and the remedies are named.
TEST(NcclApi, NotFoundNamesEveryPlaceTriedAndTheRemedy) {
  const NcclLoad l = loadNccl("", "/nonexistent-dir", "libnccl-absent.so.2");
  EXPECT_TRUE(contains(l.error, "libnccl-absent.so.2: cannot open shared object file")) << l.error;
  EXPECT_TRUE(contains(l.error, "/nonexistent-dir/libnccl-absent.so.2")) << l.error;
  EXPECT_TRUE(contains(l.error, "MTXCOMM_NCCL_LIBRARY")) << l.error;
  EXPECT_TRUE(contains(l.error, "nvidia-nccl-cu")) << l.error;
}

// The process's own attempt (the build-time directory as the last place): what mtxcomm_info
// prints.
TEST(NcclApi, TheProcessSummaryNamesTheVersionOrWhy) {
  const std::string s = ncclSummary();
  if (ncclLoadResult().error.empty()) {
    EXPECT_TRUE(contains(s, "libnccl.so.2 2.")) << s;
  } else {
    EXPECT_TRUE(contains(s, "not loadable: ")) << s;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace mtxcomm
