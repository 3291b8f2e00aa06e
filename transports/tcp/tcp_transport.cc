// TCP transport: see tcp_transport.h for the design. Layout of this file:
//   TcpShared     the sockets, the per-peer send queues and receive state machines, the matching
//                 queues keyed by (context id, tag), progress and the failed state; one mutex.
//   TcpRequest    a posted send or receive; holds its operation and the shared state.
//   TcpTransport  a view: rank translation and a context id over a TcpShared.
//   bootstrap     listen, publish, connect / accept with a handshake.
#include "transports/tcp/tcp_transport.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/liveness.h"
#include "lib/socket_util.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

constexpr size_t kHeaderBytes = 20;       // u64 context_id, i32 tag, u64 bytes
constexpr size_t kStageBytes = 64 << 10;  // small messages and headers are read through this
constexpr size_t kReadBudget = 16 << 20;  // bytes read from one peer before serving the others
constexpr int kMaxPollMs = 100;           // longest single poll(2) / condition wait
constexpr uint64_t kMagic = 0x316d6d6f6378746dull;  // "mtxcomm1"
// Control frames: a header with a negative tag (never a message tag) and a small payload.
constexpr int32_t kAbortTag = -1;          // payload: the reason; context: the aborting view
constexpr int32_t kByeTag = -2;            // no payload: the sender closes in good order
constexpr size_t kMaxControlBytes = 4096;  // longer abort reasons are cut

// ---- environment ----------------------------------------------------------------------------

struct TcpEnv {
  std::string ifaddr;  // MTXCOMM_TCP_IFADDR: address to listen on ("" = every interface)
  std::string host;    // MTXCOMM_TCP_HOST: address the peers connect to
};

// The only place this transport reads the environment.
TcpEnv readTcpEnv() {
  TcpEnv env;
  if (const char* v = std::getenv("MTXCOMM_TCP_IFADDR")) env.ifaddr = v;
  if (const char* v = std::getenv("MTXCOMM_TCP_HOST")) env.host = v;
  if (env.host.empty()) env.host = env.ifaddr.empty() ? "127.0.0.1" : env.ifaddr;
  return env;
}

using MatchKey = std::pair<uint64_t, int>;  // (context id, tag)

struct SendOp {
  char header[kHeaderBytes];
  const char* data = nullptr;
  size_t bytes = 0;
  size_t sent = 0;  // of header + payload
  bool done = false;
  bool abandoned = false;  // the request went away before it completed
  std::vector<char> copy;  // the payload, once the request went away mid-message
};

struct Unexpected;

struct RecvOp {
  char* buf = nullptr;
  size_t bytes = 0;
  bool done = false;
  bool abandoned = false;
  std::shared_ptr<Unexpected> source;  // matched to a message that is still arriving
};

// A message that arrived before its receive was posted.
struct Unexpected {
  std::unique_ptr<char[]> data;
  size_t bytes = 0;
  bool complete = false;
  std::shared_ptr<RecvOp> waiter;  // matched receive, copied into once complete
};

struct MatchQueue {
  std::deque<std::shared_ptr<RecvOp>> posted;
  std::deque<std::shared_ptr<Unexpected>> unexpected;
};

struct Peer {
  int fd = -1;
  bool closed = false;
  std::string closed_reason;
  bool said_bye = false;  // a BYE frame came: the peer closed in good order
  bool aborted = false;   // an ABORT frame came
  std::string abort_reason;
  uint64_t abort_ctx = 0;  // context id of the view the peer aborted
  std::deque<std::shared_ptr<SendOp>> sends;
  std::map<MatchKey, MatchQueue> queues;
  // Receive state machine: a header, then its payload into target_recv or target_unexpected.
  char header[kHeaderBytes];
  size_t header_got = 0;
  bool in_payload = false;
  MatchKey payload_key{0, 0};
  size_t payload_bytes = 0;
  size_t payload_got = 0;
  std::shared_ptr<RecvOp> target_recv;
  std::shared_ptr<Unexpected> target_unexpected;
  int32_t control_tag = 0;  // != 0: the payload is that of a control frame, into control_payload
  std::string control_payload;
  std::unique_ptr<char[]> stage;
  size_t stage_begin = 0, stage_end = 0;
};

