// The C API boundary: every entry point checks its handle, runs the call and turns exceptions
// into a result code plus the communicator's last error. Nothing here throws.
#include "lib/comm/c_api.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

#include "gpu/device.h"
#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/comm/c_api_guard.h"
#include "lib/comm/config.h"
#include "lib/comm/handle_registry.h"
#include "lib/comm/init.h"
#include "lib/comm/p2p.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"
#include "mtxcomm_build_info.h"
#ifdef MTXCOMM_HAVE_MPI
#include "mtxcomm/mtxcomm_mpi.h"
#endif

using mtxcomm::CollArgs;
using mtxcomm::Collective;
using mtxcomm::Comm;
using mtxcomm::Error;

std::string& mtxcomm::capi::threadError() {
  thread_local std::string message;
  return message;
}

using mtxcomm::capi::guarded;
using mtxcomm::capi::guardedNoComm;
using mtxcomm::capi::threadError;

namespace {

thread_local std::string t_lastErrorCopy;

// mtxcomm_comm_destroy and mtxcomm_comm_abort: NULL is ignored; a live handle is retired (a
// call in flight on another thread ends with "the communicator was <done> (<entry>, another
// thread) during this call"); anything else is MTXCOMM_INVALID_ARGUMENT. An abort tells the
// peers (best effort); a destroy first runs the checks earlier calls left pending
// (Comm::checkPendingAtDestroy): a disagreement found there is its result (this thread's record
// has the message), and the communicator is freed all the same.
mtxcomm_result_t retireEntry(mtxcomm_comm_t comm, const char* entry, const char* done,
                             bool abortPeers) {
  if (!comm) return MTXCOMM_SUCCESS;
  const std::string reason = mtxcomm::strCat("the communicator was ", done, " (", entry,
                                             ", another thread) during this call");
  mtxcomm_result_t pending = MTXCOMM_SUCCESS;
  auto last = [&](Comm& c) {
    if (abortPeers) {
      try {
        c.abort();
      } catch (...) {
        // Best effort: the communicator is going away regardless.
      }
    } else {
      pending = mtxcomm::capi::capture([&] { c.checkPendingAtDestroy(); }, &threadError());
    }
  };
  if (mtxcomm::retireHandle(comm, reason.c_str(), last)) return pending;
  threadError() = std::string(entry) + ": " + mtxcomm::notLiveReason(comm);
  return MTXCOMM_INVALID_ARGUMENT;
}

mtxcomm_result_t collective(mtxcomm_comm_t comm, const CollArgs& args, void* stream) {
  return guarded(comm, [&](Comm& c) {
    CollArgs a = args;
    a.stream = stream;  // device buffers: gpu/device.h
    c.run(a);
  });
}

}  // namespace

extern "C" {

mtxcomm_result_t mtxcomm_comm_init_from_env(mtxcomm_comm_t* comm) {
  return guardedNoComm([&] {
    if (!comm) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "comm (the output pointer) is NULL");
    *comm = nullptr;
    *comm = mtxcomm::wrapComm(mtxcomm::initFromEnv());
  });
}

#ifdef MTXCOMM_HAVE_MPI
mtxcomm_result_t mtxcomm_comm_init_mpi(MPI_Comm mpiComm, mtxcomm_comm_t* comm) {
  return guardedNoComm([&] {
    if (!comm) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "comm (the output pointer) is NULL");
    *comm = nullptr;
    if (mpiComm == MPI_COMM_NULL)
      mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "mpi_comm is MPI_COMM_NULL");
    *comm = mtxcomm::wrapComm(mtxcomm::initFromMpiComm(&mpiComm));
  });
}
#endif

mtxcomm_result_t mtxcomm_comm_split(mtxcomm_comm_t comm, int color, int key,
                                    mtxcomm_comm_t* newcomm) {
  return guarded(comm, [&](Comm& c) {
    if (!newcomm) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "newcomm (the output pointer) is NULL");
    *newcomm = nullptr;
    auto child = c.split(color, key);
    if (child) *newcomm = mtxcomm::wrapComm(std::move(child));
  });
}

mtxcomm_result_t mtxcomm_comm_destroy(mtxcomm_comm_t comm) {
  return retireEntry(comm, "mtxcomm_comm_destroy", "destroyed", /*abortPeers=*/false);
}

