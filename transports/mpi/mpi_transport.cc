#include "transports/mpi/mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "lib/base/backoff.h"
#include "lib/base/error.h"
#include "lib/base/liveness.h"

namespace mtxcomm {

namespace {

constexpr size_t kMaxChunk = size_t{1} << 30;

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
  MpiTransport(MPI_Comm comm, PeerLiveness liveness) : comm_(comm), liveness_(std::move(liveness)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiTransport() override {
    if (!mpiFinalized() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
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
      for (;;) {
        int done = 0;
        int rc = MPI_Testall(static_cast<int>(req->chunks.size()), req->chunks.data(), &done,
                             statuses.data());
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
                     strCat("size mismatch on a ", what(*req), ": the peer sent more bytes (the ",
                            "ranks disagree on the call: a different collective, count, datatype ",
                            "or root)"));
          }
          failWith(MTXCOMM_REMOTE_ERROR, strCat("MPI failed on a ", what(*req), ": ", detail));
        }
        if (done) {
          if (!req->isSend()) checkReceivedBytes(*req, statuses);
          break;
        }
        if (backoff.sleeping()) {
          checkCancelled();
          noteWaitingOn(req->peer());
          int dead = liveness_.findDeadPeer();
          if (dead >= 0) {
            failWith(MTXCOMM_REMOTE_ERROR,
                     strCat("peer rank ", dead, " (on this node) has exited while this rank ",
                            "waited for a ", what(*req)));
          }
          if (Clock::now() > deadline) {
            failWith(MTXCOMM_TIMEOUT, strCat("timed out waiting for a ", what(*req)));
          }
        }
        backoff.pause();
      }
    }
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
    return std::make_unique<MpiTransport>(child, liveness_.subset(members, newRank));
  }

 private:
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
  int rank_ = 0, size_ = 1;
  std::string failed_;
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
  // Identities for the liveness of node-local peers.
  constexpr int kIdLen = 320;
  std::string self = PeerLiveness::selfIdentity();
  std::vector<char> mine(kIdLen, 0), all(static_cast<size_t>(kIdLen) * size, 0);
  std::memcpy(mine.data(), self.data(), std::min<size_t>(self.size(), kIdLen - 1));
  rc = MPI_Iallgather(mine.data(), kIdLen, MPI_CHAR, all.data(), kIdLen, MPI_CHAR, dup, &req);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&dup);
    fail(MTXCOMM_SYSTEM_ERROR, "MPI_Iallgather of peer identities failed: ", mpiErrorString(rc));
  }
  awaitSetup(&req, deadline, timeoutSeconds, size, "the allgather of peer identities");
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) ids.emplace_back(all.data() + static_cast<size_t>(r) * kIdLen);
  return std::make_unique<MpiTransport>(dup, PeerLiveness(ids, rank));
}

}  // namespace mtxcomm
