// Bootstrap stores (see store.h): FileStore over a shared directory and TcpStore over a small
// server that rank 0 runs in a thread.
//
// TcpStore wire protocol (host byte order: every rank of a job runs the same binary):
//   request   u8 op (1 = SET, 2 = GET), u64 key length, key, and for SET u64 value length, value
//   response  SET: u8 0 once stored.  GET: u8 0, u64 value length, value — sent only once the key
//             exists (the server holds pending GETs), so a client waits with one poll(2).
// A client whose GET times out drops its connection (the late answer would otherwise be read as
// the answer to its next request) and reconnects on its next call.
#include "lib/store.h"

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

#include "lib/backoff.h"
#include "lib/error.h"
#include "lib/socket_util.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

constexpr uint8_t kOpSet = 1;
constexpr uint8_t kOpGet = 2;
constexpr uint64_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = 64ull << 20;

// 16 random hex digits (a job id, a join nonce, a temporary-file tag).
std::string randomHex() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(::getpid()) << 32));
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

// ---- FileStore ------------------------------------------------------------------------------

// Names in the store directory (see store.h). Everything this store creates at the top level
// starts with kPrefix; rank 0 of a new job removes such entries, and nothing else.
constexpr char kPrefix[] = "mtxcomm.";
constexpr char kJobPrefix[] = "mtxcomm.job.";      // + job id: a directory holding the keys
constexpr char kHelloPrefix[] = "mtxcomm.hello.";  // + rank "." nonce: a rank asks to join
constexpr char kAckPrefix[] = "mtxcomm.ack.";      // + nonce: rank 0's answer, the job id
constexpr char kTmpPrefix[] = "mtxcomm.tmp.";      // a file being written, before its rename

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool isHex16(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// Keys may hold '/' and other characters a file name cannot: escape everything but [A-Za-z0-9_-].
std::string escapeKey(const std::string& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

void makeDirs(const std::string& path, const std::string& spec) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      fail(MTXCOMM_SYSTEM_ERROR, "MTXCOMM_STORE=", spec, ": cannot create directory '", prefix,
           "': ", errnoText(errno));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    fail(MTXCOMM_SYSTEM_ERROR, "MTXCOMM_STORE=", spec, ": '", path, "' is not a directory");
  }
}

// The names in dir (none when it cannot be read).
std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