mtxcomm_result_t mtxcomm_comm_abort(mtxcomm_comm_t comm) {
  return retireEntry(comm, "mtxcomm_comm_abort", "aborted", /*abortPeers=*/true);
}

void mtxcomm_exiting_on_error(void) { mtxcomm::markExitingOnError(); }

}  // extern "C"

namespace {
// An entry point that reads one int of a live communicator.
template <class Get>
mtxcomm_result_t getInt(mtxcomm_comm_t comm, int* out, const char* what, Get&& get) {
  return guarded(comm, [&](Comm& c) {
    if (!out) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, what, " (the output pointer) is NULL");
    *out = get(c);
  });
}
}  // namespace

extern "C" {

mtxcomm_result_t mtxcomm_comm_rank(mtxcomm_comm_t comm, int* rank) {
  return getInt(comm, rank, "rank", [](Comm& c) { return c.rank(); });
}

mtxcomm_result_t mtxcomm_comm_size(mtxcomm_comm_t comm, int* size) {
  return getInt(comm, size, "size", [](Comm& c) { return c.size(); });
}

mtxcomm_result_t mtxcomm_comm_local_rank(mtxcomm_comm_t comm, int* local_rank) {
  return getInt(comm, local_rank, "local_rank", [](Comm& c) { return c.localRank(); });
}

mtxcomm_result_t mtxcomm_comm_local_size(mtxcomm_comm_t comm, int* local_size) {
  return getInt(comm, local_size, "local_size", [](Comm& c) { return c.localSize(); });
}

mtxcomm_result_t mtxcomm_comm_cpu_share(mtxcomm_comm_t comm, int* cores) {
  return getInt(comm, cores, "cores", [](Comm& c) { return c.cpuShare(); });
}

}  // extern "C"

namespace {
mtxcomm::ShmGroup& notifier(Comm& c) {
  mtxcomm::ShmGroup* shm = c.notifier();
  if (!shm) {
    mtxcomm::fail(MTXCOMM_UNSUPPORTED,
                  "notifications need every rank of the communicator on one node with a "
                  "shared-memory segment (MTXCOMM_SHM=auto)");
  }
  return *shm;
}

// For the entry points any thread may call: a result code, no last-error record (another
// thread may be using comm).
template <class Fn>
mtxcomm_result_t anyThread(mtxcomm_comm_t comm, Fn&& fn) {
  std::string ignored;
  return mtxcomm::capi::capture(
      [&] {
        mtxcomm::HandleLease lease(comm);
        fn(lease.comm());
      },
      &ignored);
}
}  // namespace

extern "C" {

mtxcomm_result_t mtxcomm_comm_notify(mtxcomm_comm_t comm, uint64_t cycle) {
  return guarded(comm, [&](Comm& c) { notifier(c).notify(cycle); });
}

mtxcomm_result_t mtxcomm_comm_notify_state(mtxcomm_comm_t comm, mtxcomm_notify_state_t* state) {
  if (!state) return MTXCOMM_INVALID_ARGUMENT;
  return anyThread(comm, [&](Comm& c) {
    const auto st = notifier(c).notifyState();
    state->token = st.token;
    state->cycle = st.cycle;
  });
}

mtxcomm_result_t mtxcomm_comm_wait_notify(mtxcomm_comm_t comm, const mtxcomm_notify_state_t* seen,
                                          double timeout_s, mtxcomm_notify_state_t* now) {
  return guarded(comm, [&](Comm& c) {
    if (!seen || !now) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "seen or now is NULL");
    if (!(timeout_s >= 0)) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "timeout_s is negative or NaN");
    mtxcomm::ShmGroup::NotifyState s;
    s.token = seen->token;
    s.cycle = seen->cycle;
    const double capped = std::min(timeout_s, 31536000.0);
    const auto deadline =
        mtxcomm::Clock::now() +
        std::chrono::duration_cast<mtxcomm::Clock::duration>(std::chrono::duration<double>(capped));
    const auto got = notifier(c).waitNotify(s, deadline);
    now->token = got.token;
    now->cycle = got.cycle;
  });
}

mtxcomm_result_t mtxcomm_comm_wakeup(mtxcomm_comm_t comm) {
  return anyThread(comm, [&](Comm& c) { notifier(c).wakeup(); });
}

