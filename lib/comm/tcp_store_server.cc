// TcpStore's server (lib/comm/tcp_store_server.h has the protocol and the bounds).
#include "lib/comm/tcp_store_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/socket_util.h"

namespace mtxcomm {
namespace {

constexpr uint8_t kOpSet = kStoreOpSet;
constexpr uint8_t kOpCheck = kStoreOpCheck;
constexpr uint64_t kMaxKeyBytes = kStoreMaxKeyBytes;
constexpr uint64_t kMaxValueBytes = kStoreMaxValueBytes;
constexpr uint64_t kMaxStoredBytes = 1ull << 30;
constexpr size_t kMaxUnsentBytes = 1u << 20;
constexpr size_t kMaxHandshakes = 256;

}  // namespace

TcpStoreServer::TcpStoreServer(const StoreHostPort& hp, const std::string& spec, int size,
                               const JobSecret& secret)
    : spec_(spec), size_(size), secret_(secret) {
  sockaddr_in addr = resolveIpv4(hp.host, hp.port, "store " + spec);
  listen_fd_ = listenTcp(&addr, /*reuse_addr=*/true);
  if (listen_fd_ < 0) {
    int err = errno;
    fail(MTXCOMM_SYSTEM_ERROR, "MTXCOMM_STORE=", spec, ": rank 0 cannot listen on ", hp.host, ":",
         hp.port, ": ", errnoText(err));
  }
  setNonBlocking(listen_fd_);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int err = errno;
    ::close(listen_fd_);
    fail(MTXCOMM_SYSTEM_ERROR, "store ", spec, ": pipe() failed: ", errnoText(err));
  }
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() {
  char c = 0;
  while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  for (auto& kv : clients_) ::close(kv.second.fd);
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TcpStoreServer::run() {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  for (;;) {
    pfds.clear();
    ids.clear();
    const auto now = Clock::now();
    const bool listening = now >= listenAgain_;
    const bool lingering = lingerUntil_ != Clock::time_point();
    if (lingering && (now >= lingerUntil_ || static_cast<int>(faultTold_.size()) >= size_)) {
      return;
    }
    pfds.push_back({lingering ? -1 : wake_[0], POLLIN, 0});
    pfds.push_back({listening ? listen_fd_ : -1, POLLIN, 0});
    Clock::time_point wake = listening ? Clock::time_point::max() : listenAgain_;
    if (lingering) wake = std::min(wake, lingerUntil_);
    for (auto& kv : clients_) {
      const Client& c = kv.second;
      short events = 0;
      if (c.hs) {
        events = c.hs->pollEvents();
        wake = std::min(wake, c.hs->deadline());
      } else {
        if (c.out.size() <= kMaxUnsentBytes) events |= POLLIN;
        if (!c.out.empty()) events |= POLLOUT;
      }
      pfds.push_back({c.fd, events, 0});
      ids.push_back(kv.first);
    }
    const int timeout = wake == Clock::time_point::max() ? -1 : msLeft(wake);
    int rc = ::poll(pfds.data(), pfds.size(), timeout);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return;  // Nothing sensible to do; clients will see their connection hang up.
    }
    if (pfds[0].revents != 0) {
      // A byte 'f': rank 0 reports a fault (reportFault); 0: stopping. A faulty job's rank 0
      // fails at once; its server lingers (up to 2 s, until every rank was told) so that the
      // other ranks get the fault's message, not a reset.
      char bytes[64];
      bool stop = false;
      for (ssize_t n; (n = ::read(wake_[0], bytes, sizeof(bytes))) > 0;) {
        for (ssize_t i = 0; i < n; ++i) stop = stop || bytes[i] == 0;
      }
      std::string reported;
      {
        std::lock_guard<std::mutex> lock(faultMu_);
        reported = std::move(reportedFault_);
        reportedFault_.clear();
      }
      if (!reported.empty()) setFault(reported);
      if (!stop) continue;
      if (fault_.empty()) return;
      lingerUntil_ = Clock::now() + std::chrono::seconds(2);
      continue;
    }
    if (listening && (pfds[1].revents & POLLIN)) acceptClients();
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = clients_.find(ids[i]);
      if (it == clients_.end()) continue;
      const short revents = pfds[i + 2].revents;
      if (it->second.hs) {
        if (revents != 0 || Clock::now() >= it->second.hs->deadline()) handshake(ids[i]);
        continue;
      }
      if (revents == 0) continue;
      bool ok = true;
      if (revents & (POLLIN | POLLHUP | POLLERR)) ok = readClient(ids[i]);
      if (ok && (revents & POLLOUT)) {
        ok = flushClient(it->second);
        // Requests held back while the answers piled up: parse them now.
        if (ok && !it->second.in.empty() && it->second.out.size() <= kMaxUnsentBytes) {
          ok = readClient(ids[i]);
        }
      }
      if (!ok) dropClient(ids[i]);
    }
  }
}

