// A ShmGroup's abort and the peers' liveness: a rank's abort flag and reason for its peers'
// waits, whether a peer's process is gone, the error a failed wait throws (a timeout, a peer
// that aborted, left or died), and the flight recorder's requests to the peers' processes.
// The waits themselves: shm_wait.h.
#include "transports/shm/shm_wait.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "transports/shm/shm_group.h"
#include "transports/shm/shm_segment.h"

namespace mtxcomm {

void ShmGroup::abort(const std::string& reason, mtxcomm_result_t code) {
  Control& c = control(rank_);
  // The first abort's reason stands: a later one (the application aborting after the error it
  // was given) must not hide the root cause from peers that have not read it yet.
  if (c.aborted.load(std::memory_order_acquire)) return;
  // Peers learn the root cause: if this rank failed because another one did, pass that on
  // rather than a message nesting every hop.
  std::snprintf(c.reason, sizeof(c.reason), "%s",
                rootCause_.empty() ? reason.c_str() : rootCause_.c_str());
  c.abortCode.store(rootCause_.empty() ? code : rootCode_, std::memory_order_relaxed);
  c.aborted.store(1, std::memory_order_release);
  publishedFenced(c);  // maybe from another thread than the one running this rank's calls
}

bool ShmGroup::peerProcessGone(int q) const {
  const pid_t pid = static_cast<pid_t>(control(q).pid.load(std::memory_order_relaxed));
  const pid_t self = static_cast<pid_t>(control(rank_).pid.load(std::memory_order_relaxed));
  return pid > 0 && pid != self && processGone(pid);
}

void ShmGroup::failPeer(int peer, const char* what, bool timedOut) {
  if (timedOut) {
    fail(MTXCOMM_TIMEOUT, "timed out after ", timeoutSeconds_, " s in ", what,
         " waiting for peer rank ", peer, " (shared memory)");
  }
  Control& c = control(peer);
  if (c.aborted.load(std::memory_order_acquire)) {
    // A peer that saw a disagreement on this call first aborts; this rank names the
    // disagreement too (MTXCOMM_INVALID_USAGE), not the abort it caused.
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) checkPeerCall(q);
    }
    // A disagreement only the aborting peer could see (alltoallv's per-pair counts are not in
    // the call signature) is this rank's invalid usage too: the code travels with the reason.
    rootCause_ = c.reason;
    rootCode_ = c.abortCode.load(std::memory_order_relaxed) == MTXCOMM_INVALID_USAGE
                    ? MTXCOMM_INVALID_USAGE
                    : MTXCOMM_REMOTE_ERROR;
    fail(rootCode_, "peer rank ", peer, " aborted: ", c.reason, " (while this rank ", "was in ",
         what, ")");
  }
  if (c.left.load(std::memory_order_acquire)) {
    rootCause_ = strCat("rank ", peer, " destroyed its communicator after call #",
                        c.callSeq.load(std::memory_order_acquire));
    fail(MTXCOMM_REMOTE_ERROR, "peer ", rootCause_, " while this rank was in ", what, " (call #",
         call_.seq, ")");
  }
  rootCause_ = strCat("rank ", peer, " (pid ", c.pid.load(), ", on this node) has exited");
  fail(MTXCOMM_REMOTE_ERROR, "peer ", rootCause_, " while this rank was in ", what,
       " (shared memory)");
}

void ShmGroup::setDumpsOnSigusr1(bool yes) {
  control(rank_).dumpsOnSigusr1.store(yes ? 1 : 0, std::memory_order_release);
}

void ShmGroup::askPeersToDump() const {
  const pid_t self = getpid();
  for (int q = 0; q < size_; ++q) {
    const Control& c = control(q);
    const auto pid = static_cast<pid_t>(c.pid.load(std::memory_order_acquire));
    if (q == rank_ || pid <= 0 || pid == self || c.left.load(std::memory_order_acquire) ||
        !c.dumpsOnSigusr1.load(std::memory_order_acquire)) {
      continue;
    }
    ::kill(pid, SIGUSR1);  // best effort: a peer gone meanwhile is no error
  }
}

}  // namespace mtxcomm
