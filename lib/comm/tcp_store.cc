// TcpStore: the bootstrap store over a small server that rank 0 runs in a thread
// (MTXCOMM_STORE=tcp:HOST:PORT, lib/comm/stores.h).
//
// Every connection first passes the job-secret handshake (lib/base/auth.h, channel kAuthStore):
// the claim is a StoreClaim {rank, size, process nonce}. The server serves nothing before the
// proof, drives every handshake without blocking (a silent connection costs only its own
// deadline of a few seconds), and drops a failed one with a WARN naming its address.
//
// TcpStore wire protocol, after the handshake (host byte order: every rank of a job runs the
// same binary):
//   request   u8 op (1 = SET, 2 = GET, 3 = CHECK), u64 key length, key, and for SET u64 value
//             length, value (CHECK: an empty key)
//   response  SET: u8 0 once stored.  GET: u8 0, u64 value length, value — sent only once the key
//             exists (the server holds pending GETs), so a client waits with one poll(2).
//             CHECK: u8 0 at once (Store::check).
//             Any request: u8 1, u64 length, message — the job is faulty (two processes claim
//             one rank, a rank has another MTXCOMM_SIZE, the store is full): every rank's next
//             request fails with that message, so the whole job stops at once naming the cause.
// Bounds: keys up to 4 KiB, values up to 64 MiB, 1 GiB of values in all; a client's requests
// are not read while more than 1 MiB of answers to it is unsent (a client that never reads
// costs at most one value); at most 256 handshakes in progress (the oldest is dropped).
// A client whose GET times out drops its connection (the late answer would otherwise be read as
// the answer to its next request) and reconnects on its next call, with the same claim.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "lib/base/auth.h"
#include "lib/base/backoff.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/socket_util.h"
#include "lib/comm/store_wire.h"
#include "lib/comm/stores.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

constexpr uint8_t kOpSet = kStoreOpSet;
constexpr uint8_t kOpGet = kStoreOpGet;
constexpr uint8_t kOpCheck = kStoreOpCheck;
constexpr uint64_t kMaxKeyBytes = kStoreMaxKeyBytes;
constexpr uint64_t kMaxValueBytes = kStoreMaxValueBytes;
constexpr uint64_t kMaxStoredBytes = 1ull << 30;
constexpr size_t kMaxUnsentBytes = 1u << 20;
constexpr size_t kMaxHandshakes = 256;
constexpr uint8_t kStatusOk = 0;
constexpr uint8_t kStatusFault = 1;

// Who a client says it is (AuthResponse::claim).
struct StoreClaim {
  int32_t rank;
  int32_t size;
  uint64_t process;  // a random number of the process: its reconnections are not duplicates
  uint64_t pad[2];
};
static_assert(sizeof(StoreClaim) == 32, "the handshake's claim is 32 bytes");

struct HostPort {
  std::string host;
  int port = 0;
};

// ---- TcpStore server ------------------------------------------------------------------------

// Runs in a thread of rank 0. One poll(2) loop over the listening socket, a self-pipe (written by
// the destructor to stop it) and the clients; per-client input and output buffers, so a slow
// client never blocks the others.
class TcpStoreServer {
 public:
  TcpStoreServer(const HostPort& hp, const std::string& spec, int size, const JobSecret& secret)
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

