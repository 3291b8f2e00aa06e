// The registry of live C handles (lib/comm/c_api.h, "Handles") and the lease an entry point
// holds on one while it runs.
//
// A lease holds a live handle: the Comm stays until the lease ends. Two ways to hold it. The
// slow way: under the registry's lock, look the handle up and take a reference (refs);
// retireHandle() waits for the last. The fast way, for a thread calling on the same handle as its
// last call and with no lease of its own open: publish the handle in the thread's hazard slot,
// then check that no handle was retired since that thread's last slow lease (the retire epoch).
// No locked instruction: a small collective's whole call costs about as much as one of them.
// retireHandle() bumps the epoch, issues membarrier(2)'s private expedited barrier, then waits
// until no hazard slot holds the handle: either the slot's store is visible to it, or the
// thread's load of the epoch sees the bump and it takes the slow way, which finds the handle gone
// (hazard pointers, M. Michael, IEEE TPDS 2004, with membarrier's asymmetric fence in place of
// the reader's). Without membarrier every lease takes the slow way.
//
// fork(): the child has only the forking thread, and the parent's communicators are the
// parent's (their peers, sockets and shared segments). In the child every call on one of them
// is MTXCOMM_INVALID_USAGE, retiring one forgets it without touching what the parent still
// uses, the other threads' hazard slots are freed and every fast lease's cache is stale
// (handle_registry.cc, the fork handlers).
//
// The fast path of a lease is inline here (the C API's every call takes one); the rest is
// handle_registry.cc.
#ifndef MTXCOMM_LIB_COMM_HANDLE_REGISTRY_H_
#define MTXCOMM_LIB_COMM_HANDLE_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "lib/comm/c_api.h"

namespace mtxcomm {

// One thread's hazard slot (slots are never freed; a thread gives its slot back at exit).
struct alignas(64) HazardSlot {
  std::atomic<const mtxcomm_comm*> hazard{nullptr};
  bool owned = false;  // a thread has it (under the registry's lock)
};

// This thread's fast-lease state; trivially constructed, so its access costs no guard.
struct FastLeaseCache {
  HazardSlot* slot;            // this thread's hazard slot, once it has one
  const mtxcomm_comm* handle;  // live at the epoch below (checked under the registry's lock)
  uint64_t epoch;              // 0: no fast lease until the next slow one
  bool open;                   // a fast lease of this thread holds the slot
};
inline thread_local FastLeaseCache t_fastLease{};
inline std::atomic<uint64_t> g_retireEpoch{1};  // bumped under the registry's lock by each retire

class HandleLease {
 public:
  // Throws MTXCOMM_INVALID_ARGUMENT for a handle that is not live, MTXCOMM_INVALID_USAGE for
  // one of the process that forked this one.
  explicit HandleLease(mtxcomm_comm_t comm) : h_(comm) {
    FastLeaseCache& f = t_fastLease;
    if (comm && comm == f.handle && !f.open && f.epoch != 0) {
      f.slot->hazard.store(comm, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // retireHandle()'s membarrier orders it
      if (g_retireEpoch.load(std::memory_order_acquire) == f.epoch) {
        f.open = true;
        fast_ = &f;
        return;
      }
      f.slot->hazard.store(nullptr, std::memory_order_relaxed);
    }
    acquireSlow(comm);
  }
  ~HandleLease() {
    if (fast_) {
      fast_->open = false;
      fast_->slot->hazard.store(nullptr, std::memory_order_release);
      return;
    }
    releaseSlow();
  }
  HandleLease(const HandleLease&) = delete;
  HandleLease& operator=(const HandleLease&) = delete;
  Comm& comm() const { return *h_->impl; }

 private:
  void acquireSlow(mtxcomm_comm_t comm);  // under the registry's lock: a reference
  void releaseSlow();

  mtxcomm_comm_t h_;
  FastLeaseCache* fast_ = nullptr;  // this thread's cache, for a fast lease
};

// Why comm is not a live handle, for messages.
const char* notLiveReason(mtxcomm_comm_t comm);

// Removes a live handle from the registry and frees it once no call is running on it; a call
// in flight (another thread) is cancelled with reason first. `last` runs on the Comm once no
// call runs on it, just before it is freed. NULL and handles that are not live are rejected
// (false). The handle of a process that forked this one is forgotten, not freed (freeing it
// would close the parent's sockets and mark its rank gone in the shared segment); `last` does
// not run for it.
bool retireHandle(mtxcomm_comm_t comm, const char* reason, const std::function<void(Comm&)>& last);

// Stores message as comm's last error when comm is still live; false otherwise.
bool recordLastError(mtxcomm_comm_t comm, const std::string& message);
// Copies comm's last error into *out when comm is live and of this process (a forked child's
// record of its parent's communicators is its own: their lock may be held by a thread the
// child does not have); false otherwise.
bool copyLastError(mtxcomm_comm_t comm, std::string* out);
// The name of the algorithm of comm's last call (static), or "" when comm is not live.
const char* lastAlgorithmOf(mtxcomm_comm_t comm);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_HANDLE_REGISTRY_H_