class FileStore : public Store {
 public:
  FileStore(std::string spec, std::string path, int rank, int size, Ms timeout)
      : spec_(std::move(spec)), dir_(std::move(path)) {
    makeDirs(dir_, spec_);
    const auto deadline = Clock::now() + timeout;
    if (rank == 0) {
      removeStaleEntries();
      job_ = randomHex();
      const std::string job_dir = dir_ + "/" + kJobPrefix + job_;
      if (::mkdir(job_dir.c_str(), 0700) != 0) {
        fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot create directory '", job_dir,
             "': ", errnoText(errno));
      }
      if (size > 1) admitRanks(size, deadline, timeout);
    } else {
      joinJob(rank, deadline, timeout);
    }
    job_dir_ = dir_ + "/" + kJobPrefix + job_;
  }

  void set(const std::string& key, const std::string& value) override {
    writeAtomically(job_dir_, escapeKey(key), value);
  }

  std::string get(const std::string& key, Ms timeout) override {
    const std::string path = job_dir_ + "/" + escapeKey(key);
    const auto deadline = Clock::now() + timeout;
    // Every poll is a syscall: skip the spinning phase, go to short sleeps (capped at 1 ms).
    Backoff backoff(/*spins=*/0, /*yields=*/16);
    std::string value;
    while (!readIfExists(path, &value)) {
      if (Clock::now() >= deadline) {
        fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s waiting for key '", key,
             "' in store ", spec_);
      }
      backoff.pause();
    }
    return value;
  }

 private:
  // Rank 0, before anyone of this job can read a key: removes what earlier jobs left (their job
  // directories, join requests and answers, temporary files). Join requests of this job's ranks
  // that started earlier are removed too; those ranks make them again.
  void removeStaleEntries() {
    for (const std::string& name : listDir(dir_)) {
      if (!startsWith(name, kPrefix)) continue;
      std::error_code ec;
      std::filesystem::remove_all(dir_ + "/" + name, ec);
      if (ec && ec != std::errc::no_such_file_or_directory) {
        fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot remove the stale entry '", dir_, "/",
             name, "' of an earlier job: ", ec.message());
      }
    }
  }

  // Rank 0: answers the join request of every other rank with the job id. Two requests for one
  // rank mean two jobs share the directory.
  void admitRanks(int size, Clock::time_point deadline, Ms timeout) {
    std::vector<std::string> nonce_of(size);
    int missing = size - 1;
    Backoff backoff(/*spins=*/0, /*yields=*/16);
    while (missing > 0) {
      for (const std::string& name : listDir(dir_)) {
        if (!startsWith(name, kHelloPrefix)) continue;
        const std::string rest = name.substr(sizeof(kHelloPrefix) - 1);
        const size_t dot = rest.find('.');
        if (dot == std::string::npos || dot == 0 || dot > 9 ||
            rest.find_first_not_of("0123456789") != dot || !isHex16(rest.substr(dot + 1))) {
          continue;
        }
        const int r = std::atoi(rest.c_str());
        const std::string nonce = rest.substr(dot + 1);
        if (r < 1 || r >= size) {
          fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": a process asks to join as rank ", r,
               " but the job has ", size,
               " ranks: does every rank have the same MTXCOMM_SIZE, and is no other job using "
               "this directory at the same time?");
        }
        if (nonce_of[r].empty()) {
          writeAtomically(dir_, kAckPrefix + nonce, job_);
          nonce_of[r] = nonce;
          --missing;
        } else if (nonce_of[r] != nonce) {
          fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": two processes ask to join as rank ", r,
               ": is another job using the same directory at the same time? Give each running "
               "job its own directory");
        }
        ::unlink((dir_ + "/" + name).c_str());
      }
      if (missing == 0) break;
      if (Clock::now() >= deadline) {
        std::string who;
        for (int r = 1; r < size; ++r) {
          if (nonce_of[r].empty()) who += strCat(who.empty() ? "" : ", ", r);
        }
        fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout), " s waiting for rank(s) ",
             who, " to join store ", spec_);
      }
      backoff.pause();
    }
  }

  // Rank > 0: asks rank 0 for the job id (a request file named by rank and a fresh nonce, made
  // again if rank 0 removed it as stale) and waits for the answer under that nonce.
  void joinJob(int rank, Clock::time_point deadline, Ms timeout) {
    const std::string nonce = randomHex();
    const std::string hello = strCat(dir_, "/", kHelloPrefix, rank, ".", nonce);
    const std::string ack = dir_ + "/" + kAckPrefix + nonce;
    Backoff backoff(/*spins=*/0, /*yields=*/16);
    while (!readIfExists(ack, &job_)) {
      struct stat st;
      if (::stat(hello.c_str(), &st) != 0) {
        int fd = ::open(hello.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
          fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot create '", hello,
               "': ", errnoText(errno));
        }
        ::close(fd);
      }
      if (Clock::now() >= deadline) {
        ::unlink(hello.c_str());
        fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout),
             " s waiting for rank 0 to admit rank ", rank, " to store ", spec_,
             " (is rank 0 running, with the same MTXCOMM_STORE?)");
      }
      backoff.pause();
    }
    ::unlink(ack.c_str());
    ::unlink(hello.c_str());
    if (!isHex16(job_)) fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": bad job id in '", ack, "'");
  }

  // Writes dir/name under a temporary name, then renames it into place (atomic).
  void writeAtomically(const std::string& dir, const std::string& name, const std::string& value) {
    const std::string final_path = dir + "/" + name;
    const std::string tmp_path =
        strCat(dir, "/", kTmpPrefix, name, ".", counter_.fetch_add(1), ".", randomHex());
    int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      int err = errno;
      fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot create '", tmp_path,
           "': ", errnoText(err),
           err == ENOENT ? " (the job directory was removed: did another job start with the same "
                           "directory? Give each running job its own directory)"
                         : "");
    }
    size_t off = 0;
    while (off < value.size()) {
      ssize_t n = ::write(fd, value.data() + off, value.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        ::close(fd);
        ::unlink(tmp_path.c_str());
        fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot write '", tmp_path,
             "': ", errnoText(err));
      }
      off += static_cast<size_t>(n);
    }
    ::close(fd);
    if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp_path.c_str());
      fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot rename '", tmp_path, "' to '",
           final_path, "': ", errnoText(err));
    }
  }

  // Reads the file at path into *out; false when it does not exist (yet).
  bool readIfExists(const std::string& path, std::string* out) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return false;
      fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot open '", path, "': ", errnoText(errno));
    }
    out->clear();
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        ::close(fd);
        fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot read '", path, "': ", errnoText(err));
      }
      if (n == 0) break;
      out->append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return true;
  }

  const std::string spec_;
  const std::string dir_;
  std::string job_;      // this job's id (16 hex digits)
  std::string job_dir_;  // dir_/mtxcomm.job.<job_>: the keys of this job
  std::atomic<uint64_t> counter_{0};
};

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

[[noreturn]] void badSpec(const std::string& spec, const std::string& what) {
  fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec, ": ", what);
}

}  // namespace

std::unique_ptr<Store> makeStore(const std::string& spec, int rank, int size, Ms timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec, ": rank ", rank,
         " is not in [0, size) for size ", size);
  }
  if (spec.rfind("file:", 0) == 0) {
    std::string path = spec.substr(5);
    if (path.empty()) badSpec(spec, "empty path (expected file:PATH)");
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    return std::make_unique<FileStore>(spec, path, rank, size, timeout);
  }
  if (spec.rfind("tcp:", 0) == 0) {
    std::string rest = spec.substr(4);
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos) badSpec(spec, "missing port (expected tcp:HOST:PORT)");
    HostPort hp;
    hp.host = rest.substr(0, colon);
    std::string port = rest.substr(colon + 1);
    if (hp.host.empty()) badSpec(spec, "missing host (expected tcp:HOST:PORT)");
    if (port.empty()) badSpec(spec, "missing port (expected tcp:HOST:PORT)");
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) {
      badSpec(spec, "port '" + port + "' is not a number");
    }
    hp.port = std::stoi(port);
    if (hp.port < 1 || hp.port > 65535) badSpec(spec, "port " + port + " is not in [1, 65535]");
    return std::make_unique<TcpStore>(spec, hp, rank, timeout);
  }
  badSpec(spec, "expected file:PATH or tcp:HOST:PORT");
}

}  // namespace mtxcomm
