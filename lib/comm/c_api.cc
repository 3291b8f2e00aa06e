// The C API boundary: every entry point checks its handle, runs the call and turns exceptions
// into a result code plus the communicator's last error. Nothing here throws.
#include "lib/comm/c_api.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/comm/config.h"
#include "lib/comm/init.h"
#include "mtxcomm/mtxcomm.h"
#ifdef MTXCOMM_HAVE_MPI
#include "mtxcomm/mtxcomm_mpi.h"
#endif

using mtxcomm::CollArgs;
using mtxcomm::Collective;
using mtxcomm::Comm;
using mtxcomm::Error;

namespace {

thread_local std::string t_lastInitError;

// Runs fn; on failure records the message where mtxcomm_get_last_error(comm) finds it.
template <class Fn>
mtxcomm_result_t guarded(mtxcomm_comm_t comm, Fn&& fn) {
  std::string* sink = comm && comm->impl ? &comm->impl->lastError() : &t_lastInitError;
  try {
    fn();
    return MTXCOMM_SUCCESS;
  } catch (const Error& e) {
    *sink = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    *sink = "out of memory";
    return MTXCOMM_SYSTEM_ERROR;
  } catch (const std::exception& e) {
    *sink = std::string("internal error: ") + e.what();
    return MTXCOMM_INTERNAL_ERROR;
  } catch (...) {
    *sink = "internal error: unknown exception";
    return MTXCOMM_INTERNAL_ERROR;
  }
}

Comm& checked(mtxcomm_comm_t comm) {
  if (!comm || !comm->impl) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "comm is NULL");
  return *comm->impl;
}

mtxcomm_result_t collective(mtxcomm_comm_t comm, const CollArgs& args, void* stream) {
  if (!comm) {
    t_lastInitError = "comm is NULL";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  return guarded(comm, [&] {
    CollArgs a = args;
    a.stream = stream;  // device buffers: gpu/device.h
    checked(comm).run(a);
  });
}

}  // namespace

extern "C" {

mtxcomm_result_t mtxcomm_comm_init_from_env(mtxcomm_comm_t* comm) {
  return guarded(nullptr, [&] {
    if (!comm) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "comm (the output pointer) is NULL");
    *comm = nullptr;
    *comm = mtxcomm::wrapComm(mtxcomm::initFromEnv());
  });
}

#ifdef MTXCOMM_HAVE_MPI
mtxcomm_result_t mtxcomm_comm_init_mpi(MPI_Comm mpiComm, mtxcomm_comm_t* comm) {
  return guarded(nullptr, [&] {
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
  if (!comm) {
    t_lastInitError = "comm is NULL";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  return guarded(comm, [&] {
    if (!newcomm) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "newcomm (the output pointer) is NULL");
    *newcomm = nullptr;
    auto child = checked(comm).split(color, key);
    if (child) *newcomm = mtxcomm::wrapComm(std::move(child));
  });
}

mtxcomm_result_t mtxcomm_comm_destroy(mtxcomm_comm_t comm) {
  delete comm;
  return MTXCOMM_SUCCESS;
}

mtxcomm_result_t mtxcomm_comm_abort(mtxcomm_comm_t comm) {
  if (!comm) return MTXCOMM_SUCCESS;
  try {
    if (comm->impl) comm->impl->abort();
  } catch (...) {
    // Best effort: the communicator is going away regardless.
  }
  delete comm;
  return MTXCOMM_SUCCESS;
}

mtxcomm_result_t mtxcomm_comm_rank(mtxcomm_comm_t comm, int* rank) {
  return guarded(comm, [&] {
    Comm& c = checked(comm);
    if (!rank) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "rank (the output pointer) is NULL");
    *rank = c.rank();
  });
}

mtxcomm_result_t mtxcomm_comm_size(mtxcomm_comm_t comm, int* size) {
  return guarded(comm, [&] {
    Comm& c = checked(comm);
    if (!size) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "size (the output pointer) is NULL");
    *size = c.size();
  });
}

mtxcomm_result_t mtxcomm_comm_local_rank(mtxcomm_comm_t comm, int* local_rank) {
  return guarded(comm, [&] {
    Comm& c = checked(comm);
    if (!local_rank) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "local_rank (the output) is NULL");
    *local_rank = c.localRank();
  });
}