// ---- shared state ---------------------------------------------------------------------------

class TcpShared {
 public:
  TcpShared(int rank, int size) : rank_(rank), peers_(size) {
    for (auto& p : peers_) p.stage.reset(new char[kStageBytes]);
  }
  ~TcpShared() {
    // The last view and request are gone: tell the peers this rank leaves in good order, so that
    // their liveness check does not take its exit for a crash.
    if (!failed_) {
      for (int g = 0; g < size(); ++g) sendControl(g, kByeTag, 0, "");
    }
    for (auto& p : peers_) {
      if (p.fd >= 0) ::close(p.fd);
    }
  }

  std::mutex mu;  // guards everything below; public so views and requests lock it
  // One waiting thread at a time polls the sockets (without the lock); waiters on other views
  // sleep on progress_cv, which the poller signals after every poll(2) return.
  bool poller_active = false;
  std::condition_variable progress_cv;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  void setFd(int peer, int fd) { peers_[peer].fd = fd; }

  // Context registry, also used to name peers in the numbering of the view that owns a message.
  void registerContext(uint64_t ctx, const std::vector<int>& members) {
    if (!contexts_.emplace(ctx, members).second) {
      fail(MTXCOMM_INVALID_USAGE, "tcp transport: context id ", ctx,
           " is already used by a live transport on rank ", rank_);
    }
  }
  void unregisterContext(uint64_t ctx) { contexts_.erase(ctx); }

  void checkFailed() const {
    if (failed_) {
      fail(MTXCOMM_INVALID_USAGE,
           "tcp transport is unusable after an earlier error: ", first_error_);
    }
  }
  bool failed() const { return failed_; }

  // Records the first error, fails the shared state and throws.
  [[noreturn]] void failWith(mtxcomm_result_t code, const std::string& msg) {
    if (!failed_) {
      keepWireMessages();
      failed_ = true;
      first_error_ = msg;
    }
    throw Error(code, msg);
  }

  // Fails the state, sends every open peer an ABORT frame with reason and the context id ctx of
  // the aborting view (best effort, without blocking), then shuts the sockets down.
  void abort(const std::string& reason, uint64_t ctx) {
    if (!failed_) {
      failed_ = true;
      first_error_ = "this rank aborted the transport: " + reason;
    }
    if (!abort_sent_) {
      abort_sent_ = true;
      const std::string cut = reason.substr(0, kMaxControlBytes);
      for (int g = 0; g < size(); ++g) sendControl(g, kAbortTag, ctx, cut);
    }
    for (auto& p : peers_) {
      if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
    }
  }

  const Peer& peer(int gpeer) const { return peers_[gpeer]; }

  void postSend(int gpeer, const std::shared_ptr<SendOp>& op) {
    Peer& p = peers_[gpeer];
    p.sends.push_back(op);
    if (p.sends.size() == 1 && !p.closed) writePeer(gpeer);  // eager attempt: lower latency
  }

  // Matches against the unexpected queue or queues the receive. view_peer names the peer in
  // errors.
  void postRecv(int gpeer, int view_peer, MatchKey key, const std::shared_ptr<RecvOp>& op) {
    Peer& p = peers_[gpeer];
    auto it = p.queues.find(key);
    if (it == p.queues.end() || it->second.unexpected.empty()) {
      p.queues[key].posted.push_back(op);
      return;
    }
    std::shared_ptr<Unexpected> u = std::move(it->second.unexpected.front());
    it->second.unexpected.pop_front();
    eraseIfEmpty(p, it);
    if (u->bytes != op->bytes) sizeMismatch(view_peer, key, op->bytes, u->bytes);
    if (u->complete) {
      if (op->bytes > 0) std::memcpy(op->buf, u->data.get(), op->bytes);
      op->done = true;
    } else {
      u->waiter = op;
      op->source = std::move(u);
    }
  }

  // Called by a request that goes away before it completed.
  void abandonSend(SendOp& op) {
    if (failed_ || op.done) return;
    op.abandoned = true;
    if (op.sent > 0 && op.bytes > 0) {  // mid-message: finish it from a copy to keep framing
      op.copy.assign(op.data, op.data + op.bytes);
      op.data = op.copy.data();
    }
  }
  void abandonRecv(RecvOp& op) {
    if (failed_ || op.done) return;
    op.abandoned = true;
    if (op.source) {
      op.source->waiter.reset();
      op.source.reset();
    }
  }

