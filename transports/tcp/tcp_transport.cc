// The TCP transport's views and requests (tcp_transport.h has the design):
//   TcpRequest    a posted send or receive; holds its operation and the shared state.
//   TcpTransport  a view: rank translation and a context id over a TcpShared (tcp_mesh.h).
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/socket_util.h"
#include "transports/tcp/tcp_mesh.h"

namespace mtxcomm {
namespace tcp {
namespace {

// ---- requests -------------------------------------------------------------------------------

class TcpRequest : public Request {
 public:
  TcpRequest(std::shared_ptr<TcpShared> shared, int view_peer, int gpeer, int tag,
             std::shared_ptr<SendOp> send, std::shared_ptr<RecvOp> recv, size_t bytes)
      : Request(view_peer, send != nullptr, bytes),
        shared_(std::move(shared)),
        gpeer_(gpeer),
        tag_(tag),
        send_(std::move(send)),
        recv_(std::move(recv)) {}

  ~TcpRequest() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (send_) shared_->abandonSend(*send_);
    if (recv_) shared_->abandonRecv(*recv_);
  }

  const TcpShared* shared() const { return shared_.get(); }
  int gpeer() const { return gpeer_; }
  int tag() const { return tag_; }
  bool done() const { return send_ ? send_->done : recv_->done; }

 private:
  std::shared_ptr<TcpShared> shared_;
  int gpeer_;
  int tag_;
  std::shared_ptr<SendOp> send_;
  std::shared_ptr<RecvOp> recv_;
};

// ---- views ----------------------------------------------------------------------------------

// A view is also the point-to-point channel's ActivityWaiter (transport.h): its progress thread
// sleeps in poll(2) on the mesh's sockets and the view's wake-up eventfd, not in a timed sleep,
// so a byte that arrives, socket space that frees up (a large message streams through the
// kernel's buffers) or a post wakes it at once.
class TcpTransport : public Transport, public ActivityWaiter {
 public:
  // members[i]: the mesh rank of rank i of this view.
  // liveness: over the ranks of this view.
  TcpTransport(std::shared_ptr<TcpShared> shared, std::vector<int> members, int rank, uint64_t ctx,
               PeerLiveness liveness)
      : shared_(std::move(shared)),
        members_(std::move(members)),
        rank_(rank),
        ctx_(ctx),
        all_liveness_(std::move(liveness)) {
    for (int r = 0; r < size(); ++r) watched_.push_back(r);
    liveness_ = all_liveness_;
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->registerContext(ctx_, members_);
  }

  ~TcpTransport() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->unregisterContext(ctx_);
    }
    if (wakeFd_ >= 0) ::close(wakeFd_);
  }

  // ---- ActivityWaiter: the sockets are level-triggered, so nothing needs counting.
  uint32_t activitySeen() const override { return 0; }

  // The sleeper is not the mesh's poller (poller_active): it only watches the sockets, and
  // whoever progresses next reads what woke it. So a caller that progresses the channel itself
  // (mtxcomm_wait) still reads its peer's reply, with no hand-over to this thread, and a
  // collective's waiter polls as before.
  void waitActivity(uint32_t /*seen*/, Clock::duration atMost) override {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (shared_->failed()) return;
    if (wakePending_) {  // a wake() since the last sleep
      wakePending_ = false;
      return;
    }
    if (wakeFd_ < 0) {
      shared_->progress_cv.wait_for(lock, atMost);
      return;
    }
    polling_ = true;
    shared_->pollSet(waitSet_);
    waitSet_.push_back({wakeFd_, POLLIN, 0});
    lock.unlock();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(atMost).count();
    const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    const int rc = ::ppoll(waitSet_.data(), waitSet_.size(), &ts, nullptr);
    if (rc > 0 && (waitSet_.back().revents & POLLIN) != 0) {
      uint64_t wakes = 0;
      [[maybe_unused]] ssize_t n = ::read(wakeFd_, &wakes, sizeof wakes);  // non-blocking
    }
    lock.lock();
    polling_ = false;
    wakePending_ = false;
  }