mtxcomm_result_t mtxcomm_comm_enter_cycle(mtxcomm_comm_t comm, uint64_t cycle) {
  return guarded(comm, [&](Comm& c) { notifier(c).enterCycle(cycle); });
}

mtxcomm_result_t mtxcomm_comm_peers_in_cycle(mtxcomm_comm_t comm, uint64_t cycle, int spin,
                                             int* count) {
  if (!count) return MTXCOMM_INVALID_ARGUMENT;
  return anyThread(comm, [&](Comm& c) { *count = notifier(c).peersInCycle(cycle, spin != 0); });
}

mtxcomm_result_t mtxcomm_comm_set_idle(mtxcomm_comm_t comm, int idle) {
  return guarded(comm, [&](Comm& c) { notifier(c).setIdle(idle != 0); });
}

mtxcomm_result_t mtxcomm_comm_set_call_label(mtxcomm_comm_t comm, const char* label) {
  return guarded(comm, [&](Comm& c) { c.setNextCallLabel(label); });
}

mtxcomm_result_t mtxcomm_comm_dump_flight_recorder(mtxcomm_comm_t comm, const char* reason,
                                                   char* dir, size_t len) {
  return anyThread(comm, [&](Comm& c) {
    if (!reason || !dir || len == 0) {
      mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "reason or dir is NULL, or len is 0");
    }
    c.noteFlightRecordError(reason);  // kept by the dumps a peer's SIGUSR1 makes afterwards
    const std::string where = c.dumpFlightRecords(reason);
    if (where.size() + 1 > len) {
      mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "dir needs ", where.size() + 1, " bytes, len is ",
                    len);
    }
    std::memcpy(dir, where.c_str(), where.size() + 1);
  });
}

const char* mtxcomm_comm_last_algorithm(mtxcomm_comm_t comm) {
  return mtxcomm::lastAlgorithmOf(comm);
}

mtxcomm_result_t mtxcomm_config_get(const char* name, char* value, size_t len) {
  return guardedNoComm([&] {
    if (!name || !value) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "name or value is NULL");
    const std::string prefix = std::string(name) + "=";
    for (const std::string& kv : mtxcomm::Config::fromEnvironment().describe()) {
      if (kv.rfind(prefix, 0) != 0) continue;
      std::string v = kv.substr(prefix.size());
      if (v.size() + 1 > len) {
        mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, name, "'s value needs ", v.size() + 1,
                      " bytes, the buffer has ", len);
      }
      std::memcpy(value, v.c_str(), v.size() + 1);
      return;
    }
    mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "unknown configuration variable \"", name, "\"");
  });
}

