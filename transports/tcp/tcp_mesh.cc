// TcpShared: progress over the mesh's sockets (see tcp_mesh.h).
#include "transports/tcp/tcp_mesh.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "lib/base/error.h"
#include "lib/base/socket_util.h"

namespace mtxcomm {
namespace tcp {

TcpShared::TcpShared(int rank, int size) : rank_(rank), peers_(size) {
  for (auto& p : peers_) p.stage.reset(new char[kStageBytes]);
}

TcpShared::~TcpShared() {
  // The last view and request are gone: tell the peers this rank leaves in good order, so that
  // their liveness check does not take its exit for a crash.
  if (!failed_) {
    for (int g = 0; g < size(); ++g) sendControl(g, kByeTag, 0, "");
  }
  for (auto& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
  }
}

void TcpShared::registerContext(uint64_t ctx, const std::vector<int>& members) {
  if (!contexts_.emplace(ctx, members).second) {
    fail(MTXCOMM_INVALID_USAGE, "tcp transport: context id ", ctx,
         " is already used by a live transport on rank ", rank_);
  }
}

void TcpShared::checkFailed() const {
  if (failed_) {
    fail(MTXCOMM_INVALID_USAGE, "tcp transport is unusable after an earlier error: ", first_error_);
  }
}

[[noreturn]] void TcpShared::failWith(mtxcomm_result_t code, const std::string& msg) {
  if (!failed_) {
    keepWireMessages();
    failed_ = true;
    first_error_ = msg;
  }
  throw Error(code, msg);
}

void TcpShared::abort(const std::string& reason, uint64_t ctx) {
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

void TcpShared::postSend(int gpeer, const std::shared_ptr<SendOp>& op) {
  Peer& p = peers_[gpeer];
  p.sends.push_back(op);
  if (p.sends.size() == 1 && !p.closed) writePeer(gpeer);  // eager attempt: lower latency
}

void TcpShared::postRecv(int gpeer, int view_peer, MatchKey key,
                         const std::shared_ptr<RecvOp>& op) {
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
  } else if (p.in_payload && p.target_unexpected == u) {
    // The message is streaming in now (a point-to-point payload whose receive is posted once
    // its header was matched, the usual case): what has arrived is copied once, and the rest
    // goes straight into the receive's buffer, not through the unexpected one.
    if (p.payload_got > 0) std::memcpy(op->buf, u->data.get(), p.payload_got);
    p.target_unexpected.reset();
    p.target_recv = op;
  } else {
    u->waiter = op;
    op->source = std::move(u);
  }
}

void TcpShared::abandonSend(SendOp& op) {
  if (failed_ || op.done) return;
  op.abandoned = true;
  if (op.sent > 0 && op.bytes > 0) {  // mid-message: finish it from a copy to keep framing
    op.copy.assign(op.data, op.data + op.bytes);
    op.data = op.copy.data();
  }
}

void TcpShared::abandonRecv(RecvOp& op) {
  if (failed_ || op.done) return;
  op.abandoned = true;
  if (op.source) {
    op.source->waiter.reset();
    op.source.reset();
  }
}

void TcpShared::progress() {
  for (int g = 0; g < size(); ++g) {
    if (g == rank_ || peers_[g].closed || peers_[g].fd < 0) continue;
    writePeer(g);
    if (!peers_[g].closed) readPeer(g);
  }
}

void TcpShared::progressWrites() {
  for (int g = 0; g < size(); ++g) {
    if (g == rank_ || peers_[g].closed || peers_[g].fd < 0) continue;
    writePeer(g);
  }
}

void TcpShared::pollSet(std::vector<pollfd>& pfds) const {
  pfds.clear();
  for (int g = 0; g < size(); ++g) {
    const Peer& p = peers_[g];
    if (g == rank_ || p.closed || p.fd < 0) continue;
    short events = POLLIN;
    if (!p.sends.empty()) events |= POLLOUT;
    pfds.push_back({p.fd, events, 0});
  }
}

[[noreturn]] void TcpShared::sizeMismatch(int view_peer, MatchKey key, size_t recv_bytes,
                                          size_t msg_bytes) {
  failWith(
      MTXCOMM_INVALID_USAGE,
      strCat("message size mismatch with peer rank ", view_peer, " (tag ", key.second, ", context ",
             key.first, "): the receive is for ", recv_bytes, " bytes, the message has ", msg_bytes,
             " bytes (the ranks disagree on the call: a different collective, count, "
             "datatype or root)"));
}

int TcpShared::viewRank(uint64_t ctx, int gpeer) const {
  auto it = contexts_.find(ctx);
  if (it == contexts_.end()) return gpeer;
  auto m = std::find(it->second.begin(), it->second.end(), gpeer);
  return m == it->second.end() ? gpeer : static_cast<int>(m - it->second.begin());
}

void TcpShared::eraseIfEmpty(Peer& p, std::map<MatchKey, MatchQueue>::iterator it) {
  if (it->second.posted.empty() && it->second.unexpected.empty()) p.queues.erase(it);
}

void TcpShared::keepWireMessages() {
  for (auto& p : peers_) {
    if (p.sends.empty()) continue;
    SendOp& op = *p.sends.front();
    if (op.sent == 0 || op.done || op.bytes == 0 || op.data == op.copy.data()) continue;
    op.copy.assign(op.data, op.data + op.bytes);
    op.data = op.copy.data();
  }
}

void TcpShared::closePeer(int gpeer, const std::string& reason) {
  Peer& p = peers_[gpeer];
  p.closed = true;
  p.closed_reason = reason;
  ::shutdown(p.fd, SHUT_RDWR);  // the fd itself closes with the shared state
}

void TcpShared::writePeer(int gpeer) {
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

void TcpShared::sendControl(int gpeer, int32_t tag, uint64_t ctx, const std::string& payload) {
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

bool TcpShared::writeOp(int gpeer, SendOp& op) {
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

char* TcpShared::payloadDst(int gpeer, size_t n) {
  Peer& p = peers_[gpeer];
  if (p.control_tag != 0) return &p.control_payload[p.payload_got];
  if (p.target_recv) {
    return p.target_recv->abandoned ? nullptr : p.target_recv->buf + p.payload_got;
  }
  Unexpected& u = *p.target_unexpected;
  if (p.payload_got + n > u.capacity) {
    size_t cap = std::max(u.capacity * 2, p.payload_got + n);
    cap = std::min(std::max(cap, std::min(u.bytes, kUnexpectedFirstBytes)), u.bytes);
    std::unique_ptr<char[]> grown(new (std::nothrow) char[cap > 0 ? cap : 1]);
    if (!grown) {
      closePeer(gpeer, strCat("out of memory for an unexpected message of ", u.bytes, " bytes"));
      return nullptr;
    }
    if (p.payload_got > 0) std::memcpy(grown.get(), u.data.get(), p.payload_got);
    u.data = std::move(grown);
    u.capacity = cap;
  }
  return u.data.get() + p.payload_got;
}

void TcpShared::readPeer(int gpeer) {
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
      const size_t n = std::min(p.payload_bytes - p.payload_got, budget);
      direct = payloadDst(gpeer, n);  // large payload: straight into its destination
      if (p.closed) return;
      if (direct) want = n;
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

void TcpShared::consumeStage(int gpeer) {
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
      char* dst = payloadDst(gpeer, take);
      if (p.closed) return;
      if (dst) std::memcpy(dst, src, take);
      p.stage_begin += take;
      advancePayload(p, take);
    }
  }
}

void TcpShared::onHeader(int gpeer) {
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
  if (bytes > kMaxMessageBytes) {
    closePeer(gpeer, strCat("protocol error: a frame of ", bytes, " bytes (at most ",
                            kMaxMessageBytes, ")"));
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
    u->bytes = bytes;  // the buffer grows as the payload arrives (payloadDst)
    q.unexpected.push_back(u);
    p.target_unexpected = std::move(u);
  }
  if (bytes == 0) advancePayload(p, 0);
}

void TcpShared::advancePayload(Peer& p, size_t n) {
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

}  // namespace tcp
}  // namespace mtxcomm