void TcpStoreServer::acceptClients() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors (a flood of connections): say so once, and stop accepting for a
        // moment rather than spin on a listener that stays readable.
        if (!emfileWarned_) {
          MTXCOMM_LOG(kWarn, 0, "store ", spec_, ": accept failed: ", errnoText(errno),
                      " (the process's file descriptor limit, ulimit -n; too many "
                      "connections to the store's port?)");
          emfileWarned_ = true;
        }
        listenAgain_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    setNoDelay(fd);
    if (handshakes_ >= kMaxHandshakes) dropOldestHandshake();
    Client& c = clients_[next_id_++];
    c.fd = fd;
    c.hs = std::make_unique<AcceptorHandshake>(
        fd, secret_, kAuthStore,
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(AcceptorHandshake::kHandshakeSeconds)));
    ++handshakes_;
  }
}

void TcpStoreServer::logDrop(int fd, const std::string& why) {
  constexpr uint64_t kLoggedDrops = 20;
  ++drops_;
  if (drops_ <= kLoggedDrops || drops_ % 1000 == 0) {
    MTXCOMM_LOG(kWarn, 0, "store ", spec_, ": dropped a connection from ", peerAddress(fd), ": ",
                why,
                drops_ == kLoggedDrops  ? " (from now on one line per 1000 drops)"
                : drops_ > kLoggedDrops ? strCat(" (", drops_, " dropped so far)")
                                        : std::string());
  }
}

void TcpStoreServer::dropOldestHandshake() {
  for (auto& kv : clients_) {
    if (!kv.second.hs) continue;
    logDrop(kv.second.fd, "too many handshakes in progress");
    dropClient(kv.first);
    return;
  }
}

void TcpStoreServer::handshake(uint64_t id) {
  Client& c = clients_[id];
  AcceptorHandshake::State st = c.hs->progress();
  if (st == AcceptorHandshake::State::kPending && Clock::now() >= c.hs->deadline()) {
    st = AcceptorHandshake::State::kFailed;
  }
  if (st == AcceptorHandshake::State::kPending) return;
  if (st == AcceptorHandshake::State::kFailed) {
    if (c.hs->why().find("prove") != std::string::npos) refused_.fetch_add(1);
    logDrop(c.fd, c.hs->why().empty() ? "no handshake within the deadline" : c.hs->why());
    dropClient(id);
    return;
  }
  std::memcpy(&c.claim, c.hs->response().claim, sizeof(c.claim));
  c.hs.reset();
  --handshakes_;
  // The client holds the secret: a process of this job. What it claims must fit the job.
  const StoreClaim& claim = c.claim;
  if (claim.size != size_) {
    setFault(strCat("rank ", claim.rank, " has MTXCOMM_SIZE=", claim.size, " but rank 0 has ",
                    "MTXCOMM_SIZE=", size_, ": every rank must be started with the same size"));
  } else if (claim.rank < 0 || claim.rank >= size_) {
    setFault(strCat("a process claims MTXCOMM_RANK=", claim.rank, ", not in [0, ", size_, ")"));
  } else {
    auto [it, fresh] = processOf_.emplace(claim.rank, claim.process);
    if (!fresh && it->second != claim.process) {
      setFault(strCat("two processes claim MTXCOMM_RANK=", claim.rank, " (the second from ",
                      peerAddress(c.fd), "): every rank needs its own MTXCOMM_RANK"));
    }
  }
}

void TcpStoreServer::reportFault(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(faultMu_);
    reportedFault_ = message;
  }
  char c = 'f';
  while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
  }
}

void TcpStoreServer::setFault(const std::string& message) {
  if (!fault_.empty()) return;
  fault_ = message;
  {
    std::lock_guard<std::mutex> lock(faultMu_);
    faultCopy_ = message;
  }
  MTXCOMM_LOG(kError, 0, "store ", spec_, ": ", message);
  for (auto& w : waiting_) {
    for (uint64_t waiter : w.second) {
      auto wc = clients_.find(waiter);
      if (wc != clients_.end()) appendFault(wc->second);
    }
  }
  waiting_.clear();
  for (auto& kv : clients_) {
    if (!kv.second.hs && !kv.second.out.empty()) flushClient(kv.second);
  }
}