  // Under the lock, so that a sleeper either sees wakePending_ before it sleeps or is in
  // ppoll when the eventfd is written (no system call when nobody polls).
  void wake() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (polling_) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, sizeof one);
    } else {
      wakePending_ = true;
    }
    shared_->progress_cv.notify_all();
  }

  const char* name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  RequestPtr isend(int peer, int tag, const void* buf, size_t bytes) override {
    checkArgs(peer, tag, "send to");
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->checkFailed();
    auto op = std::make_shared<SendOp>();
    uint64_t b = bytes;
    int32_t t = tag;
    std::memcpy(op->header, &ctx_, 8);
    std::memcpy(op->header + 8, &t, 4);
    std::memcpy(op->header + 12, &b, 8);
    op->data = static_cast<const char*>(buf);
    op->bytes = bytes;
    int g = members_[peer];
    shared_->postSend(g, op);
    return std::make_unique<TcpRequest>(shared_, peer, g, tag, op, nullptr, bytes);
  }

  RequestPtr irecv(int peer, int tag, void* buf, size_t bytes) override {
    checkArgs(peer, tag, "receive from");
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->checkFailed();
    auto op = std::make_shared<RecvOp>();
    op->buf = static_cast<char*>(buf);
    op->bytes = bytes;
    int g = members_[peer];
    shared_->postRecv(g, peer, MatchKey(ctx_, tag), op);
    return std::make_unique<TcpRequest>(shared_, peer, g, tag, nullptr, op, bytes);
  }

  void waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) override {
    const auto start = Clock::now();
    const std::vector<TcpRequest*> mine = ownRequests(reqs, "waitAll");
    std::vector<pollfd> pfds;
    std::unique_lock<std::mutex> lock(shared_->mu);
    for (bool slow = false;; slow = true) {
      shared_->checkFailed();
      shared_->progress();
      const TcpRequest* pending = nullptr;  // the first request not done yet
      for (TcpRequest* t : mine) {
        if (!t->done()) {
          pending = t;
          break;
        }
      }
      if (pending == nullptr) return;
      checkCancelled();
      if (slow) noteWaitingOn(pending->peer());
      checkPeersGone(mine, *pending, slow);
      if (Clock::now() >= deadline) {
        shared_->failWith(MTXCOMM_TIMEOUT,
                          strCat("timed out after ", secondsText(Clock::now() - start),
                                 " s waiting for ", describe(*pending)));
      }
      const int wait_ms = std::min(msLeft(deadline), kMaxPollMs);
      if (shared_->poller_active) {
        // Another thread (another view) polls the sockets and wakes us after every event.
        shared_->progress_cv.wait_for(lock, Ms(wait_ms));
        continue;
      }
      shared_->poller_active = true;
      shared_->pollSet(pfds);
      lock.unlock();
      int rc = ::poll(pfds.data(), pfds.size(), wait_ms);
      int err = errno;
      lock.lock();
      shared_->poller_active = false;
      shared_->progress_cv.notify_all();
      if (rc < 0 && err != EINTR) {
        shared_->failWith(MTXCOMM_SYSTEM_ERROR,
                          strCat("tcp transport: poll failed: ", errnoText(err)));
      }
    }
  }

  bool testAll(std::vector<RequestPtr>& reqs) override {
    const std::vector<TcpRequest*> mine = ownRequests(reqs, "testAll");
    if (mine.empty()) return true;
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->checkFailed();
    // A thread of another view asleep in poll(2) reads for everyone when it wakes; reading here
    // could take the data that is to wake it.
    if (shared_->poller_active) {
      shared_->progressWrites();
    } else {
      shared_->progress();
    }
    const TcpRequest* pending = nullptr;
    std::vector<bool> done(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      done[i] = mine[i]->done();
      if (!done[i] && !pending) pending = mine[i];
    }
    if (pending) {
      checkCancelled();
      checkPeersGone(mine, *pending, /*slow=*/true);
    }
    // Released without the lock: a request's destructor takes it.
    lock.unlock();
    size_t i = 0;
    for (auto& r : reqs) {
      if (!r) continue;
      if (done[i++]) r.reset();
    }
    return pending == nullptr;
  }

  std::unique_ptr<Transport> split(const std::vector<int>& members, uint64_t context_id) override {
    std::vector<int> global;
    int new_rank = -1;
    std::vector<bool> seen(members_.size(), false);
    for (size_t i = 0; i < members.size(); ++i) {
      int m = members[i];
      if (m < 0 || m >= size() || seen[m]) {
        fail(MTXCOMM_INVALID_USAGE, "tcp transport split: member ", m,
             " is out of range or repeated (size ", size(), ")");
      }
      seen[m] = true;
      if (m == rank_) new_rank = static_cast<int>(i);
      global.push_back(members_[m]);
    }
    if (new_rank < 0) {
      fail(MTXCOMM_INVALID_USAGE, "tcp transport split: members do not contain rank ", rank_);
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->checkFailed();
    }
    return std::make_unique<TcpTransport>(shared_, std::move(global), new_rank, context_id,
                                          all_liveness_.subset(members, new_rank));
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->abort(reason, ctx_);
  }

 private:
  // The requests of reqs (null entries skipped), each checked to be of this transport.
  std::vector<TcpRequest*> ownRequests(std::vector<RequestPtr>& reqs, const char* entry) const {
    std::vector<TcpRequest*> mine;
    mine.reserve(reqs.size());
    for (auto& r : reqs) {
      if (!r) continue;
      auto* t = dynamic_cast<TcpRequest*>(r.get());
      if (t == nullptr || t->shared() != shared_.get()) {
        fail(MTXCOMM_INVALID_USAGE, "tcp transport: ", entry,
             " given a request of another transport");
      }
      mine.push_back(t);
    }
    return mine;
  }

  // "receive from peer rank 1 (tag 3, 8 bytes)"
  static std::string describe(const TcpRequest& t) {
    return strCat(t.isSend() ? "send to" : "receive from", " peer rank ", t.peer(), " (tag ",
                  t.tag(), ", ", t.bytes(), " bytes)");
  }

  // Throws MTXCOMM_REMOTE_ERROR (failing the shared state) when a peer is known to be gone: a
  // member of this view sent an ABORT frame; the connection of a peer with a pending request
  // closed; or, in the slow path (slow: after the first poll), the process of a node-local
  // member is gone without having said BYE — even when this rank waits on another peer, since
  // the collective cannot complete without it. Called with the lock held.
  void checkPeersGone(const std::vector<TcpRequest*>& mine, const TcpRequest& pending, bool slow) {
    for (int r = 0; r < size(); ++r) {
      const Peer& p = shared_->peer(members_[r]);
      if (!p.aborted) continue;
      std::string where;
      if (p.abort_ctx != ctx_)
        where = strCat(" (in the communicator of context ", p.abort_ctx, ")");
      shared_->failWith(MTXCOMM_REMOTE_ERROR,
                        strCat("peer rank ", r, " aborted: ", p.abort_reason, where,
                               "; this rank was waiting for a ", describe(pending)));
    }
    for (TcpRequest* t : mine) {
      if (t->done()) continue;
      const Peer& p = shared_->peer(t->gpeer());
      if (p.closed) {
        shared_->failWith(
            MTXCOMM_REMOTE_ERROR,
            strCat("peer rank ", t->peer(), " closed the connection (", p.closed_reason,
                   ") before a ", t->isSend() ? "send to" : "receive from", " it completed (tag ",
                   t->tag(), ", ", t->bytes(), " bytes)"));
      }
    }
    if (!slow) return;
    for (;;) {
      const int dead = liveness_.findDeadPeer();
      if (dead < 0) return;
      const int r = watched_[dead];
      shared_->progress();  // read what it sent before it exited: BYE, ABORT
      const Peer& p = shared_->peer(members_[r]);
      if (p.aborted) return;  // the next round reports the reason
      if (!p.said_bye) {
        shared_->failWith(MTXCOMM_REMOTE_ERROR,
                          strCat("peer rank ", r, " (on this node) has exited while this rank ",
                                 "waited for a ", describe(pending)));
      }
      // It finished normally: stop watching it.
      watched_.erase(watched_.begin() + dead);
      liveness_ = all_liveness_.subset(watched_, 0);
    }
  }

  void checkArgs(int peer, int tag, const char* what) const {
    if (peer < 0 || peer >= size()) {
      fail(MTXCOMM_INTERNAL_ERROR, "tcp transport: ", what, " peer rank ", peer,
           " out of range (size ", size(), ")");
    }
    if (peer == rank_) {
      fail(MTXCOMM_INTERNAL_ERROR, "tcp transport: rank ", rank_, " asked to ", what,
           " itself (tag ", tag, "); algorithms copy locally");
    }
    if (tag < 0 || tag > kMaxTag) {
      fail(MTXCOMM_INTERNAL_ERROR, "tcp transport: tag ", tag, " out of range [0, ", kMaxTag, "]");
    }
  }

  std::shared_ptr<TcpShared> shared_;
  std::vector<int> members_;
  int rank_;
  uint64_t ctx_;
  PeerLiveness all_liveness_;  // over every rank of this view
  std::vector<int> watched_;   // the ranks liveness_ checks: those that have not said BYE
  PeerLiveness liveness_;      // all_liveness_.subset(watched_)
  // waitActivity's: woken by wake(); -1 where eventfd(2) failed (it then sleeps on progress_cv).
  int wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::vector<pollfd> waitSet_;
  bool polling_ = false;      // in ppoll on waitSet_ (guarded by shared_->mu)
  bool wakePending_ = false;  // a wake() while not polling: the next waitActivity returns at once
};

}  // namespace

std::unique_ptr<Transport> makeView(std::shared_ptr<TcpShared> shared, std::vector<int> members,
                                    int rank, uint64_t ctx, PeerLiveness liveness) {
  return std::make_unique<TcpTransport>(std::move(shared), std::move(members), rank, ctx,
                                        std::move(liveness));
}

}  // namespace tcp
}  // namespace mtxcomm
