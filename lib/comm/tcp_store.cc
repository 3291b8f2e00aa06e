// TcpStore: the bootstrap store over a small server that rank 0 runs in a thread
// (MTXCOMM_STORE=tcp:HOST:PORT, lib/comm/stores.h).
//
// TcpStore wire protocol (host byte order: every rank of a job runs the same binary):
//   request   u8 op (1 = SET, 2 = GET), u64 key length, key, and for SET u64 value length, value
//   response  SET: u8 0 once stored.  GET: u8 0, u64 value length, value — sent only once the key
//             exists (the server holds pending GETs), so a client waits with one poll(2).
// A client whose GET times out drops its connection (the late answer would otherwise be read as
// the answer to its next request) and reconnects on its next call.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "lib/base/backoff.h"
#include "lib/base/error.h"
#include "lib/base/socket_util.h"
#include "lib/comm/stores.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

constexpr uint8_t kOpSet = 1;
constexpr uint8_t kOpGet = 2;
constexpr uint64_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = 64ull << 20;

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
  TcpStoreServer(const HostPort& hp, const std::string& spec) {
    sockaddr_in addr = resolveIpv4(hp.host, hp.port, "store " + spec);
    listen_fd_ = listenTcp(&addr, /*reuse_addr=*/true);
    if (listen_fd_ < 0) {
      int err = errno;
      fail(MTXCOMM_SYSTEM_ERROR, "MTXCOMM_STORE=", spec, ": rank 0 cannot listen on ", hp.host, ":",
           hp.port, ": ", errnoText(err));
    }
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
    std::string in;
    std::string out;
  };

  void run() {
    std::vector<pollfd> pfds;
    std::vector<uint64_t> ids;
    for (;;) {
      pfds.clear();
      ids.clear();
      pfds.push_back({wake_[0], POLLIN, 0});
      pfds.push_back({listen_fd_, POLLIN, 0});
      for (auto& kv : clients_) {
        short events = POLLIN;
        if (!kv.second.out.empty()) events |= POLLOUT;
        pfds.push_back({kv.second.fd, events, 0});
        ids.push_back(kv.first);
      }
      int rc = ::poll(pfds.data(), pfds.size(), -1);
      if (rc < 0) {
        if (errno == EINTR) continue;
        return;  // Nothing sensible to do; clients will see their connection hang up.
      }
      if (pfds[0].revents != 0) return;
      if (pfds[1].revents & POLLIN) acceptClient();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (pfds[i + 2].revents == 0) continue;
        auto it = clients_.find(ids[i]);
        if (it == clients_.end()) continue;
        bool ok = true;
        if (pfds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) ok = readClient(ids[i]);
        if (ok && (pfds[i + 2].revents & POLLOUT)) ok = flushClient(it->second);
        if (!ok) dropClient(ids[i]);
      }
    }
  }

  void acceptClient() {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    setNoDelay(fd);
    clients_[next_id_++].fd = fd;
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
    }
    // Parse every complete request.
    size_t pos = 0;
    for (;;) {
      size_t p = pos;
      uint8_t op;
      uint64_t klen, vlen = 0;
      if (!take(c.in, p, &op, 1) || !take(c.in, p, &klen, 8)) break;
      if ((op != kOpSet && op != kOpGet) || klen > kMaxKeyBytes) return false;
      if (c.in.size() - p < klen) break;
      std::string key = c.in.substr(p, klen);
      p += klen;
      if (op == kOpSet) {
        if (!take(c.in, p, &vlen, 8)) break;
        if (vlen > kMaxValueBytes) return false;
        if (c.in.size() - p < vlen) break;
        std::string value = c.in.substr(p, vlen);
        p += vlen;
        c.out.push_back(0);
        data_[key] = value;
        auto w = waiting_.find(key);
        if (w != waiting_.end()) {
          for (uint64_t waiter : w->second) {
            auto wc = clients_.find(waiter);
            if (wc != clients_.end()) appendValue(wc->second, value);
          }
          waiting_.erase(w);
        }
      } else {
        auto d = data_.find(key);
        if (d != data_.end()) {
          appendValue(c, d->second);
        } else {
          waiting_[key].push_back(id);
        }
      }
      pos = p;
    }
    c.in.erase(0, pos);
    // Flush what this round produced, for every client it concerns (SET may wake others).
    for (auto& kv : clients_) {
      if (!kv.second.out.empty() && !flushClient(kv.second) && kv.first == id) return false;
    }
    return true;
  }

  static bool take(const std::string& in, size_t& pos, void* dst, size_t n) {
    if (in.size() - pos < n) return false;
    std::memcpy(dst, in.data() + pos, n);
    pos += n;
    return true;
  }

  static void appendValue(Client& c, const std::string& value) {
    uint64_t len = value.size();
    c.out.push_back(0);
    c.out.append(reinterpret_cast<const char*>(&len), 8);
    c.out += value;
  }

  // False on a write error. Leaves what the socket does not take for POLLOUT.
  static bool flushClient(Client& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0) return false;
      c.out.erase(0, static_cast<size_t>(n));
    }
    return true;
  }

  void dropClient(uint64_t id) {
    auto it = clients_.find(id);
    if (it == clients_.end()) return;
    ::close(it->second.fd);
    clients_.erase(it);
    for (auto w = waiting_.begin(); w != waiting_.end();) {
      auto& v = w->second;
      for (size_t i = 0; i < v.size();) {
        if (v[i] == id) {
          v.erase(v.begin() + i);
        } else {
          ++i;
        }
      }
      w = v.empty() ? waiting_.erase(w) : std::next(w);
    }
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, Client> clients_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::vector<uint64_t>> waiting_;  // key -> client ids
};

// ---- TcpStore client ------------------------------------------------------------------------

class TcpStore : public Store {
 public:
  TcpStore(std::string spec, HostPort hp, int rank, Ms timeout)
      : spec_(std::move(spec)), hp_(std::move(hp)), timeout_(timeout) {
    if (rank == 0) server_ = std::make_unique<TcpStoreServer>(hp_, spec_);
    connectToServer(Clock::now() + timeout_);
  }

  ~TcpStore() override {
    closeConnection();
    server_.reset();  // After our own client is closed: stops the server thread.
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
    uint8_t status;
    receive(&status, 1, deadline, key, timeout_);
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
    uint8_t status;
    uint64_t len;
    receive(&status, 1, deadline, key, timeout);
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
  // Connects, retrying until deadline: rank 0 may start its server after the others.
  void connectToServer(Clock::time_point deadline) {
    sockaddr_in addr = resolveIpv4(hp_.host, hp_.port, "store " + spec_);
    int last_err = 0;
    int fd = connectWithRetry(addr, deadline, &last_err, "store " + spec_);
    if (fd < 0) {
      fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout_),
           " s connecting to store server ", spec_, " (last error: ", errnoText(last_err), ")");
    }
    setNoDelay(fd);
    fd_ = fd;
  }

  void sendRequest(const std::string& req, const std::string& key) {
    if (!sendAll(fd_, req.data(), req.size())) {
      int err = errno;
      closeConnection();
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": lost the connection to the server (",
           errnoText(err), ") sending key '", key, "'");
    }
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
  std::mutex mu_;
  int fd_ = -1;
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace

std::unique_ptr<Store> makeTcpStore(const std::string& spec, const std::string& host, int port,
                                    int rank, Ms timeout) {
  return std::make_unique<TcpStore>(spec, HostPort{host, port}, rank, timeout);
}

}  // namespace mtxcomm
