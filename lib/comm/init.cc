#include "lib/comm/init.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/comm/placement.h"
#include "lib/comm/stores.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/route/route.h"
#include "transports/tcp/tcp_transport.h"
#ifdef MTXCOMM_HAVE_MPI
#include <mpi.h>

#include "transports/mpi/mpi_transport.h"
#endif

namespace mtxcomm {

bool launchedByMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(v)) return true;
  }
  return std::getenv("SLURM_PROCID") && std::getenv("SLURM_STEP_ID");
}

namespace {

// This rank and the job's size as the launcher gives them (mpirun, a PMI launcher, srun), for
// the TCP bootstrap where MTXCOMM_RANK/MTXCOMM_SIZE are not set. False when none does.
bool launcherRankSize(int* rank, int* size) {
  static const char* const kPairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                          {"PMI_RANK", "PMI_SIZE"},
                                          {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& pair : kPairs) {
    const char* r = std::getenv(pair[0]);
    const char* n = std::getenv(pair[1]);
    if (!r || !n || !*r || !*n) continue;
    char* end = nullptr;
    const long rv = std::strtol(r, &end, 10);
    if (*end) continue;
    const long nv = std::strtol(n, &end, 10);
    if (*end || nv < 1 || rv < 0 || rv >= nv || nv > (1 << 24)) continue;
    *rank = static_cast<int>(rv);
    *size = static_cast<int>(nv);
    return true;
  }
  return false;
}

}  // namespace

Config loadConfig() {
  Config cfg = Config::fromEnvironment();
  setLogLevel(cfg.logLevel);
  for (const std::string& name : Config::unknownVariables()) {
    MTXCOMM_LOG(kWarn, cfg.rank, "unknown variable ", name,
                " ignored (a typo? `mtxcomm_info` lists the known ones)");
  }
  return cfg;
}

namespace {

void echoConfig(const Comm& comm) {
  if (!logEnabled(LogLevel::kInfo)) return;
  std::string all;
  for (const std::string& line : comm.config().describe()) all += " " + line;
  MTXCOMM_LOG(kInfo, comm.rank(), "communicator of ", comm.size(), " ranks over ",
              comm.transportName(), "; configuration:", all);
}

std::atomic<bool> g_exitingOnError{false};  // mtxcomm_exiting_on_error

#ifdef MTXCOMM_HAVE_MPI
std::once_flag g_mpiFinalizeOnce;
pid_t g_mpiOwnerPid = 0;  // the process that started MPI
void finalizeOwnedMpi() {
  // A child made by fork() exits without finalizing its parent's MPI (it would hang there).
  if (getpid() != g_mpiOwnerPid) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  if (g_exitingOnError.load()) {
    // MPI_Finalize waits for every rank; one that is busy or hung would keep this failed rank
    // (and so the job) alive. Exiting without it makes mpirun end the job.
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MTXCOMM_LOG(kWarn, rank, "this process ends on an error: it exits without MPI_Finalize (which ",
                "would wait for every other rank), so the launcher ends the job");
    return;
  }
  MPI_Finalize();
}

void ensureMpiInitialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) fail(MTXCOMM_INVALID_USAGE, "MPI has already been finalized in this process");
    return;
  }
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) fail(MTXCOMM_SYSTEM_ERROR, "MPI_Init_thread failed (code ", rc, ")");
  // mtxcomm started MPI, so mtxcomm ends it, when the program exits.
  g_mpiOwnerPid = getpid();
  std::call_once(g_mpiFinalizeOnce, [] { std::atexit(finalizeOwnedMpi); });
}

bool mpiInitialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}
#endif

}  // namespace

void markExitingOnError() { g_exitingOnError = true; }

namespace {

// The communicator over base, with the point-to-point transport chosen per peer (route.h).
std::unique_ptr<Comm> makeRoutedComm(std::unique_ptr<Transport> base, const Config& cfg) {
  RoutedTransport routed = routeTransport(std::move(base), cfg.transport, cfg.timeoutSeconds,
                                          cfg.ucxEagerLimit, cfg.shm != "off");
  auto comm = std::make_unique<Comm>(std::move(routed.transport), cfg, 0);
  comm->setRoutes(std::move(routed.routes));
  return comm;
}

}  // namespace