mtxcomm_result_t mtxcomm_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                   mtxcomm_datatype_t datatype, mtxcomm_op_t op,
                                   mtxcomm_comm_t comm, void* stream) {
  CollArgs a;
  a.coll = Collective::kAllreduce;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = count, a.dtype = datatype, a.op = op;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_broadcast(const void* sendbuf, void* recvbuf, size_t count,
                                   mtxcomm_datatype_t datatype, int root, mtxcomm_comm_t comm,
                                   void* stream) {
  CollArgs a;
  a.coll = Collective::kBroadcast;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = count, a.dtype = datatype, a.root = root;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_reduce(const void* sendbuf, void* recvbuf, size_t count,
                                mtxcomm_datatype_t datatype, mtxcomm_op_t op, int root,
                                mtxcomm_comm_t comm, void* stream) {
  CollArgs a;
  a.coll = Collective::kReduce;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = count, a.dtype = datatype, a.op = op;
  a.root = root;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                   mtxcomm_datatype_t datatype, mtxcomm_comm_t comm, void* stream) {
  CollArgs a;
  a.coll = Collective::kAllgather;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = sendcount, a.dtype = datatype;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                        mtxcomm_datatype_t datatype, mtxcomm_op_t op,
                                        mtxcomm_comm_t comm, void* stream) {
  CollArgs a;
  a.coll = Collective::kReduceScatter;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = recvcount, a.dtype = datatype, a.op = op;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_alltoall(const void* sendbuf, void* recvbuf, size_t count,
                                  mtxcomm_datatype_t datatype, mtxcomm_comm_t comm, void* stream) {
  CollArgs a;
  a.coll = Collective::kAlltoall;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = count, a.dtype = datatype;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_alltoallv(const void* sendbuf, const size_t* sendcounts,
                                   const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                   const size_t* rdispls, mtxcomm_datatype_t datatype,
                                   mtxcomm_comm_t comm, void* stream) {
  CollArgs a;
  a.coll = Collective::kAlltoall;
  a.sendbuf = sendbuf, a.recvbuf = recvbuf, a.count = 0, a.dtype = datatype;
  a.vcounts = true;
  a.sendcounts = sendcounts, a.sdispls = sdispls, a.recvcounts = recvcounts, a.rdispls = rdispls;
  return collective(comm, a, stream);
}

mtxcomm_result_t mtxcomm_barrier(mtxcomm_comm_t comm) {
  CollArgs a;
  a.coll = Collective::kBarrier;
  return collective(comm, a, nullptr);
}

const char* mtxcomm_get_error_string(mtxcomm_result_t result) {
  switch (result) {
    case MTXCOMM_SUCCESS:
      return "success";
    case MTXCOMM_INVALID_ARGUMENT:
      return "invalid argument";
    case MTXCOMM_INVALID_USAGE:
      return "invalid usage";
    case MTXCOMM_SYSTEM_ERROR:
      return "system error";
    case MTXCOMM_REMOTE_ERROR:
      return "remote error (a peer failed)";
    case MTXCOMM_TIMEOUT:
      return "timeout";
    case MTXCOMM_CUDA_ERROR:
      return "CUDA error";
    case MTXCOMM_INTERNAL_ERROR:
      return "internal error";
    case MTXCOMM_UNSUPPORTED:
      return "unsupported";
  }
  return "unknown result code";
}

const char* mtxcomm_get_last_error(mtxcomm_comm_t comm) {
  // A copy of this thread's own: another thread may record a new error meanwhile.
  if (comm && mtxcomm::copyLastError(comm, &t_lastErrorCopy)) return t_lastErrorCopy.c_str();
  return threadError().c_str();
}

mtxcomm_result_t mtxcomm_get_version(int* version) {
  if (!version) {
    threadError() = "version (the output pointer) is NULL";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  *version = MTXCOMM_VERSION_CODE;
  return MTXCOMM_SUCCESS;
}

mtxcomm_result_t mtxcomm_get_nccl_version(int* version) {
  if (!version) {
    threadError() = "version is NULL";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  std::string why;
  *version = mtxcomm::gpu::ncclLoadedVersion(&why);
  if (*version == 0) {
    threadError() = why;
    return MTXCOMM_UNSUPPORTED;
  }
  return MTXCOMM_SUCCESS;
}

mtxcomm_result_t mtxcomm_get_build_feature(const char* feature, int* built) {
  if (!feature || !built) {
    threadError() = std::string(!feature ? "feature" : "built") + " is NULL";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  // CMake writes each component's state as ON/OFF, TRUE/FALSE or 1/0 (mtxcomm_build_info.h).
  auto on = [](const char* v) {
    std::string s(v);
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s == "1" || s == "ON" || s == "TRUE" || s == "YES";
  };
  static const std::pair<const char*, const char*> kFeatures[] = {
      {"mpi", MTXCOMM_BUILD_WITH_MPI},
      {"ucx", MTXCOMM_BUILD_WITH_UCX},
      {"cuda", MTXCOMM_BUILD_WITH_CUDA},
      {"nccl", MTXCOMM_BUILD_WITH_NCCL},
      {"hwloc", MTXCOMM_BUILD_WITH_HWLOC}};
  for (const auto& [name, value] : kFeatures) {
    if (std::strcmp(name, feature) == 0) {
      *built = on(value) ? 1 : 0;
      return MTXCOMM_SUCCESS;
    }
  }
  threadError() =
      std::string("unknown build feature '") + feature + "' (known: mpi, ucx, cuda, nccl, hwloc)";
  return MTXCOMM_INVALID_ARGUMENT;
}

size_t mtxcomm_datatype_size(mtxcomm_datatype_t datatype) {
  return mtxcomm::datatypeSize(datatype);
}

}  // extern "C"