bool TcpStoreServer::readClient(uint64_t id) {
  Client& c = clients_[id];
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) return false;
    c.in.append(buf, static_cast<size_t>(n));
    if (c.in.size() > kMaxValueBytes + kMaxKeyBytes + 64) break;  // parse before reading on
  }
  // Parse every complete request.
  size_t pos = 0;
  while (c.out.size() <= kMaxUnsentBytes) {
    StoreRequest req;
    const StoreParse parsed = parseStoreRequest(std::string_view(c.in).substr(pos), &req);
    if (parsed == StoreParse::kIncomplete) break;
    if (parsed == StoreParse::kBadOp || parsed == StoreParse::kKeyTooLong) {
      MTXCOMM_LOG(kWarn, 0, "store ", spec_, ": dropped rank ", c.claim.rank,
                  "'s connection: a malformed request (op ", int(req.op), ", key of ", req.keyBytes,
                  " bytes)");
      return false;
    }
    if (parsed == StoreParse::kValueTooLong) {
      MTXCOMM_LOG(kWarn, 0, "store ", spec_, ": dropped rank ", c.claim.rank,
                  "'s connection: a value of ", req.valueBytes, " bytes (at most ", kMaxValueBytes,
                  ")");
      return false;
    }
    const uint8_t op = req.op;
    std::string key(req.key);
    pos += req.used;
    if (op == kOpSet) {
      std::string value(req.value);
      auto old = data_.find(key);
      const uint64_t after = stored_ + value.size() + key.size() -
                             (old == data_.end() ? 0 : old->second.size() + key.size());
      if (!fault_.empty()) {
        appendFault(c);
      } else if (after > kMaxStoredBytes) {
        setFault(strCat("the store is full (", kMaxStoredBytes, " bytes of keys and values)"));
        appendFault(c);
      } else {
        stored_ = after;
        c.out.push_back(static_cast<char>(kStoreStatusOk));
        auto w = waiting_.find(key);
        if (w != waiting_.end()) {
          for (uint64_t waiter : w->second) {
            auto wc = clients_.find(waiter);
            if (wc != clients_.end()) appendValue(wc->second, value);
          }
          waiting_.erase(w);
        }
        data_[key] = std::move(value);
      }
    } else if (!fault_.empty()) {
      appendFault(c);
    } else if (op == kOpCheck) {
      c.out.push_back(static_cast<char>(kStoreStatusOk));
    } else {
      auto d = data_.find(key);
      if (d != data_.end()) {
        appendValue(c, d->second);
      } else {
        waiting_[key].push_back(id);
      }
    }
  }
  c.in.erase(0, pos);
  // Flush what this round produced, for every client it concerns (SET may wake others).
  for (auto& kv : clients_) {
    if (!kv.second.hs && !kv.second.out.empty() && !flushClient(kv.second) && kv.first == id) {
      return false;
    }
  }
  return true;
}

void TcpStoreServer::appendValue(Client& c, const std::string& value) {
  uint64_t len = value.size();
  c.out.push_back(static_cast<char>(kStoreStatusOk));
  c.out.append(reinterpret_cast<const char*>(&len), 8);
  c.out += value;
}

void TcpStoreServer::appendFault(Client& c) {
  if (c.claim.rank >= 0 && c.claim.rank < size_) faultTold_.insert(c.claim.rank);
  uint64_t len = fault_.size();
  c.out.push_back(static_cast<char>(kStoreStatusFault));
  c.out.append(reinterpret_cast<const char*>(&len), 8);
  c.out += fault_;
}

bool TcpStoreServer::flushClient(Client& c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) return false;
    sent += static_cast<size_t>(n);
  }
  c.out.erase(0, sent);
  return true;
}

void TcpStoreServer::dropClient(uint64_t id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  if (it->second.hs) --handshakes_;
  ::close(it->second.fd);
  clients_.erase(it);
  for (auto w = waiting_.begin(); w != waiting_.end();) {
    auto& v = w->second;
    v.erase(std::remove(v.begin(), v.end(), id), v.end());
    w = v.empty() ? waiting_.erase(w) : std::next(w);
  }
}

}  // namespace mtxcomm
