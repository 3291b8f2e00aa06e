#include "transports/mpi/mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "lib/base/auth.h"
#include "lib/base/backoff.h"
#include "lib/base/error.h"
#include "lib/base/liveness.h"

namespace mtxcomm {

namespace {

constexpr size_t kMaxChunk = size_t{1} << 30;

// abort(): an ABORT message to every peer on this reserved tag, above every tag of the transport
// (Transport::kMaxTag); each transport keeps a receive for it posted (any source), which waits
// test in their slow path. Payload: the communicator's instance id (below), then the reason,
// cut so that the whole stays under every Open MPI transport's eager limit (4 KiB for shared
// memory): it leaves at once, without the receiver's help, even if the aborting rank exits.
constexpr int kAbortTag = Transport::kMaxTag + 1;
constexpr size_t kMaxAbortReason = 1024;
// Which instance of a communicator an ABORT is for: a random number every member agrees on when
// the transport is made. An ABORT that reaches a rank after it has freed the communicator (a
// healthy one, destroyed while a peer failed: a failed one is kept, see ~MpiTransport) may be
// matched by a later one that reuses the context (Open MPI keeps messages for an unknown context
// until a communicator takes it): such an ABORT carries another id and is ignored.
using InstanceId = uint64_t;

InstanceId randomInstanceId() {
  const Nonce n = randomNonce();
  InstanceId id = 0;
  std::memcpy(&id, n.data(), sizeof(id));
  return id;
}

std::string mpiErrorString(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return strCat("MPI error ", code);
  return std::string(buf, len);
}

bool mpiFinalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

class MpiRequest : public Request {
 public:
  MpiRequest(int peer, bool isSend, size_t bytes, int tag)
      : Request(peer, isSend, bytes), tag(tag) {}
  ~MpiRequest() override {
    if (mpiFinalized()) return;
    for (MPI_Request& r : chunks) {
      if (r == MPI_REQUEST_NULL) continue;
      // Abandoned after a failed wait: cancel receives so they never write their buffer;
      // sends are released (their buffers are the caller's problem no more once MPI lets go).
      if (!isSend()) MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }
  int tag;
  std::vector<MPI_Request> chunks;
};

class MpiTransport : public Transport {
 public:
  MpiTransport(MPI_Comm comm, PeerLiveness liveness, InstanceId instance)
      : comm_(comm), liveness_(std::move(liveness)), instance_(instance) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // MPI guarantees tags up to 32767 only (Open MPI and MPICH allow far more): without room
    // for the reserved tag, abort() tells nobody and the peers fail at their timeout.
    void* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
    abortable_ = found && *static_cast<int*>(ub) >= kAbortTag && size_ > 1;
    if (abortable_) postAbortReceive();
  }
  ~MpiTransport() override {
    if (mpiFinalized()) return;
    if (abortRecv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&abortRecv_);
      MPI_Request_free(&abortRecv_);
    }
    for (MPI_Request& r : abortSends_) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // an eager send completes on its own
    }
    // A failed communicator is not freed: its peers may still send to it (their ABORT, the
    // messages of the call that failed). Open MPI keeps a message for a context it no longer
    // knows and hands it to the next communicator that reuses the context, whose matching it
    // then derails (seen: MPI_Allreduce on MPI_COMM_WORLD hung after a second communicator had
    // been made and freed, tests/mp/mp_abort.cc). One MPI communicator per failed mtxcomm
    // communicator is the price.
    if (comm_ != MPI_COMM_NULL && failed_.empty()) MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  RequestPtr isend(int peer, int tag, const void* buf, size_t bytes) override {
    return post(true, peer, tag, const_cast<void*>(buf), bytes);
  }
  RequestPtr irecv(int peer, int tag, void* buf, size_t bytes) override {
    return post(false, peer, tag, buf, bytes);
  }

  void waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) override {
    checkHealthy();
    for (RequestPtr& r : reqs) {
      if (!r) continue;
      auto* req = static_cast<MpiRequest*>(r.get());
      Backoff backoff;
      std::vector<MPI_Status> statuses(req->chunks.size());  // once per request, not per poll
      while (!testRequest(*req, statuses)) {
        if (backoff.sleeping()) {
          checkCancelled();
          noteWaitingOn(req->peer());
          checkPeersGone(*req);
          if (Clock::now() > deadline) {
            failWith(MTXCOMM_TIMEOUT, strCat("timed out waiting for a ", what(*req)));
          }
        }
        backoff.pause();
      }
    }
  }

