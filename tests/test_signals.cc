// A program that loads libmtxcomm and makes a communicator of size 1 keeps its own signal
// dispositions: UCX (whose libucs installs SIGSEGV, SIGBUS, SIGILL and SIGFPE handlers for the
// whole process when it is loaded) is not loaded unless a job uses the UCX transport
// (transports/ucx/ucx_api.h). Linked against the shared libmtxcomm, as Python and downstream
// programs load it, and only through the public C API.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "mtxcomm/mtxcomm.h"

namespace {

// The lines of /proc/self/maps that name a file containing needle.
std::string mappedLines(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  std::string line, out;
  while (std::getline(maps, line)) {
    if (line.find(needle) != std::string::npos) out += line + "\n";
  }
  return out;
}

// "SIG_DFL", or where the handler lives, for the failure message.
std::string describeHandler(const struct sigaction& a) {
  if (a.sa_handler == SIG_DFL) return "SIG_DFL";
  if (a.sa_handler == SIG_IGN) return "SIG_IGN";
  void* fn = (a.sa_flags & SA_SIGINFO) ? reinterpret_cast<void*>(a.sa_sigaction)
                                       : reinterpret_cast<void*>(a.sa_handler);
  Dl_info info{};
  if (dladdr(fn, &info) && info.dli_fname) return std::string("a handler in ") + info.dli_fname;
  return "a handler outside any loaded object";
}

TEST(Signals, CommOfSizeOneLeavesErrorSignalsAtDefaultAndUcxUnloaded) {
  // Not under a launcher, and no transport forced, whatever started this test.
  for (const char* v :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID",
        "MTXCOMM_STORE", "MTXCOMM_RANK", "MTXCOMM_SIZE", "MTXCOMM_TRANSPORT"}) {
    unsetenv(v);
  }
  mtxcomm_comm_t comm = nullptr;
  ASSERT_EQ(mtxcomm_comm_init_from_env(&comm), MTXCOMM_SUCCESS) << mtxcomm_get_last_error(nullptr);
  int size = 0;
  EXPECT_EQ(mtxcomm_comm_size(comm, &size), MTXCOMM_SUCCESS);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(mtxcomm_comm_destroy(comm), MTXCOMM_SUCCESS);

  const struct {
    int sig;
    const char* name;
  } sigs[] = {{SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"}, {SIGILL, "SIGILL"}, {SIGFPE, "SIGFPE"}};
  for (const auto& s : sigs) {
    struct sigaction a {};
    ASSERT_EQ(sigaction(s.sig, nullptr, &a), 0) << s.name;
    EXPECT_EQ(a.sa_handler, SIG_DFL) << s.name << " has " << describeHandler(a);
  }
  const std::string ucs = mappedLines("libucs");
  EXPECT_TRUE(ucs.empty()) << "libucs is loaded in this process:\n" << ucs;
}

}  // namespace
