// The registry of live C handles and the leases on them (handle_registry.h).
#include "lib/comm/handle_registry.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/membarrier.h"

namespace mtxcomm {
namespace {

std::mutex g_handlesMu;
std::unordered_set<const mtxcomm_comm*>& liveHandles() {
  static auto* live = new std::unordered_set<const mtxcomm_comm*>();  // never destroyed: atexit
  return *live;
}

std::vector<HazardSlot*>& hazardSlots() {  // under g_handlesMu; slots are never freed
  static auto* slots = new std::vector<HazardSlot*>();
  return *slots;
}

// Gives the thread's slot back when the thread ends.
struct HazardSlotOwner {
  ~HazardSlotOwner() {
    if (!t_fastLease.slot) return;
    std::lock_guard<std::mutex> g(g_handlesMu);
    t_fastLease.slot->hazard.store(nullptr, std::memory_order_release);
    t_fastLease.slot->owned = false;
    t_fastLease.slot = nullptr;
    t_fastLease.epoch = 0;
  }
};

// This thread's slot, taken under g_handlesMu (held by the caller); nullptr when the process
// cannot issue the asymmetric barrier.
HazardSlot* hazardSlotLocked() {
  if (t_fastLease.slot) return t_fastLease.slot;
  if (!registerPrivateMembarrier()) return nullptr;
  thread_local HazardSlotOwner owner;  // registers the release at thread exit
  (void)owner;
  for (HazardSlot* s : hazardSlots()) {
    if (!s->owned) {
      s->owned = true;
      return t_fastLease.slot = s;
    }
  }
  hazardSlots().push_back(new HazardSlot());
  hazardSlots().back()->owned = true;
  return t_fastLease.slot = hazardSlots().back();
}

// fork() (handle_registry.h): the registry's and the log's locks are held across fork(), so
// the child gets them free.
pid_t g_pid = getpid();  // this process (set again in a forked child, under g_handlesMu)

void forkPrepare() {
  g_handlesMu.lock();
  lockLogForFork();  // a leaf lock: taken last
}
void forkParent() {
  unlockLogAfterFork();
  g_handlesMu.unlock();
}
void forkChild() {
  unlockLogAfterFork();
  g_pid = getpid();
  for (HazardSlot* s : hazardSlots()) {
    if (s == t_fastLease.slot) continue;
    s->hazard.store(nullptr, std::memory_order_relaxed);
    s->owned = false;
  }
  g_retireEpoch.fetch_add(1, std::memory_order_relaxed);
  g_handlesMu.unlock();
}
const int g_forkHandlers = pthread_atfork(forkPrepare, forkParent, forkChild);
// Built when the library loads, before any thread could be inside their initialization at a
// fork().
const bool g_registriesBuilt = liveHandles().empty() && hazardSlots().empty();

// Whether a fast lease of another thread may still hold comm (retireHandle(), after its
// barrier).
bool hazardHolds(const mtxcomm_comm* comm) {
  std::lock_guard<std::mutex> g(g_handlesMu);
  for (const HazardSlot* s : hazardSlots()) {
    if (s->hazard.load(std::memory_order_acquire) == comm) return true;
  }
  return false;
}

}  // namespace

const char* notLiveReason(mtxcomm_comm_t comm) {
  return comm ? "comm is not a live communicator (destroyed already, or not made by "
                "mtxcomm_comm_init_*/mtxcomm_comm_split)"
              : "comm is NULL";
}

void HandleLease::acquireSlow(mtxcomm_comm_t comm) {
  // Taken under the registry's lock: once retireHandle() has taken the handle out of the
  // registry, no call can start on it.
  std::lock_guard<std::mutex> g(g_handlesMu);
  if (!comm || !liveHandles().count(comm)) fail(MTXCOMM_INVALID_ARGUMENT, notLiveReason(comm));
  if (comm->ownerPid != g_pid) {
    fail(MTXCOMM_INVALID_USAGE, "this communicator belongs to process ", comm->ownerPid,
         ", which forked this one (pid ", g_pid,
         "): a child cannot use its parent's communicators (make new ones in the "
         "child; destroy forgets the parent's without touching it)");
  }
  comm->refs.fetch_add(1, std::memory_order_relaxed);
  if (!t_fastLease.open && hazardSlotLocked()) {
    t_fastLease.handle = comm;
    t_fastLease.epoch = g_retireEpoch.load(std::memory_order_relaxed);
  }
}

void HandleLease::releaseSlow() {
  // The last reference of a retired handle: its retireHandle() waits for this.
  if (h_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> l(h_->mu);
    h_->drained = true;
    h_->idle.notify_all();
  }
}

bool retireHandle(mtxcomm_comm_t comm, const char* reason, const std::function<void(Comm&)>& last) {
  {
    std::lock_guard<std::mutex> g(g_handlesMu);
    if (!comm || !liveHandles().erase(comm)) return false;
    g_retireEpoch.fetch_add(1, std::memory_order_release);
    if (comm->ownerPid != g_pid) {
      // The parent's (this is a forked child): forgotten, not freed.
      (void)comm->impl.release();
      return true;
    }
  }
  // Fast leases: after the barrier, a thread either shows its hazard here or sees the new
  // epoch. Without the barrier (refused: a forked child) give a store time to land.
  if (!privateMembarrier()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool slowHeld = comm->refs.fetch_sub(1, std::memory_order_acq_rel) != 1;
  if (slowHeld || hazardHolds(comm)) {
    // Calls in flight (other threads): cancel them, and wait until the last one has ended.
    if (comm->impl) comm->impl->cancel(reason);
    if (slowHeld) {
      std::unique_lock<std::mutex> l(comm->mu);
      comm->idle.wait(l, [&] { return comm->drained; });
    }
    while (hazardHolds(comm)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (comm->impl) last(*comm->impl);
  delete comm;
  return true;
}

bool recordLastError(mtxcomm_comm_t comm, const std::string& message) {
  std::lock_guard<std::mutex> g(g_handlesMu);
  if (!liveHandles().count(comm)) return false;
  std::lock_guard<std::mutex> l(comm->mu);
  comm->lastError = message;
  return true;
}

bool copyLastError(mtxcomm_comm_t comm, std::string* out) {
  std::lock_guard<std::mutex> g(g_handlesMu);
  if (!liveHandles().count(comm) || comm->ownerPid != g_pid) return false;
  std::lock_guard<std::mutex> l(comm->mu);
  *out = comm->lastError;
  return true;
}

const char* lastAlgorithmOf(mtxcomm_comm_t comm) {
  // Read under the registry's lock: a handle destroyed on another thread is not freed meanwhile
  // (retireHandle() takes it out of the registry first). The name is static.
  std::lock_guard<std::mutex> g(g_handlesMu);
  if (!comm || !liveHandles().count(comm)) return "";
  return comm->impl->lastAlgorithmName();
}

mtxcomm_comm_t wrapComm(std::unique_ptr<Comm> c) {
  auto* h = new mtxcomm_comm();
  h->impl = std::move(c);
  std::lock_guard<std::mutex> g(g_handlesMu);
  h->ownerPid = g_pid;
  liveHandles().insert(h);
  return h;
}

Comm* unwrapComm(mtxcomm_comm_t c) {
  std::lock_guard<std::mutex> g(g_handlesMu);
  return c && liveHandles().count(c) ? c->impl.get() : nullptr;
}

}  // namespace mtxcomm