  bool testAll(std::vector<RequestPtr>& reqs) override {
    checkHealthy();
    const MpiRequest* pending = nullptr;
    std::vector<MPI_Status> statuses;
    for (RequestPtr& r : reqs) {
      if (!r) continue;
      auto* req = static_cast<MpiRequest*>(r.get());
      statuses.resize(req->chunks.size());
      if (testRequest(*req, statuses)) {
        r.reset();
      } else if (!pending) {
        pending = req;
      }
    }
    if (!pending) return true;
    checkCancelled();
    checkPeersGone(*pending);
    return false;
  }

  std::unique_ptr<Transport> split(const std::vector<int>& members, uint64_t) override {
    checkHealthy();
    MPI_Group world, group;
    MPI_Comm_group(comm_, &world);
    MPI_Group_incl(world, static_cast<int>(members.size()), members.data(), &group);
    MPI_Comm child = MPI_COMM_NULL;
    int rc = MPI_Comm_create_group(comm_, group, 0, &child);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS || child == MPI_COMM_NULL) {
      fail(MTXCOMM_SYSTEM_ERROR, "MPI_Comm_create_group failed: ", mpiErrorString(rc));
    }
    MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN);
    int newRank = 0;
    MPI_Comm_rank(child, &newRank);
    // The view's instance id, from its rank 0 (MPI_Comm_create_group is as blocking).
    InstanceId instance = newRank == 0 ? randomInstanceId() : 0;
    rc = MPI_Bcast(&instance, sizeof(instance), MPI_BYTE, 0, child);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&child);
      fail(MTXCOMM_SYSTEM_ERROR, "MPI_Bcast of a view's instance id failed: ", mpiErrorString(rc));
    }
    return std::make_unique<MpiTransport>(child, liveness_.subset(members, newRank), instance);
  }

  // Sends every peer an ABORT (best effort; the sends are eager: see kAbortTag), and fails this
  // transport: its own later calls throw naming the abort.
  void abort(const std::string& reason) override {
    if (failed_.empty()) failed_ = "this rank aborted: " + reason;
    if (abortSent_ || !abortable_ || mpiFinalized()) return;
    abortSent_ = true;
    abortMessage_.assign(reinterpret_cast<const char*>(&instance_), sizeof(instance_));
    abortMessage_ += reason.substr(0, kMaxAbortReason);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || peer == abortedBy_) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(abortMessage_.data(), static_cast<int>(abortMessage_.size()), MPI_BYTE, peer,
                    kAbortTag, comm_, &r) == MPI_SUCCESS) {
        abortSends_.push_back(r);
      }
    }
    // Progress them a little (a transport that moves bytes only inside MPI calls); what has not
    // completed within 200 ms is released to MPI in the destructor.
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    Backoff backoff;
    for (int done = 0; !done && Clock::now() < until; backoff.pause()) {
      MPI_Testall(static_cast<int>(abortSends_.size()), abortSends_.data(), &done,
                  MPI_STATUSES_IGNORE);
    }
  }

 private:
  // One MPI_Testall over req's chunks: true once complete (a receive's byte count checked).
  // Throws on an MPI failure (a truncation: the ranks disagree on the sizes).
  bool testRequest(MpiRequest& req, std::vector<MPI_Status>& statuses) {
    int done = 0;
    int rc =
        MPI_Testall(static_cast<int>(req.chunks.size()), req.chunks.data(), &done, statuses.data());
    if (rc != MPI_SUCCESS) {
      std::string detail = mpiErrorString(rc);
      if (rc == MPI_ERR_IN_STATUS) {
        for (auto& st : statuses) {
          if (st.MPI_ERROR != MPI_SUCCESS) detail = mpiErrorString(st.MPI_ERROR);
        }
      }
      bool truncated = false;
      for (auto& st : statuses) {
        int cls = 0;
        if (st.MPI_ERROR != MPI_SUCCESS && MPI_Error_class(st.MPI_ERROR, &cls) == MPI_SUCCESS)
          truncated = truncated || cls == MPI_ERR_TRUNCATE;
      }
      if (truncated) {
        failWith(MTXCOMM_INVALID_USAGE,
                 strCat("size mismatch on a ", what(req), ": the peer sent more bytes (the ",
                        "ranks disagree on the call: a different collective, count, datatype ",
                        "or root)"));
      }
      failWith(MTXCOMM_REMOTE_ERROR, strCat("MPI failed on a ", what(req), ": ", detail));
    }
    if (done && !req.isSend()) checkReceivedBytes(req, statuses);
    return done != 0;
  }

  // The slow checks of a wait on pending: a peer's ABORT, a node-local peer gone.
  void checkPeersGone(const MpiRequest& pending) {
    checkAborts(pending);
    int dead = liveness_.findDeadPeer();
    if (dead >= 0) {
      failWith(MTXCOMM_REMOTE_ERROR,
               strCat("peer rank ", dead, " (on this node) has exited while this rank ",
                      "waited for a ", what(pending)));
    }
  }

  // A shorter message than the receive expected means the ranks disagree on the schedule.
  void checkReceivedBytes(const MpiRequest& req, std::vector<MPI_Status>& statuses) {
    size_t got = 0;
    for (MPI_Status& st : statuses) {
      int c = 0;
      MPI_Get_count(&st, MPI_BYTE, &c);
      got += static_cast<size_t>(c);
    }
    if (got != req.bytes()) {
      failWith(MTXCOMM_INVALID_USAGE, strCat("size mismatch on a ", what(req), ": peer sent ", got,
                                             " bytes (the ranks disagree on the call: a different "
                                             "collective, count, datatype or root)"));
    }
  }

  RequestPtr post(bool isSend, int peer, int tag, void* buf, size_t bytes) {
    checkHealthy();
    if (peer < 0 || peer >= size_ || peer == rank_) {
      fail(MTXCOMM_INTERNAL_ERROR, "mpi: invalid peer rank ", peer);
    }
    auto req = std::make_unique<MpiRequest>(peer, isSend, bytes, tag);
    size_t off = 0;
    do {
      const size_t n = std::min(kMaxChunk, bytes - off);
      MPI_Request r = MPI_REQUEST_NULL;
      char* p = static_cast<char*>(buf) + off;
      int rc = isSend ? MPI_Isend(p, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r)
                      : MPI_Irecv(p, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r);
      if (rc != MPI_SUCCESS) {
        failWith(MTXCOMM_SYSTEM_ERROR, strCat(isSend ? "MPI_Isend to" : "MPI_Irecv from",
                                              " peer rank ", peer, ": ", mpiErrorString(rc)));
      }
      req->chunks.push_back(r);
      off += n;
    } while (off < bytes);
    return req;
  }

  void postAbortReceive() {
    abortBuf_.resize(sizeof(InstanceId) + kMaxAbortReason);
    if (MPI_Irecv(abortBuf_.data(), static_cast<int>(abortBuf_.size()), MPI_BYTE, MPI_ANY_SOURCE,
                  kAbortTag, comm_, &abortRecv_) != MPI_SUCCESS) {
      abortRecv_ = MPI_REQUEST_NULL;
    }
  }

  // Throws MTXCOMM_REMOTE_ERROR once a peer's ABORT for this instance has arrived, naming it,
  // its reason and the wait it ends (any wait: the collective cannot complete without it).
  void checkAborts(const MpiRequest& pending) {
    while (abortRecv_ != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Status st;
      if (MPI_Test(&abortRecv_, &done, &st) != MPI_SUCCESS) {
        postAbortReceive();  // a malformed (too long) message: not one of ours
        return;
      }
      if (!done) return;
      int bytes = 0;
      MPI_Get_count(&st, MPI_BYTE, &bytes);
      InstanceId instance = 0;
      if (bytes >= static_cast<int>(sizeof(instance))) {
        std::memcpy(&instance, abortBuf_.data(), sizeof(instance));
      }
      if (bytes < static_cast<int>(sizeof(instance)) || instance != instance_) {
        postAbortReceive();  // for an earlier communicator that had the same context
        continue;
      }
      const std::string reason(abortBuf_.data() + sizeof(instance), bytes - sizeof(instance));
      abortedBy_ = st.MPI_SOURCE;  // gone: this rank's own abort does not write to it
      failWith(MTXCOMM_REMOTE_ERROR, strCat("peer rank ", st.MPI_SOURCE, " aborted: ", reason,
                                            "; this rank was waiting for a ", what(pending)));
    }
  }

  [[noreturn]] void failWith(mtxcomm_result_t code, const std::string& msg) {
    if (failed_.empty()) failed_ = msg;
    throw Error(code, msg);
  }
  void checkHealthy() const {
    if (!failed_.empty()) {
      fail(MTXCOMM_REMOTE_ERROR, "the MPI transport failed earlier: ", failed_);
    }
  }
  static std::string what(const MpiRequest& r) {
    return strCat(r.isSend() ? "send to" : "receive from", " peer rank ", r.peer(), " (tag ", r.tag,
                  ", ", r.bytes(), " bytes)");
  }

  MPI_Comm comm_;
  PeerLiveness liveness_;
  const InstanceId instance_;
  int rank_ = 0, size_ = 1;
  std::string failed_;
  bool abortable_ = false;                    // kAbortTag is a valid tag here
  MPI_Request abortRecv_ = MPI_REQUEST_NULL;  // any peer's ABORT (kAbortTag), into abortBuf_
  std::vector<char> abortBuf_;
  bool abortSent_ = false;
  int abortedBy_ = -1;        // the peer whose ABORT failed this transport
  std::string abortMessage_;  // this rank's ABORT: lives while its sends may be in flight
  std::vector<MPI_Request> abortSends_;
};

}  // namespace