  // One non-blocking round over every open peer: write what the sockets take, read what they
  // have. Throws (failing the state) on a size mismatch.
  void progress() {
    for (int g = 0; g < size(); ++g) {
      if (g == rank_ || peers_[g].closed || peers_[g].fd < 0) continue;
      writePeer(g);
      if (!peers_[g].closed) readPeer(g);
    }
  }

  // The poll(2) set for the next wait: every open peer for reading, those with queued sends for
  // writing.
  void pollSet(std::vector<pollfd>& pfds) const {
    pfds.clear();
    for (int g = 0; g < size(); ++g) {
      const Peer& p = peers_[g];
      if (g == rank_ || p.closed || p.fd < 0) continue;
      short events = POLLIN;
      if (!p.sends.empty()) events |= POLLOUT;
      pfds.push_back({p.fd, events, 0});
    }
  }

 private:
  [[noreturn]] void sizeMismatch(int view_peer, MatchKey key, size_t recv_bytes, size_t msg_bytes) {
    failWith(MTXCOMM_INVALID_USAGE,
             strCat("message size mismatch with peer rank ", view_peer, " (tag ", key.second,
                    ", context ", key.first, "): the receive is for ", recv_bytes,
                    " bytes, the message has ", msg_bytes,
                    " bytes (the ranks disagree on the call: a different collective, count, "
                    "datatype or root)"));
  }

