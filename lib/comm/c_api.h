// Internal helpers around the C handle: tests and tools wrap Comm objects (e.g. in-process
// ranks) into mtxcomm_comm_t so they go through the real C API.
//
// Handles. Every handle made here is in a registry of live handles; each entry point looks its
// argument up there before touching it, so a destroyed, never-made or garbage handle is
// MTXCOMM_INVALID_ARGUMENT, never a crash (a new handle at the address of a destroyed one is
// indistinguishable from it). A call holds a lease on the Comm for its duration (a reference, or
// for a thread's repeated calls on one handle a hazard slot checked against the retire epoch
// without a lock: lib/comm/handle_registry.h, HandleLease); destroy and abort from another thread
// cancel the call in flight (lib/base/cancel.h), wait for it to return, and only then free the
// Comm.
#ifndef MTXCOMM_LIB_C_API_H_
#define MTXCOMM_LIB_C_API_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "lib/comm/comm.h"
#include "mtxcomm/mtxcomm.h"

struct mtxcomm_comm {
  std::unique_ptr<mtxcomm::Comm> impl;
  // References: 1 for the registry of live handles, 1 per entry point running on the handle
  // through a slow lease (handle_registry.h, HandleLease; fast leases are hazard slots), dropped
  // without a lock. retireHandle() drops the registry's; whoever drops the last one while calls
  // were in flight sets drained and signals idle under mu, and retireHandle() frees the handle
  // once drained (or at once when no call was in flight).
  std::atomic<int> refs{1};
  pid_t ownerPid = 0;            // the process that made it: a child made by fork() cannot use it
  std::mutex mu;                 // guards lastError and drained
  std::condition_variable idle;  // signalled when the last call in flight of a retired handle ends
  bool drained = false;
  std::string lastError;
};

namespace mtxcomm {
// Registers a new handle for c.
mtxcomm_comm_t wrapComm(std::unique_ptr<Comm> c);
// The Comm of a live handle, or nullptr (tests and tools; no lease).
Comm* unwrapComm(mtxcomm_comm_t c);
}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_C_API_H_
