// mtxcomm_info: version, build options, transports, algorithms and the effective configuration
// (every MTXCOMM_* variable with its value, default and help). Does not start communication
// unless --init is given (then it also prints the communicator that init_from_env builds) or
// --topology (what this rank sees through hwloc and, with several ranks, the agreed node map).
// --why-stuck DIR explains the flight records a job's ranks wrote (lib/comm/why_stuck.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "algos/registry.h"
#include "gpu/device.h"
#include "lib/base/error.h"
#include "lib/base/topology.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/comm/config.h"
#include "lib/comm/init.h"
#include "lib/comm/why_stuck.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm_build_info.h"

namespace {

// --topology: rank 0 prints every rank's view (its summary as allgathered, in rank order) and
// the node map the ranks agreed on.
// The world communicator from the environment, or null after printing why.
mtxcomm_comm_t initOrReport() {
  mtxcomm_comm_t comm = nullptr;
  mtxcomm_result_t r = mtxcomm_comm_init_from_env(&comm);
  if (r != MTXCOMM_SUCCESS) {
    std::fprintf(stderr, "mtxcomm_info: init failed: %s: %s\n", mtxcomm_get_error_string(r),
                 mtxcomm_get_last_error(nullptr));
    return nullptr;
  }
  return comm;
}

int printTopology() {
  mtxcomm_comm_t comm = initOrReport();
  if (!comm) return 1;
  const mtxcomm::Comm& c = *mtxcomm::unwrapComm(comm);
  const mtxcomm::Topology& t = c.topology();
  if (c.rank() == 0) {
    for (int k = 0; k < t.size(); ++k) {
      std::printf("rank %d of %d sees: %s\n", k, c.size(),
                  mtxcomm::describeSummary(t.summary(k)).c_str());
    }
    std::printf("agreed node map: %d rank(s) on %d node(s); shared-memory segment for all: %s\n%s",
                c.size(), t.numNodes(), c.hasShm() ? "yes" : "no", t.describeNodes().c_str());
    std::fflush(stdout);
  }
  mtxcomm_comm_destroy(comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mtxcomm_info: what this mtxcomm was built with and how it is configured"};
  bool init = false;
  app.add_flag("--init", init,
               "also build the world communicator (mtxcomm_comm_init_from_env) and print it");
  bool topology = false;
  app.add_flag("--topology", topology,
               "build the world communicator and print this rank's view of its node (hwloc) "
               "and, with several ranks (under mpirun), the node map they agreed on");
  std::string whyStuck;
  app.add_option("--why-stuck", whyStuck,
                 "read the flight records the ranks wrote to DIR (MTXCOMM_FLIGHT_RECORDER_DIR) "
                 "and say which rank the job waits for, the last call every rank completed, the "
                 "first call where the ranks differ and who waits on whom")
      ->type_name("DIR");
  CLI11_PARSE(app, argc, argv);
  if (topology) return printTopology();
  if (!whyStuck.empty()) {
    try {
      std::fputs(mtxcomm::explainFlightRecords(whyStuck).c_str(), stdout);
      return 0;
    } catch (const mtxcomm::Error& e) {
      std::fprintf(stderr, "mtxcomm_info --why-stuck: %s\n", e.what());
      return 1;
    }
  }

  int version = 0;
  mtxcomm_get_version(&version);
  std::printf("mtxcomm %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
  std::printf("\nbuild:\n  type: %s\n  compiler: %s\n", MTXCOMM_BUILD_TYPE, MTXCOMM_BUILD_COMPILER);
  std::printf("  MPI: %s %s\n  UCX: %s\n  CUDA: %s\n  NCCL: %s\n  hwloc: %s\n  TensorFlow: %s\n",
              MTXCOMM_BUILD_WITH_MPI, MTXCOMM_BUILD_MPI_VERSION, MTXCOMM_BUILD_WITH_UCX,
              MTXCOMM_BUILD_WITH_CUDA, MTXCOMM_BUILD_WITH_NCCL, MTXCOMM_BUILD_WITH_HWLOC,
              MTXCOMM_BUILD_WITH_TENSORFLOW);
  std::printf("  device buffers: %s\n", mtxcomm::gpu::deviceSummary().c_str());
  if (std::string(MTXCOMM_BUILD_WITH_NCCL) == "ON") {
    std::printf("  NCCL headers: %s\n", MTXCOMM_BUILD_NCCL_HEADERS);
  }
  std::printf("  NCCL library: %s\n", mtxcomm::gpu::ncclSummary().c_str());
  std::printf("\ntransports:\n  inproc  ranks as threads of one process\n");
#ifdef MTXCOMM_HAVE_MPI
  std::printf("  mpi     MPI point-to-point (under mpirun/srun, or mtxcomm_comm_init_mpi)\n");
#endif
  std::printf("  tcp     sockets, bootstrapped by MTXCOMM_RANK/MTXCOMM_SIZE/MTXCOMM_STORE\n");
#ifdef MTXCOMM_HAVE_UCX
  std::printf(
      "  ucx     UCX tag matching, chosen when the ranks span several nodes (or "
      "MTXCOMM_TRANSPORT=ucx)\n");
#endif

  std::printf("\nalgorithms:\n");
  for (const mtxcomm::Algorithm& a : mtxcomm::algorithms()) {
    std::printf("  %-15s %-19s %s\n", mtxcomm::collectiveName(a.coll), a.name, a.description);
  }

  std::printf("\ndevice paths (collectives on device buffers, MTXCOMM_CUDA_PATH):\n");
  for (int p = 0; p < mtxcomm::gpu::kNumDevicePaths; ++p) {
    const auto path = static_cast<mtxcomm::gpu::DevicePath>(p);
    std::printf("  %s\n", mtxcomm::gpu::devicePathName(path));
  }

  std::printf("\nconfiguration (environment):\n");
  int rc = 0;
  try {
    mtxcomm::Config cfg = mtxcomm::loadConfig();
    auto effective = cfg.describe();
    for (const mtxcomm::ConfigVar& v : mtxcomm::configVars()) {
      std::string value = "?";
      for (const auto& line : effective) {
        if (line.rfind(v.name + "=", 0) == 0) value = line.substr(v.name.size() + 1);
      }
      std::printf("  %s=%s\n      [%s, default %s%s] %s\n", v.name.c_str(), value.c_str(),
                  v.type.c_str(), v.defaultValue.empty() ? "unset" : v.defaultValue.c_str(),
                  v.mustAgree ? ", must agree" : "", v.help.c_str());
    }
    for (const std::string& u : mtxcomm::Config::unknownVariables()) {
      std::printf("  %s: unknown variable, ignored\n", u.c_str());
    }
  } catch (const mtxcomm::Error& e) {
    std::fprintf(stderr, "mtxcomm_info: %s\n", e.what());
    rc = 1;
  }

  if (init && rc == 0) {
    mtxcomm_comm_t comm = initOrReport();
    if (!comm) return 1;
    int rank = 0, size = 0;
    mtxcomm_comm_rank(comm, &rank);
    mtxcomm_comm_size(comm, &size);
    std::printf("\ncommunicator: rank %d of %d, point-to-point over %s\n", rank, size,
                mtxcomm::unwrapComm(comm)->transportName());
    for (const std::string& line : mtxcomm::unwrapComm(comm)->routes()) {
      std::printf("  %s\n", line.c_str());
    }
    mtxcomm_comm_destroy(comm);
  }
  return rc;
}