  int viewRank(uint64_t ctx, int gpeer) const {
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) return gpeer;
    auto m = std::find(it->second.begin(), it->second.end(), gpeer);
    return m == it->second.end() ? gpeer : static_cast<int>(m - it->second.begin());
  }

  static void eraseIfEmpty(Peer& p, std::map<MatchKey, MatchQueue>::iterator it) {
    if (it->second.posted.empty() && it->second.unexpected.empty()) p.queues.erase(it);
  }

  // Copies every message already partly on the wire (while the caller's buffer is still valid:
  // once waitAll has thrown it may be gone), so that abort() can finish it and put its ABORT
  // frame on a message boundary.
  void keepWireMessages() {
    for (auto& p : peers_) {
      if (p.sends.empty()) continue;
      SendOp& op = *p.sends.front();
      if (op.sent == 0 || op.done || op.bytes == 0 || op.data == op.copy.data()) continue;
      op.copy.assign(op.data, op.data + op.bytes);
      op.data = op.copy.data();
    }
  }

  void closePeer(int gpeer, const std::string& reason) {
    Peer& p = peers_[gpeer];
    p.closed = true;
    p.closed_reason = reason;
    ::shutdown(p.fd, SHUT_RDWR);  // the fd itself closes with the shared state
  }

  void writePeer(int gpeer) {
    Peer& p = peers_[gpeer];
    while (!p.sends.empty()) {
      SendOp& op = *p.sends.front();
      if (op.abandoned && op.sent == 0) {
        p.sends.pop_front();
        continue;
      }
      if (!writeOp(gpeer, op)) return;
      op.done = true;
      p.sends.pop_front();
    }
  }

  // Sends a control frame to gpeer without blocking, if the connection is open: drops the queued
  // messages not started yet, finishes the one on the wire (the frame must start on a message
  // boundary) and writes the frame; gives up on the peer when its socket buffer is full.
  void sendControl(int gpeer, int32_t tag, uint64_t ctx, const std::string& payload) {
    Peer& p = peers_[gpeer];
    if (gpeer == rank_ || p.fd < 0 || p.closed) return;
    while (!p.sends.empty() && p.sends.front()->sent == 0) p.sends.pop_front();
    if (!p.sends.empty()) {
      if (!writeOp(gpeer, *p.sends.front())) return;
      p.sends.front()->done = true;
    }
    p.sends.clear();
    std::string frame(kHeaderBytes, '\0');
    uint64_t bytes = payload.size();
    std::memcpy(&frame[0], &ctx, 8);
    std::memcpy(&frame[8], &tag, 4);
    std::memcpy(&frame[12], &bytes, 8);
    frame += payload;
    size_t sent = 0;
    sendSome(p.fd, frame.data(), frame.size(), &sent);
  }

  // Writes what the socket takes of op. True once the whole message is written; false when the
  // socket is full, or broken (the peer is then closed).
  bool writeOp(int gpeer, SendOp& op) {
    Peer& p = peers_[gpeer];
    for (;;) {
      iovec iov[2];
      int n_iov = 0;
      if (op.sent < kHeaderBytes) {
        iov[n_iov++] = {op.header + op.sent, kHeaderBytes - op.sent};
        if (op.bytes > 0) iov[n_iov++] = {const_cast<char*>(op.data), op.bytes};
      } else {
        size_t off = op.sent - kHeaderBytes;
        iov[n_iov++] = {const_cast<char*>(op.data) + off, op.bytes - off};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n_iov;
      ssize_t n = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        closePeer(gpeer, errnoText(errno));
        return false;
      }
      op.sent += static_cast<size_t>(n);
      if (op.sent == kHeaderBytes + op.bytes) return true;
    }
  }

  // Where the next payload byte goes; null when it is to be dropped (abandoned receive).
  char* payloadDst(Peer& p) {
    if (p.control_tag != 0) return &p.control_payload[p.payload_got];
    if (p.target_recv) {
      return p.target_recv->abandoned ? nullptr : p.target_recv->buf + p.payload_got;
    }
    return p.target_unexpected->data.get() + p.payload_got;
  }

  void readPeer(int gpeer) {
    Peer& p = peers_[gpeer];
    size_t budget = kReadBudget;
    while (budget > 0) {
      if (p.stage_begin < p.stage_end) {
        consumeStage(gpeer);
        if (p.closed) return;  // a protocol error
        continue;
      }
      char* direct = nullptr;
      size_t want = kStageBytes;
      if (p.in_payload && p.payload_bytes - p.payload_got >= kStageBytes) {
        direct = payloadDst(p);  // large payload: straight into its destination
        if (direct) want = std::min(p.payload_bytes - p.payload_got, budget);
      }
      ssize_t n = ::recv(p.fd, direct ? direct : p.stage.get(), want, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        closePeer(gpeer, errnoText(errno));
        return;
      }
      if (n == 0) {
        closePeer(gpeer, "EOF");
        return;
      }
      budget -= std::min(budget, static_cast<size_t>(n));
      if (direct) {
        advancePayload(p, static_cast<size_t>(n));
      } else {
        p.stage_begin = 0;
        p.stage_end = static_cast<size_t>(n);
      }
    }
  }

  void consumeStage(int gpeer) {
    Peer& p = peers_[gpeer];
    while (p.stage_begin < p.stage_end && !p.closed) {
      size_t avail = p.stage_end - p.stage_begin;
      const char* src = p.stage.get() + p.stage_begin;
      if (!p.in_payload) {
        size_t take = std::min(avail, kHeaderBytes - p.header_got);
        std::memcpy(p.header + p.header_got, src, take);
        p.header_got += take;
        p.stage_begin += take;
        if (p.header_got == kHeaderBytes) {
          p.header_got = 0;
          onHeader(gpeer);
        }
      } else {
        size_t take = std::min(avail, p.payload_bytes - p.payload_got);
        if (char* dst = payloadDst(p)) std::memcpy(dst, src, take);
        p.stage_begin += take;
        advancePayload(p, take);
      }
    }
  }

  void onHeader(int gpeer) {
    Peer& p = peers_[gpeer];
    uint64_t ctx, bytes;
    int32_t tag;
    std::memcpy(&ctx, p.header, 8);
    std::memcpy(&tag, p.header + 8, 4);
    std::memcpy(&bytes, p.header + 12, 8);
    if (tag < 0) {
      if ((tag != kAbortTag && tag != kByeTag) || bytes > kMaxControlBytes) {
        closePeer(gpeer,
                  strCat("protocol error: bad control frame (tag ", tag, ", ", bytes, " bytes)"));
        return;
      }
      p.in_payload = true;
      p.control_tag = tag;
      p.control_payload.assign(bytes, '\0');
      p.payload_key = MatchKey(ctx, tag);
      p.payload_bytes = bytes;
      p.payload_got = 0;
      if (bytes == 0) advancePayload(p, 0);
      return;
    }
    MatchKey key(ctx, tag);
    MatchQueue& q = p.queues[key];
    while (!q.posted.empty() && q.posted.front()->abandoned) q.posted.pop_front();
    p.in_payload = true;
    p.payload_key = key;
    p.payload_bytes = bytes;
    p.payload_got = 0;
    if (!q.posted.empty()) {
      std::shared_ptr<RecvOp> r = std::move(q.posted.front());
      q.posted.pop_front();
      eraseIfEmpty(p, p.queues.find(key));
      if (r->bytes != bytes) sizeMismatch(viewRank(ctx, gpeer), key, r->bytes, bytes);
      p.target_recv = std::move(r);
    } else {
      auto u = std::make_shared<Unexpected>();
      u->data.reset(new char[bytes > 0 ? bytes : 1]);
      u->bytes = bytes;
      q.unexpected.push_back(u);
      p.target_unexpected = std::move(u);
    }
    if (bytes == 0) advancePayload(p, 0);
  }

  void advancePayload(Peer& p, size_t n) {
    p.payload_got += n;
    if (p.payload_got < p.payload_bytes) return;
    if (p.control_tag == kAbortTag) {
      p.aborted = true;
      p.abort_reason = std::move(p.control_payload);
      p.abort_ctx = p.payload_key.first;
    } else if (p.control_tag == kByeTag) {
      p.said_bye = true;
    } else if (p.target_recv) {
      p.target_recv->done = true;
    } else {
      Unexpected& u = *p.target_unexpected;
      u.complete = true;
      if (u.waiter) {
        if (u.bytes > 0) std::memcpy(u.waiter->buf, u.data.get(), u.bytes);
        u.waiter->done = true;
        u.waiter->source.reset();
        u.waiter.reset();
      }
    }
    p.in_payload = false;
    p.control_tag = 0;
    p.control_payload.clear();
    p.target_recv.reset();
    p.target_unexpected.reset();
  }

  const int rank_;
  std::vector<Peer> peers_;
  std::map<uint64_t, std::vector<int>> contexts_;
  bool failed_ = false;
  bool abort_sent_ = false;
  std::string first_error_;
};

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

