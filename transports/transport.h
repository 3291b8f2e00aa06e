// The point-to-point transport interface every collective algorithm runs over.
//
// Contract
// --------
// - Addressing: peers are ranks in [0, size()) of this transport (which covers exactly the
//   ranks of one communicator). A rank never sends to itself: algorithms copy locally instead.
// - Matching and ordering: a receive matches a send from the same peer with the same tag.
//   Messages between one sender and one receiver with the same tag are matched in the order
//   they were posted (MPI's non-overtaking rule). The byte counts of a matched send and receive
//   must be equal; a mismatch is MTXCOMM_INTERNAL_ERROR (the ranks disagree on the schedule).
//   Tags are in [0, kMaxTag]. Zero-byte messages are legal and are delivered.
// - Buffer ownership: isend/irecv return at once; the buffer belongs to the transport until the
//   request completes in waitAll. The sender must not write it, the receiver must not read it.
// - Progress: made inside waitAll (a transport may also progress in background threads).
//   Waiting is polite: spin briefly, then yield/sleep, never burn a core until the deadline.
// - Errors: waitAll throws mtxcomm::Error — MTXCOMM_REMOTE_ERROR when a peer is known to be
//   gone (closed connection, dead process, abort), MTXCOMM_TIMEOUT when the deadline passes,
//   MTXCOMM_SYSTEM_ERROR for a local failure. The message names the peer ("peer rank 3") and
//   whether it was a send or a receive; the caller adds rank, collective and algorithm. After an
//   error the transport is failed: later calls may throw again; the requests are abandoned and
//   their buffers are no longer touched once waitAll has thrown.
// - Polling: testAll makes progress once without blocking and releases (resets to null) every
//   request of reqs that has completed; it returns whether none is left. A request that is
//   merely not done yet is never an error (there is no deadline: the caller keeps its own), but
//   testAll throws as waitAll does for what is known to have failed: a peer gone or aborted, a
//   size mismatch, the token cancelled; the transport is then failed as after waitAll. It is for
//   callers that progress many requests at once and complete them one by one (the communicator's
//   point-to-point thread, lib/comm/p2p.h); the caller waits politely between calls.
// - Cancellation: waitAll checks the transport's CancelToken (setCancelToken) at least every
//   50 ms and throws its MTXCOMM_INVALID_USAGE once another thread cancelled it.
// - Thread safety: one thread at a time calls a given Transport object. Distinct transports
//   (also those made by split()) may be used from distinct threads concurrently. The token may
//   be cancelled from any thread.
#ifndef MTXCOMM_TRANSPORTS_TRANSPORT_H_
#define MTXCOMM_TRANSPORTS_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/base/cancel.h"
#include "lib/base/clock.h"
#include "lib/base/wait_record.h"

namespace mtxcomm {

// A posted send or receive. Transports derive from it; the caller only holds it and passes it
// back to waitAll.
class Request {
 public:
  Request(int peer, bool is_send, size_t bytes) : peer_(peer), is_send_(is_send), bytes_(bytes) {}
  virtual ~Request() = default;
  int peer() const { return peer_; }
  bool isSend() const { return is_send_; }
  size_t bytes() const { return bytes_; }
  // A receive the caller can do without (set by it before testAll): a transport that can tell
  // it apart (shared memory) neither fails it nor throws when its peer has left (destroyed its
  // communicator); it stays pending. A peer that died or aborted still fails it. The
  // user-message channel sets it on the receives only receives from any source wait for, so
  // that a peer that has left is simply not a candidate.
  bool optional = false;

 private:
  int peer_;
  bool is_send_;
  size_t bytes_;
};
using RequestPtr = std::unique_ptr<Request>;

// What a transport may offer a thread that progresses it with testAll and sleeps between
// rounds (the communicator's user-message thread, lib/comm/p2p.h): a word that changes whenever
// something may have arrived for this rank, and a sleep that ends when it does. The thread reads
// activitySeen() before a round and, if nothing moved, calls waitActivity with that value: it
// returns at once if the word changed meanwhile, else when a peer (or wake()) changes it, or
// after atMost. wake() may be called from any thread. Transports without it: the thread sleeps
// in fixed steps.
class ActivityWaiter {
 public:
  virtual ~ActivityWaiter() = default;
  virtual uint32_t activitySeen() const = 0;
  virtual void waitActivity(uint32_t seen, Clock::duration atMost) = 0;
  virtual void wake() = 0;
};

class Transport {
 public:
  static constexpr int kMaxTag = 32767;  // MPI guarantees at least this MPI_TAG_UB

  virtual ~Transport() = default;
  // Stable name: "inproc", "mpi", "tcp".
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual RequestPtr isend(int peer, int tag, const void* buf, size_t bytes) = 0;
  virtual RequestPtr irecv(int peer, int tag, void* buf, size_t bytes) = 0;
  // Completes every request in reqs (entries may be null and are skipped), or throws as the
  // contract says once the deadline has passed or a peer is gone.
  virtual void waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) = 0;
  // One round of progress, without blocking: releases (sets to null) the entries of reqs that
  // have completed and returns true when every entry is null. Throws as the contract says for a
  // known failure, never for a request that is simply not done yet.
  virtual bool testAll(std::vector<RequestPtr>& reqs) = 0;

  // A transport over a subset of this one's ranks. members[i] is the rank, in this transport,
  // of rank i of the new one; it contains rank(). context_id is the same on every member and
  // distinct from every other live transport sharing the same channels. Collective over the
  // members only (ranks not in members do not call it).
  virtual std::unique_ptr<Transport> split(const std::vector<int>& members,
                                           uint64_t context_id) = 0;

  // Best-effort notice to the peers of this transport that this rank has left abnormally
  // (reason: why, e.g. the error it saw), so that their blocked waits end with
  // MTXCOMM_REMOTE_ERROR naming this rank (and the reason, where the transport can carry it)
  // instead of a timeout. Never blocks for long. Default: nothing to tell.
  virtual void abort(const std::string& reason) {}

  // The token waitAll checks (lib/base/cancel.h); set by the communicator before any call. A
  // transport over others (route) passes it on.
  virtual void setCancelToken(CancelTokenPtr token) { cancel_ = std::move(token); }
  // The flight recorder's word for the peer the call in progress waits on (lib/comm/
  // flight_recorder.h; null: none): the wait loops note it once they stop spinning.
  void setWaitRecord(WaitRecord* record) { waitRecord_ = record; }

 protected:
  // Throws once the token is cancelled; for the wait loops.
  void checkCancelled() const {
    if (cancel_) cancel_->check();
  }
  // A wait loop that has stopped spinning waits on peer.
  void noteWaitingOn(int peer) const {
    if (waitRecord_) waitRecord_->note(peer);
  }

 private:
  CancelTokenPtr cancel_;
  WaitRecord* waitRecord_ = nullptr;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_TRANSPORT_H_