  ~TcpStoreServer() {
    char c = 0;
    while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    for (auto& kv : clients_) ::close(kv.second.fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

 private:
  struct Client {
    int fd = -1;
    std::unique_ptr<AcceptorHandshake> hs;  // until the client proved the secret
    StoreClaim claim{};
    std::string in;
    std::string out;
  };

  void run() {
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

  void acceptClients() {
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

  // A WARN per dropped stranger for the first kLoggedDrops, then one line per 1000 (a flood
  // must not fill the log).
  void logDrop(int fd, const std::string& why) {
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

  void dropOldestHandshake() {
    for (auto& kv : clients_) {
      if (!kv.second.hs) continue;
      logDrop(kv.second.fd, "too many handshakes in progress");
      dropClient(kv.first);
      return;
    }
  }

  void handshake(uint64_t id) {
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

 public:
  // From any thread: the job is faulty (rank 0's init failed with message); every client's next
  // request is answered with it.
  void reportFault(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(faultMu_);
      reportedFault_ = message;
    }
    char c = 'f';
    while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
    }
  }

  // Connections that failed to prove the job secret (any thread).
  uint64_t refused() const { return refused_.load(); }

  // The job's fault, or "" (any thread).
  std::string fault() const {
    std::lock_guard<std::mutex> lock(faultMu_);
    return faultCopy_;
  }

 private:
  // From now on every request of every client is answered with message.
  void setFault(const std::string& message) {
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

  // False when the client is gone or misbehaves.
  bool readClient(uint64_t id) {
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
                    "'s connection: a malformed request (op ", int(req.op), ", key of ",
                    req.keyBytes, " bytes)");
        return false;
      }
      if (parsed == StoreParse::kValueTooLong) {
        MTXCOMM_LOG(kWarn, 0, "store ", spec_, ": dropped rank ", c.claim.rank,
                    "'s connection: a value of ", req.valueBytes, " bytes (at most ",
                    kMaxValueBytes, ")");
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
          c.out.push_back(static_cast<char>(kStatusOk));
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
        c.out.push_back(static_cast<char>(kStatusOk));
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

  static void appendValue(Client& c, const std::string& value) {
    uint64_t len = value.size();
    c.out.push_back(static_cast<char>(kStatusOk));
    c.out.append(reinterpret_cast<const char*>(&len), 8);
    c.out += value;
  }

  void appendFault(Client& c) {
    if (c.claim.rank >= 0 && c.claim.rank < size_) faultTold_.insert(c.claim.rank);
    uint64_t len = fault_.size();
    c.out.push_back(static_cast<char>(kStatusFault));
    c.out.append(reinterpret_cast<const char*>(&len), 8);
    c.out += fault_;
  }

  // False on a write error. Leaves what the socket does not take for POLLOUT.
  static bool flushClient(Client& c) {
    size_t sent = 0;
    while (sent < c.out.size()) {
      ssize_t n =
          ::send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) return false;
      sent += static_cast<size_t>(n);
    }
    c.out.erase(0, sent);
    return true;
  }

  void dropClient(uint64_t id) {
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

  const std::string spec_;
  const int size_;
  const JobSecret& secret_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  uint64_t next_id_ = 0;
  size_t handshakes_ = 0;
  bool emfileWarned_ = false;
  Clock::time_point listenAgain_{};
  uint64_t drops_ = 0;                // strangers dropped (logDrop)
  std::atomic<uint64_t> refused_{0};  // of which failed to prove the job secret
  Clock::time_point lingerUntil_{};   // stopping a faulty job: serve its fault until then,
  std::set<int> faultTold_;           // or until every rank was answered with it
  std::map<uint64_t, Client> clients_;
  std::map<std::string, std::string> data_;
  uint64_t stored_ = 0;
  std::map<std::string, std::vector<uint64_t>> waiting_;  // key -> client ids
  std::map<int, uint64_t> processOf_;                     // rank -> StoreClaim::process
  std::string fault_;
  mutable std::mutex faultMu_;
  std::string faultCopy_;      // fault_, for other threads
  std::string reportedFault_;  // from reportFault, for the server thread
};

// ---- TcpStore client ------------------------------------------------------------------------

class TcpStore : public Store {
 public:
  TcpStore(std::string spec, HostPort hp, int rank, int size, Ms timeout, JobSecret secret)
      : spec_(std::move(spec)), hp_(std::move(hp)), timeout_(timeout), secret_(std::move(secret)) {
    claim_.rank = rank;
    claim_.size = size;
    const Nonce n = randomNonce();
    std::memcpy(&claim_.process, n.data(), sizeof(claim_.process));
    if (rank == 0) server_ = std::make_unique<TcpStoreServer>(hp_, spec_, size, secret_);
    connectToServer(Clock::now() + timeout_);
  }

  ~TcpStore() override {
    closeConnection();
    server_.reset();  // After our own client is closed: stops the server thread.
  }

  const JobSecret& secret() const override { return secret_; }

  void reportFault(const std::string& message) override {
    if (server_) server_->reportFault(message);
  }

  std::string diagnosis() const override {
    const uint64_t n = server_ ? server_->refused() : 0;
    if (n == 0) return "";
    return strCat(n, " connection(s) to the store failed to prove the job secret: is ",
                  "MTXCOMM_JOB_SECRET the same on every rank?");
  }

  void check() override {
    if (server_) {
      const std::string f = server_->fault();
      if (!f.empty()) fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": ", f);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    if (now < nextCheck_) return;
    nextCheck_ = now + std::chrono::milliseconds(200);
    const auto deadline = now + timeout_;
    if (fd_ < 0) connectToServer(deadline);
    askServerForFault(deadline, timeout_);
  }

  std::string knownFault(Ms budget) override {
    if (server_) {
      const std::string f = server_->fault();
      return f.empty() ? f : strCat("store ", spec_, ": ", f);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) return "";
    try {
      askServerForFault(Clock::now() + budget, budget);
    } catch (const Error& e) {
      if (e.code() == MTXCOMM_INVALID_USAGE) return e.what();
    }
    return "";
  }

  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + timeout_;
    if (fd_ < 0) connectToServer(deadline);
    std::string req;
    uint64_t klen = key.size(), vlen = value.size();
    req.push_back(static_cast<char>(kOpSet));
    req.append(reinterpret_cast<const char*>(&klen), 8);
    req += key;
    req.append(reinterpret_cast<const char*>(&vlen), 8);
    req += value;
    sendRequest(req, key);
    receiveStatus(deadline, key, timeout_);
  }

  std::string get(const std::string& key, Ms timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + timeout;
    if (fd_ < 0) connectToServer(deadline);
    std::string req;
    uint64_t klen = key.size();
    req.push_back(static_cast<char>(kOpGet));
    req.append(reinterpret_cast<const char*>(&klen), 8);
    req += key;
    sendRequest(req, key);
    receiveStatus(deadline, key, timeout);
    uint64_t len;
    receive(&len, 8, deadline, key, timeout);
    if (len > kMaxValueBytes) {
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": bad answer for key '", key, "'");
    }
    std::string value(len, '\0');
    receive(value.data(), len, deadline, key, timeout);
    return value;
  }

 private:
  // Connects and passes the handshake, retrying until deadline: rank 0 may start its server
  // after the others, and a server flooded by strangers may drop a handshake. The handshake
  // itself has the server's own short deadline (AcceptorHandshake::kHandshakeSeconds): rank 0's
  // server sends its challenge as soon as it accepts, so a process that accepted the connection
  // and stays silent is not this job's store (another program on the port, a stopped server)
  // and must not hold this rank for the whole bootstrap timeout. A refused connection (the
  // server not up yet) is still retried until deadline.
  void connectToServer(Clock::time_point deadline) {
    sockaddr_in addr = resolveIpv4(hp_.host, hp_.port, "store " + spec_);
    uint8_t claim[32];
    std::memcpy(claim, &claim_, sizeof(claim));
    int refusals = 0;
    for (;;) {
      int last_err = 0;
      UniqueFd fd(connectWithRetry(addr, deadline, &last_err, "store " + spec_));
      if (fd.get() < 0) {
        fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout_),
             " s connecting to store server ", spec_, " (last error: ", errnoText(last_err), ")");
      }
      setNoDelay(fd.get());
      bool refused = false;
      const auto handshakeBound = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(AcceptorHandshake::kHandshakeSeconds));
      const auto handshakeDeadline = std::min(deadline, Clock::now() + handshakeBound);
      try {
        connectorHandshake(fd.get(), secret_, kAuthStore, claim, handshakeDeadline,
                           "store " + spec_ + " (rank 0's server)", &refused);
      } catch (const Error& e) {
        if (e.code() == MTXCOMM_TIMEOUT && handshakeDeadline < deadline) {
          fail(MTXCOMM_TIMEOUT, "store ", spec_, ": the process listening on ", hp_.host, ":",
               hp_.port, " accepted the connection but did not answer the handshake within ",
               secondsText(handshakeBound),
               " s (not rank 0's store server: another program on the port, or a stopped "
               "server?)");
        }
        // Closed mid-handshake: the server dropped it under a flood; try again. Closed three
        // times after this rank's proof: the server refuses it (another secret). Anything else
        // (not a store) is final.
        if (e.code() != MTXCOMM_REMOTE_ERROR || Clock::now() >= deadline) throw;
        if (refused && ++refusals >= 3) {
          fail(MTXCOMM_INVALID_USAGE, "store ", spec_,
               ": rank 0's server refused this rank's proof of the job secret 3 times: "
               "MTXCOMM_JOB_SECRET (or MTXCOMM_JOB_SECRET_FILE) must be the same on every rank");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      fd_ = fd.release();
      return;
    }
  }

  void sendRequest(const std::string& req, const std::string& key) {
    if (!sendAll(fd_, req.data(), req.size())) {
      int err = errno;
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": lost the connection to the server (",
           errnoText(err), ") sending key '", key, "'");
    }
  }

  // One check request over the open connection: returns when the server knows no fault, throws
  // MTXCOMM_INVALID_USAGE with the job's fault (a size mismatch, a duplicate rank) otherwise.
  void askServerForFault(Clock::time_point deadline, Ms timeout) {
    std::string req(1, static_cast<char>(kOpCheck));
    const uint64_t klen = 0;
    req.append(reinterpret_cast<const char*>(&klen), 8);
    sendRequest(req, "(check)");
    receiveStatus(deadline, "(check)", timeout);
  }

  // The status byte of an answer; a fault answer throws MTXCOMM_INVALID_USAGE with its message.
  void receiveStatus(Clock::time_point deadline, const std::string& key, Ms timeout) {
    uint8_t status;
    receive(&status, 1, deadline, key, timeout);
    if (status == kStatusOk) return;
    uint64_t len = 0;
    if (status == kStatusFault) receive(&len, 8, deadline, key, timeout);
    if (status != kStatusFault || len > kMaxKeyBytes) {
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": bad answer for key '", key, "'");
    }
    std::string message(len, '\0');
    receive(message.data(), len, deadline, key, timeout);
    closeConnection();
    fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": ", message);
  }

  void receive(void* buf, size_t n, Clock::time_point deadline, const std::string& key,
               Ms timeout) {
    IoResult r = recvAll(fd_, buf, n, deadline);
    if (r == IoResult::kOk) return;
    int err = errno;
    closeConnection();  // A late answer must not be taken for the next request's.
    if (r == IoResult::kTimeout) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s waiting for key '", key,
           "' in store ", spec_);
    }
    fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": the server closed the connection (",
         r == IoResult::kEof ? std::string("EOF") : errnoText(err), ") waiting for key '", key,
         "'");
  }

  void closeConnection() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  const std::string spec_;
  const HostPort hp_;
  const Ms timeout_;
  const JobSecret secret_;
  StoreClaim claim_{};
  std::mutex mu_;
  Clock::time_point nextCheck_{};
  int fd_ = -1;
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace

std::unique_ptr<Store> makeTcpStore(const std::string& spec, const std::string& host, int port,
                                    int rank, int size, Ms timeout, const JobSecret& secret) {
  return std::make_unique<TcpStore>(spec, HostPort{host, port}, rank, size, timeout, secret);
}

}  // namespace mtxcomm
