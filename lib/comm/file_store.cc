// FileStore: the bootstrap store over a shared directory (MTXCOMM_STORE=file:DIR; the job
// protocol is described in lib/comm/stores.h).
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <condition_variable>
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
#include "lib/base/liveness.h"
#include "lib/base/log.h"
#include "lib/base/socket_util.h"
#include "lib/comm/stores.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

// Names in the store directory (see store.h). Everything this store creates at the top level
// starts with kPrefix; rank 0 of a new job removes such entries, and nothing else.
constexpr char kPrefix[] = "mtxcomm.";
constexpr char kJobPrefix[] = "mtxcomm.job.";      // + job id: a directory holding the keys
constexpr char kHelloPrefix[] = "mtxcomm.hello.";  // + rank "." nonce: a rank asks to join
constexpr char kAckPrefix[] = "mtxcomm.ack.";      // + nonce: rank 0's answer, the job id
constexpr char kTmpPrefix[] = "mtxcomm.tmp.";      // a file being written, before its rename
constexpr char kLockName[] = "mtxcomm.lock";       // held (flock) by the running job's rank 0
constexpr char kSecretName[] = "secret";           // in the job directory: the job's secret
constexpr char kFaultName[] = "mtxcomm.fault";     // why a job's init failed, for its other ranks
constexpr char kAliveName[] = "mtxcomm.alive";     // rank 0's heartbeat while its store lives

// Rank 0's heartbeat (see "Rank 0's liveness" in stores.h): rewritten in place every
// kHeartbeatPeriod; a rank on another node takes rank 0 for gone once its content has not changed
// for kHeartbeatStale, measured on its own clock (the nodes' clocks need not agree).
constexpr Ms kHeartbeatPeriod(500);
constexpr Ms kHeartbeatStale(5000);

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
  // Another user who can write here could plant an answer, a job folder or a join request: a
  // directory writable by others is refused, unless it is sticky (like /tmp: nobody can then
  // replace or remove another's files, and this store believes only its own user's files).
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec, ": '", path,
         "' is writable by other users and not sticky: another user could take part in the job "
         "(use a directory of your own, e.g. mkdir -m 700, or a sticky one like /tmp)");
  }
  if (st.st_uid != geteuid() && !(st.st_mode & S_ISVTX)) {
    fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec, ": '", path, "' belongs to uid ", st.st_uid,
         ", not to this user (", geteuid(), "), and is not sticky");
  }
}

// Whether a file or folder is this user's own and nobody else may write it: only then is what
// it holds believed.
bool ownedAndPrivate(const struct stat& st) {
  return st.st_uid == geteuid() && !(st.st_mode & (S_IWGRP | S_IWOTH));
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

// "<identity>\n<job id>\n<counter: 16 hex digits>\n": the same length for every counter, so
// that rank 0 can rewrite it in place.
std::string heartbeatText(const std::string& identity, const std::string& job, uint64_t counter) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(counter));
  return identity + "\n" + job + "\n" + hex + "\n";
}