namespace {

// Waits for a non-blocking setup call of every rank of comm, at most until deadline. On a
// timeout the request is left pending (MPI cannot cancel a collective): the caller fails.
void awaitSetup(MPI_Request* req, Clock::time_point deadline, double timeoutSeconds, int size,
                const char* step) {
  Backoff backoff;
  for (int done = 0;;) {
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) fail(MTXCOMM_SYSTEM_ERROR, step, " failed: ", mpiErrorString(rc));
    if (done) return;
    if (Clock::now() > deadline) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", timeoutSeconds, " s in ", step,
           ": not every one of the ", size,
           " ranks of the MPI communicator took part (a rank that has not called init, or "
           "that has exited or shut down mtxcomm; MTXCOMM_TIMEOUT bounds this wait)");
    }
    backoff.pause();
  }
}

}  // namespace

std::unique_ptr<Transport> makeMpiTransport(MPI_Comm comm, double timeoutSeconds) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, timeoutSeconds)));
  int size = 1;
  MPI_Comm_size(comm, &size);
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(comm, &dup, &req);
  if (rc != MPI_SUCCESS) fail(MTXCOMM_SYSTEM_ERROR, "MPI_Comm_idup failed: ", mpiErrorString(rc));
  awaitSetup(&req, deadline, timeoutSeconds, size,
             "MPI_Comm_idup (mtxcomm's private communicator)");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(dup, &rank);
  // Identities for the liveness of node-local peers, each followed by a random instance id:
  // rank 0's is the communicator's (kAbortTag).
  constexpr int kIdLen = 320;
  constexpr int kEntry = kIdLen + static_cast<int>(sizeof(InstanceId));
  std::string self = PeerLiveness::selfIdentity();
  std::vector<char> mine(kEntry, 0), all(static_cast<size_t>(kEntry) * size, 0);
  std::memcpy(mine.data(), self.data(), std::min<size_t>(self.size(), kIdLen - 1));
  const InstanceId myInstance = randomInstanceId();
  std::memcpy(mine.data() + kIdLen, &myInstance, sizeof(myInstance));
  rc = MPI_Iallgather(mine.data(), kEntry, MPI_CHAR, all.data(), kEntry, MPI_CHAR, dup, &req);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&dup);
    fail(MTXCOMM_SYSTEM_ERROR, "MPI_Iallgather of peer identities failed: ", mpiErrorString(rc));
  }
  awaitSetup(&req, deadline, timeoutSeconds, size, "the allgather of peer identities");
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) ids.emplace_back(all.data() + static_cast<size_t>(r) * kEntry);
  InstanceId instance = 0;
  std::memcpy(&instance, all.data() + kIdLen, sizeof(instance));  // rank 0's
  return std::make_unique<MpiTransport>(dup, PeerLiveness(ids, rank), instance);
}

}  // namespace mtxcomm