class TcpTransport : public Transport {
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
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->unregisterContext(ctx_);
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
    std::vector<TcpRequest*> mine;
    mine.reserve(reqs.size());
    for (auto& r : reqs) {
      if (!r) continue;
      auto* t = dynamic_cast<TcpRequest*>(r.get());
      if (t == nullptr || t->shared() != shared_.get()) {
        fail(MTXCOMM_INVALID_USAGE, "tcp transport: waitAll given a request of another transport");
      }
      mine.push_back(t);
    }
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
};

// ---- bootstrap ------------------------------------------------------------------------------

struct Hello {
  uint64_t magic;
  uint64_t job;
  int32_t from;
  int32_t to;
  int32_t size;
  int32_t pad;
};

Ms remaining(Clock::time_point deadline) {
  return std::max(Ms(1), std::chrono::ceil<Ms>(deadline - Clock::now()));
}

}  // namespace

std::unique_ptr<Transport> makeTcpTransport(Store& store, int rank, int size, Ms timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    fail(MTXCOMM_INVALID_USAGE, "tcp transport: rank ", rank, " is not in [0, ", size, ")");
  }
  const auto deadline = Clock::now() + timeout;
  auto shared = std::make_shared<TcpShared>(rank, size);
  std::vector<int> identity(size);
  for (int i = 0; i < size; ++i) identity[i] = i;
  if (size == 1) return std::make_unique<TcpTransport>(shared, identity, 0, 0, PeerLiveness());

  const TcpEnv env = readTcpEnv();
  // Listen on an ephemeral port.
  sockaddr_in bind_addr{};
  bind_addr.sin_family = AF_INET;
  bind_addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!env.ifaddr.empty())
    bind_addr = resolveIpv4(env.ifaddr, 0, "tcp transport: MTXCOMM_TCP_IFADDR");
  UniqueFd listener(listenTcp(&bind_addr, /*reuse_addr=*/false));
  if (listener.get() < 0) {
    fail(MTXCOMM_SYSTEM_ERROR, "tcp transport: cannot listen on ",
         env.ifaddr.empty() ? "0.0.0.0" : env.ifaddr, ": ", errnoText(errno));
  }
  const int port = ntohs(bind_addr.sin_port);

  // Job id: tells this job's connections from strays.
  uint64_t job = 0;
  if (rank == 0) {
    std::random_device rd;
    job = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
    store.set("tcp/job", std::to_string(job));
  } else {
    job = std::stoull(store.get("tcp/job", remaining(deadline)));
  }
  store.set(strCat("tcp/addr/", rank), strCat(env.host, ":", port));
  store.set(strCat("tcp/id/", rank), PeerLiveness::selfIdentity());

  // Connect to every lower rank and say hello (no wait for the answer yet: the peer may still be
  // connecting to its own lower ranks).
  for (int peer = 0; peer < rank; ++peer) {
    std::string where = store.get(strCat("tcp/addr/", peer), remaining(deadline));
    size_t colon = where.rfind(':');
    if (colon == std::string::npos) {
      fail(MTXCOMM_SYSTEM_ERROR, "tcp transport: bad address '", where, "' for peer rank ", peer);
    }
    sockaddr_in addr = resolveIpv4(where.substr(0, colon), std::atoi(where.c_str() + colon + 1),
                                   strCat("tcp transport: address of peer rank ", peer));
    int err = 0;
    UniqueFd fd(connectWithRetry(addr, deadline, &err, "tcp transport"));
    if (fd.get() < 0) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s connecting to peer rank ",
           peer, " at ", where, " (", errnoText(err), ")");
    }
    Hello hello{kMagic, job, rank, peer, size, 0};
    if (!sendAll(fd.get(), &hello, sizeof(hello))) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", peer, " closed the connection (", errnoText(errno),
           ") during the tcp handshake");
    }
    shared->setFd(peer, fd.release());
  }

  // Accept every higher rank; drop connections that are not from this job.
  int missing = size - 1 - rank;
  while (missing > 0) {
    pollfd pfd{listener.get(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, msLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      std::string who;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (shared->peer(peer).fd < 0) who += strCat(who.empty() ? "" : ", ", peer);
      }
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout),
           " s waiting for peer rank(s) ", who, " to connect (tcp bootstrap)");
    }
    UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) continue;
    Hello hello;
    if (recvAll(fd.get(), &hello, sizeof(hello), deadline) != IoResult::kOk) continue;
    if (hello.magic != kMagic || hello.job != job || hello.to != rank || hello.size != size ||
        hello.from <= rank || hello.from >= size || shared->peer(hello.from).fd >= 0) {
      continue;  // not ours
    }
    Hello ack{kMagic, job, rank, hello.from, size, 0};
    if (!sendAll(fd.get(), &ack, sizeof(ack))) continue;
    shared->setFd(hello.from, fd.release());
    --missing;
  }

  // Collect the answers of the lower ranks.
  for (int peer = 0; peer < rank; ++peer) {
    Hello ack;
    IoResult r = recvAll(shared->peer(peer).fd, &ack, sizeof(ack), deadline);
    if (r == IoResult::kTimeout) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s waiting for peer rank ",
           peer, " to accept the connection (tcp bootstrap)");
    }
    if (r != IoResult::kOk) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", peer,
           " closed the connection during the tcp handshake");
    }
    if (ack.magic != kMagic || ack.job != job || ack.from != peer || ack.to != rank) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", peer,
           " answered the tcp handshake wrongly "
           "(another job on its port?)");
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    setNoDelay(shared->peer(peer).fd);
    setNonBlocking(shared->peer(peer).fd);
  }
  // Identities for the liveness of node-local peers (every rank set its own before connecting).
  std::vector<std::string> ids(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) ids[peer] = store.get(strCat("tcp/id/", peer), remaining(deadline));
  }
  return std::make_unique<TcpTransport>(shared, identity, rank, 0, PeerLiveness(ids, rank));
}

}  // namespace mtxcomm