// Rank 0's side of the heartbeat: a thread that rewrites the file (made by the store, this
// user's private file) in place every kHeartbeatPeriod, and removes it when the store ends,
// normally or not (the constructor's failure included). In place, not by rename: a reader on
// another node then needs only close-to-open consistency of one file (NFS's default), not a
// fresh view of the directory.
class Heartbeat {
 public:
  Heartbeat(std::string path, std::string identity, std::string job)
      : path_(std::move(path)), identity_(std::move(identity)), job_(std::move(job)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ::unlink(path_.c_str());
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (uint64_t counter = 1; !cv_.wait_for(lock, kHeartbeatPeriod, [this] { return stop_; });
         ++counter) {
      const std::string text = heartbeatText(identity_, job_, counter);
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) continue;  // removed by hand: the ranks on other nodes take rank 0 for gone
      ssize_t ignored = ::pwrite(fd, text.data(), text.size(), 0);
      (void)ignored;
      ::close(fd);
    }
  }

  const std::string path_, identity_, job_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class FileStore : public Store {
 public:
  FileStore(std::string spec, std::string path, int rank, int size, Ms timeout,
            const JobSecret& configured)
      : spec_(std::move(spec)), dir_(std::move(path)), rank_(rank) {
    makeDirs(dir_, spec_);
    const auto deadline = Clock::now() + timeout;
    if (rank == 0) {
      try {
        startJob(size, deadline, timeout, configured);
      } catch (const Error& e) {
        reportFault(e.what());  // the ranks waiting to join learn why at once
        throw;
      }
    } else {
      joinJob(rank, deadline, timeout);
      job_dir_ = dir_ + "/" + kJobPrefix + job_;
      checkPrivate(job_dir_, "the job folder");
      secret_ = JobSecret::fromFile(job_dir_ + "/" + kSecretName,
                                    ("MTXCOMM_STORE=" + spec_ + ": the job secret").c_str());
    }
  }

  ~FileStore() override {
    heartbeat_.reset();  // removes the heartbeat while the lock keeps the next job's rank 0 out
    if (lock_ >= 0) ::close(lock_);  // releases the flock
  }

  const JobSecret& secret() const override { return secret_; }

  // Any rank whose init fails: writes why to the directory's fault file (this user's, 0600), which
  // every rank of the job that is still waiting — to join, for a key, for its peers — reads and
  // fails with (a fault older than the waiting rank's own join request is an earlier job's).
  void reportFault(const std::string& message) override {
    try {
      writeAtomically(dir_, kFaultName, message.substr(0, kMaxFileBytes));
    } catch (const Error&) {
      // Best effort: the caller throws its own error anyway.
    }
  }

  void check() override {
    throwIfFault(joinedAt_);
    checkRankZero("in its bootstrap");
  }

 private:
  // Rank 0: one job per directory, the clean-up, the job folder and secret, the admissions.
  void startJob(int size, Clock::time_point deadline, Ms timeout, const JobSecret& configured) {
    lockDirectory();
    removeStaleEntries();
    job_ = randomHex();
    const std::string job_dir = dir_ + "/" + kJobPrefix + job_;
    if (::mkdir(job_dir.c_str(), 0700) != 0) {
      fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot create directory '", job_dir,
           "': ", errnoText(errno));
    }
    job_dir_ = job_dir;
    // The job's secret, for the connections between its ranks: the configured one, else a
    // new one, in a file only this user can read (the job folder is 0700, the file 0600).
    secret_ = configured.empty() ? JobSecret::random() : configured;
    writeAtomically(job_dir_, kSecretName, secret_.hex());
    struct stat st {};
    if (::stat(job_dir_.c_str(), &st) == 0) joinedAt_ = st.st_mtim;
    if (size > 1) {
      // The ranks waiting to join, or for a key, watch this file to tell a rank 0 that died
      // during init from a slow one.
      const std::string identity = PeerLiveness::selfIdentity();
      writeAtomically(dir_, kAliveName, heartbeatText(identity, job_, 0));
      heartbeat_ = std::make_unique<Heartbeat>(dir_ + "/" + kAliveName, identity, job_);
      admitRanks(size, deadline, timeout);
    }
  }

 public:
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
      throwIfFault(joinedAt_);
      checkRankZero(strCat("while this rank waited for key '", key, "'").c_str());
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
      if (!startsWith(name, kPrefix) || name == kLockName) continue;
      struct stat st {};
      if (::lstat((dir_ + "/" + name).c_str(), &st) == 0 && st.st_uid != geteuid()) {
        continue;  // another user's (a sticky directory): not ours to remove, never believed
      }
      std::error_code ec;
      std::filesystem::remove_all(dir_ + "/" + name, ec);
      if (ec && ec != std::errc::no_such_file_or_directory) {
        fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot remove the stale entry '", dir_, "/",
             name, "' of an earlier job: ", ec.message());
      }
    }
  }

  // Rank 0, first: one running job per directory. The lock is flock(2)ed for the store's life;
  // a second job's rank 0 is told which process holds it.
  void lockDirectory() {
    const std::string path = dir_ + "/" + kLockName;
    lock_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock_ < 0) {
      fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot open '", path, "': ", errnoText(errno));
    }
    struct stat st {};
    if (::fstat(lock_, &st) != 0 || !ownedAndPrivate(st)) {
      fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": '", path,
           "' belongs to another user or is writable by others");
    }
    if (::flock(lock_, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {0};
      const ssize_t n = ::pread(lock_, pid, sizeof(pid) - 1, 0);
      fail(MTXCOMM_INVALID_USAGE, "store ", spec_,
           ": another job is using this directory (its "
           "rank 0, pid ",
           n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string("?"), ", holds ", path,
           "): give each running job its own directory");
    }
    const std::string me = std::to_string(::getpid());
    if (::ftruncate(lock_, 0) == 0) {
      ssize_t ignored = ::pwrite(lock_, me.data(), me.size(), 0);
      (void)ignored;
    }
  }

  // Throws unless path is this user's own folder, closed to others.
  void checkPrivate(const std::string& path, const char* what) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || !ownedAndPrivate(st) ||
        (st.st_mode & (S_IRWXG | S_IRWXO))) {
      fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": ", what, " '", path,
           "' is not this user's private folder (planted by another user?)");
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
        struct stat st {};
        if (::lstat((dir_ + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid()) {
          if (st.st_uid != geteuid() && warnedPlanted_.insert(name).second) {
            MTXCOMM_LOG(kWarn, 0, "store ", spec_, ": ignored the join request '", name,
                        "' of uid ", st.st_uid, " (not this job's user)");
          }
          continue;
        }
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
    while (!readIfExists(ack, &job_, /*ignoreForeign=*/true)) {
      struct stat st;
      if (::stat(hello.c_str(), &st) != 0) {
        int fd = ::open(hello.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
          fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot create '", hello,
               "': ", errnoText(errno));
        }
        ::close(fd);
        if (::stat(hello.c_str(), &st) == 0) {
          joinedAt_ = st.st_mtim;
          if (firstJoinedAt_.tv_sec == 0 && firstJoinedAt_.tv_nsec == 0) firstJoinedAt_ = joinedAt_;
        }
      }
      throwIfFault(joinedAt_);
      checkRankZero("while this rank waited to be admitted to the job");
      if (Clock::now() >= deadline) {
        ::unlink(hello.c_str());
        fail(MTXCOMM_TIMEOUT, "timed out after ", secondsText(timeout),
             " s waiting for rank 0 to admit rank ", rank, " to store ", spec_,
             " (is rank 0 running, with the same MTXCOMM_STORE? A job that has admitted its rank ",
             rank, " already does not answer another process asking to be rank ", rank, ")");
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

  // Ranks > 0: throws MTXCOMM_REMOTE_ERROR once rank 0 is known to be gone (its process exited,
  // on this node; its heartbeat unchanged for kHeartbeatStale, on another), naming it and what
  // this rank was waiting for. Which heartbeat is this job's: once admitted, the one naming
  // this job's id; before, one written since this rank first asked to join (a heartbeat older
  // than that is an earlier job's whose rank 0 died: a later job's rank 0 may still come).
  // Looks at most every 100 ms.
  void checkRankZero(const char* waiting) {
    if (rank_ == 0) return;
    const auto now = Clock::now();
    if (now < nextRankZeroCheck_) return;
    nextRankZeroCheck_ = now + Ms(100);
    const std::string path = dir_ + "/" + kAliveName;
    std::string text;
    struct stat st {};
    // Read, then stat: the open revalidates the file's attributes on a network file system.
    if (readIfExists(path, &text, /*ignoreForeign=*/true) && ::stat(path.c_str(), &st) == 0 &&
        text != rankZero_.text) {
      const size_t a = text.find('\n'), b = text.find('\n', a + 1);
      const size_t bar = text.rfind('|', a);
      const bool parsed =
          a != std::string::npos && b != std::string::npos && bar != std::string::npos && bar < a;
      const bool ours = parsed && (job_.empty() ? joinedSince(st.st_mtim, firstJoinedAt_)
                                                : text.compare(a + 1, b - a - 1, job_) == 0);
      if (ours) {
        const std::string node = text.substr(0, bar);
        const std::string me = PeerLiveness::nodeIdentity();
        rankZero_.text = text;
        rankZero_.changed = now;
        rankZero_.pid = std::atol(text.c_str() + bar + 1);
        rankZero_.host = node.substr(0, node.find('|'));
        rankZero_.local = node == me && me.find(":?") == std::string::npos;
      }
    }
    if (rankZero_.text.empty()) return;
    if (rankZero_.local && rankZero_.pid > 0 && processGone(rankZero_.pid)) {
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": rank 0 (pid ", rankZero_.pid,
           ", on this node) is gone: its process exited during init ", waiting);
    }
    if (!rankZero_.local && now - rankZero_.changed > kHeartbeatStale) {
      fail(MTXCOMM_REMOTE_ERROR, "store ", spec_, ": rank 0 (pid ", rankZero_.pid, " on ",
           rankZero_.host, ") seems gone: its heartbeat ", path, " has not changed for ",
           secondsText(kHeartbeatStale), " s (rank 0 rewrites it every ",
           secondsText(kHeartbeatPeriod), " s during init) ", waiting);
    }
  }

  // Whether a file time is not older than since (an unset since: false).
  static bool joinedSince(const timespec& t, const timespec& since) {
    if (since.tv_sec == 0 && since.tv_nsec == 0) return false;
    return t.tv_sec > since.tv_sec || (t.tv_sec == since.tv_sec && t.tv_nsec >= since.tv_nsec);
  }

  // Throws MTXCOMM_INVALID_USAGE with the fault file's message when it exists, is this user's
  // private file and is not older than since (this rank's join request, or its job's start).
  void throwIfFault(const timespec& since) {
    const std::string path = dir_ + "/" + kFaultName;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return;
    if (st.st_mtim.tv_sec < since.tv_sec ||
        (st.st_mtim.tv_sec == since.tv_sec && st.st_mtim.tv_nsec < since.tv_nsec)) {
      return;  // an earlier job's
    }
    std::string message;
    if (!readIfExists(path, &message, /*ignoreForeign=*/true)) return;
    fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": the job failed on another rank: ", message);
  }

  // Reads the file at path into *out; false when it does not exist (yet). A file that is not
  // this user's private regular file is an error, or, with ignoreForeign (an answer in the
  // shared directory, which another user may have planted under the name), logged once and
  // treated as absent.
  bool readIfExists(const std::string& path, std::string* out, bool ignoreForeign = false) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT) return false;
      fail(MTXCOMM_SYSTEM_ERROR, "store ", spec_, ": cannot open '", path, "': ", errnoText(errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !ownedAndPrivate(st) ||
        st.st_size > static_cast<off_t>(kMaxFileBytes)) {
      ::close(fd);
      if (ignoreForeign) {
        if (warnedPlanted_.insert(path).second) {
          char mode[8];
          std::snprintf(mode, sizeof(mode), "%o", static_cast<unsigned>(st.st_mode & 07777));
          MTXCOMM_LOG(kWarn, -1, "store ", spec_, ": ignored '", path, "' of uid ", st.st_uid,
                      ", mode ", mode, " (not this user's private file: planted by another user?)");
        }
        return false;
      }
      fail(MTXCOMM_INVALID_USAGE, "store ", spec_, ": '", path,
           "' is not this user's private regular file of at most ", kMaxFileBytes,
           " bytes (planted by another user?)");
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

  static constexpr size_t kMaxFileBytes = size_t{64} << 20;
  const std::string spec_;
  const std::string dir_;
  int lock_ = -1;
  JobSecret secret_;
  std::set<std::string> warnedPlanted_;
  std::string job_;           // this job's id (16 hex digits)
  timespec joinedAt_{};       // this rank's join request (rank 0: the job folder), for throwIfFault
  timespec firstJoinedAt_{};  // this rank's first join request, for checkRankZero
  std::string job_dir_;       // dir_/mtxcomm.job.<job_>: the keys of this job
  std::atomic<uint64_t> counter_{0};
  const int rank_;
  // What a rank > 0 last saw of this job's rank 0 (checkRankZero): its heartbeat, when that
  // changed (this rank's clock), its pid, host and whether it runs on this node.
  struct {
    std::string text;
    Clock::time_point changed{};
    long pid = 0;
    std::string host;
    bool local = false;
  } rankZero_;
  Clock::time_point nextRankZeroCheck_{};
  std::unique_ptr<Heartbeat> heartbeat_;  // rank 0; last: stopped before the rest goes
};

}  // namespace

std::unique_ptr<Store> makeFileStore(const std::string& spec, const std::string& dir, int rank,
                                     int size, Ms timeout, const JobSecret& secret) {
  return std::make_unique<FileStore>(spec, dir, rank, size, timeout, secret);
}

}  // namespace mtxcomm