mtxcomm_result_t mtxcomm_comm_local_size(mtxcomm_comm_t comm, int* local_size) {
  return guarded(comm, [&] {
    Comm& c = checked(comm);
    if (!local_size) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "local_size (the output) is NULL");
    *local_size = c.localSize();
  });
}

mtxcomm_result_t mtxcomm_comm_cpu_share(mtxcomm_comm_t comm, int* cores) {
  return guarded(comm, [&] {
    Comm& c = checked(comm);
    if (!cores) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "cores (the output pointer) is NULL");
    *cores = c.cpuShare();
  });
}

namespace {
mtxcomm::ShmGroup& notifier(mtxcomm_comm_t comm) {
  mtxcomm::ShmGroup* shm = checked(comm).notifier();
  if (!shm) {
    mtxcomm::fail(MTXCOMM_UNSUPPORTED,
                  "notifications need every rank of the communicator on one node with a "
                  "shared-memory segment (MTXCOMM_SHM=auto)");
  }
  return *shm;
}
}  // namespace

mtxcomm_result_t mtxcomm_comm_notify(mtxcomm_comm_t comm, uint64_t cycle) {
  return guarded(comm, [&] { notifier(comm).notify(cycle); });
}

mtxcomm_result_t mtxcomm_comm_notify_state(mtxcomm_comm_t comm, mtxcomm_notify_state_t* state) {
  // Any thread: no last-error record (another thread may be using comm).
  if (!comm || !comm->impl || !state) return MTXCOMM_INVALID_ARGUMENT;
  mtxcomm::ShmGroup* shm = comm->impl->notifier();
  if (!shm) return MTXCOMM_UNSUPPORTED;
  const auto st = shm->notifyState();
  state->token = st.token;
  state->cycle = st.cycle;
  return MTXCOMM_SUCCESS;
}

mtxcomm_result_t mtxcomm_comm_wait_notify(mtxcomm_comm_t comm, const mtxcomm_notify_state_t* seen,
                                          double timeout_s, mtxcomm_notify_state_t* now) {
  return guarded(comm, [&] {
    if (!seen || !now) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "seen or now is NULL");
    if (!(timeout_s >= 0)) mtxcomm::fail(MTXCOMM_INVALID_ARGUMENT, "timeout_s is negative or NaN");
    mtxcomm::ShmGroup::NotifyState s;
    s.token = seen->token;
    s.cycle = seen->cycle;
    const double capped = std::min(timeout_s, 31536000.0);
    const auto deadline =
        mtxcomm::Clock::now() +
        std::chrono::duration_cast<mtxcomm::Clock::duration>(std::chrono::duration<double>(capped));
    const auto got = notifier(comm).waitNotify(s, deadline);
    now->token = got.token;
    now->cycle = got.cycle;
  });
}

mtxcomm_result_t mtxcomm_comm_wakeup(mtxcomm_comm_t comm) {
  if (!comm || !comm->impl) return MTXCOMM_INVALID_ARGUMENT;
  mtxcomm::ShmGroup* shm = comm->impl->notifier();
  if (!shm) return MTXCOMM_UNSUPPORTED;
  shm->wakeup();
  return MTXCOMM_SUCCESS;
}

const char* mtxcomm_comm_last_algorithm(mtxcomm_comm_t comm) {
  if (!comm || !comm->impl) return "";
  return comm->impl->lastAlgorithm().c_str();
}

mtxcomm_result_t mtxcomm_config_get(const char* name, char* value, size_t len) {
  return guarded(nullptr, [&] {
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
  if (comm && comm->impl) return comm->impl->lastError().c_str();
  return t_lastInitError.c_str();
}

mtxcomm_result_t mtxcomm_get_version(int* version) {
  if (!version) {
    t_lastInitError = "version (the output pointer) is NULL";
    return MTXCOMM_INVALID_ARGUMENT;
  }
  *version = MTXCOMM_VERSION_CODE;
  return MTXCOMM_SUCCESS;
}

size_t mtxcomm_datatype_size(mtxcomm_datatype_t datatype) {
  return mtxcomm::datatypeSize(datatype);
}

}  // extern "C"