std::unique_ptr<Comm> initFromEnv() {
  Config cfg = loadConfig();
  // The bootstrap: how the ranks first meet. MTXCOMM_TRANSPORT=ucx bootstraps as auto does.
  std::string boot = cfg.transport == "ucx" ? "auto" : cfg.transport;
  if (boot == "auto") {
    if (!cfg.store.empty()) {
      boot = "tcp";
#ifdef MTXCOMM_HAVE_MPI
    } else if (launchedByMpi() || mpiInitialized()) {
      boot = "mpi";
#endif
    } else if (cfg.rank >= 0 || cfg.size > 0) {
      fail(MTXCOMM_INVALID_USAGE,
           "MTXCOMM_RANK/MTXCOMM_SIZE are set but MTXCOMM_STORE is not: set MTXCOMM_STORE to "
           "file:PATH or tcp:HOST:PORT, or launch with mpirun");
    } else if (cfg.transport == "ucx") {
      fail(MTXCOMM_INVALID_USAGE,
           "MTXCOMM_TRANSPORT=ucx needs a bootstrap: launch with mpirun, or set MTXCOMM_RANK, "
           "MTXCOMM_SIZE and MTXCOMM_STORE");
    } else {
      boot = "local";
    }
  }
  std::unique_ptr<Comm> comm;
  if (boot == "mpi") {
#ifdef MTXCOMM_HAVE_MPI
    ensureMpiInitialized();
    comm = makeRoutedComm(makeMpiTransport(MPI_COMM_WORLD, cfg.timeoutSeconds), cfg);
    comm->agreeConfig();
#else
    fail(MTXCOMM_UNSUPPORTED, "MTXCOMM_TRANSPORT=mpi but this mtxcomm was built without MPI");
#endif
  } else if (boot == "tcp") {
    if (cfg.rank < 0 && cfg.size < 1) launcherRankSize(&cfg.rank, &cfg.size);
    if (cfg.store.empty() || cfg.rank < 0 || cfg.size < 1) {
      fail(MTXCOMM_INVALID_USAGE,
           "the TCP bootstrap needs MTXCOMM_RANK, MTXCOMM_SIZE and MTXCOMM_STORE (have rank ",
           cfg.rank, ", size ", cfg.size, ", store \"", cfg.store, "\")",
           launchedByMpi() && cfg.store.empty()
               ? "; under mpirun, set MTXCOMM_STORE=tcp:HOST:PORT (a free port on rank 0's "
                 "host; mtxrun sets it) and the rank and size come from mpirun's"
               : "");
    }
    auto timeout = std::chrono::milliseconds(static_cast<long>(cfg.timeoutSeconds * 1000));
    std::unique_ptr<Store> store =
        makeStore(cfg.store, cfg.rank, cfg.size, timeout, cfg.loadJobSecret());
    try {
      comm = makeRoutedComm(makeTcpTransport(*store, cfg.rank, cfg.size, timeout), cfg);
      comm->agreeConfig();
      // Every rank has read what it needs from the store once all have passed a barrier; only
      // then may rank 0 stop serving it.
      CollArgs barrier;
      barrier.coll = Collective::kBarrier;
      comm->run(barrier);
    } catch (const Error& e) {
      store->reportFault(strCat("rank ", cfg.rank, ": ", e.what()));  // the others learn why
      throw;
    }
  } else {
    comm = std::make_unique<Comm>(std::move(makeInprocTransports(1)[0]), cfg, 0);
  }
  comm->setup();
  comm->setCpuShare(applyPlacement(comm->topology(), comm->rank(), cfg.placement).share);
  echoConfig(*comm);
  return comm;
}

#ifdef MTXCOMM_HAVE_MPI
std::unique_ptr<Comm> initFromMpiComm(void* mpiComm) {
  Config cfg = loadConfig();
  if (!mpiInitialized()) {
    fail(MTXCOMM_INVALID_USAGE, "mtxcomm_comm_init_mpi: MPI is not initialised (or finalized)");
  }
  auto comm =
      makeRoutedComm(makeMpiTransport(*static_cast<MPI_Comm*>(mpiComm), cfg.timeoutSeconds), cfg);
  comm->agreeConfig();
  comm->setup();
  echoConfig(*comm);
  return comm;
}
#endif

}  // namespace mtxcomm
