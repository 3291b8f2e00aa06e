#include "lib/comm/flight_recorder.h"

#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/comm/config.h"

namespace mtxcomm {

namespace {

constexpr std::memory_order kRelaxed = std::memory_order_relaxed;

int64_t clockMicros(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

const char* stateName(uint32_t s) {
  switch (static_cast<FlightRecorder::State>(s)) {
    case FlightRecorder::State::kEntered:
      return "entered";
    case FlightRecorder::State::kDone:
      return "done";
    case FlightRecorder::State::kFailed:
      return "failed";
    case FlightRecorder::State::kRejected:
      return "rejected";
  }
  return "unknown";
}

}  // namespace

// One call. Every word is atomic: a dump reads the ring on another thread while the calling
// thread writes it (a seqlock: version is odd while the entry is being written).
struct FlightRecorder::Entry {
  std::atomic<uint64_t> version{0};
  std::atomic<uint64_t> kind{0}, count{0}, seq{0};
  std::atomic<uint32_t> state{0};
  std::atomic<int32_t> waitedOn{-1};  // at its end: the peer a call waited on past the spin
  std::atomic<const char*> algorithm{nullptr}, transport{nullptr};  // static strings
  std::atomic<int64_t> waitedFromUs{0}, endedUs{0};                 // coarse monotonic; 0: none
  std::atomic<uint64_t> label[kLabelBytes / 8] = {};
};

FlightRecorder::FlightRecorder(size_t capacity, std::string commName, int rank, int size)
    : ring_(new Entry[std::max<size_t>(capacity, 1)]),
      capacity_(std::max<size_t>(capacity, 1)),
      commName_(std::move(commName)),
      rank_(rank),
      size_(size) {}

FlightRecorder::~FlightRecorder() = default;

namespace {

// The writer's half of the seqlock around fn (the calling thread only).
template <class Fn>
void writeEntry(std::atomic<uint64_t>& version, Fn&& fn) {
  const uint64_t v = version.load(kRelaxed);
  version.store(v + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  fn();
  version.store(v + 2, std::memory_order_release);
}

}  // namespace

void FlightRecorder::enter(const CallSignature& call, const Label& label) {
  // The next slot without a division (a third of the recorder's cost when it had three).
  const size_t at = current_.load(kRelaxed);
  const size_t slot = next_ == 0 ? 0 : (at + 1 == capacity_ ? 0 : at + 1);
  Entry& e = ring_[slot];
  ++next_;
  wait_.reset();
  // The call's identity (signature, label) under the seqlock; what changes while it runs (path,
  // state, waits, end) in single words of their own, read as they stand.
  writeEntry(e.version, [&] {
    e.kind.store(call.kind, kRelaxed);
    e.count.store(call.count, kRelaxed);
    e.seq.store(call.seq, kRelaxed);
    // The label's words up to the one with its terminating NUL; a reader stops there.
    for (size_t w = 0; w < kLabelBytes / 8; ++w) {
      uint64_t word;
      std::memcpy(&word, label + 8 * w, 8);
      e.label[w].store(word, kRelaxed);
      if (std::memchr(label + 8 * w, '\0', 8)) break;
    }
  });
  e.state.store(static_cast<uint32_t>(State::kEntered), kRelaxed);
  e.algorithm.store(nullptr, kRelaxed);
  e.transport.store(nullptr, kRelaxed);
  if (e.waitedOn.load(kRelaxed) != -1) e.waitedOn.store(-1, kRelaxed);
  if (e.waitedFromUs.load(kRelaxed) != 0) e.waitedFromUs.store(0, kRelaxed);
  if (e.endedUs.load(kRelaxed) != 0) e.endedUs.store(0, kRelaxed);
  current_.store(slot, std::memory_order_release);
}

void FlightRecorder::setPath(const char* algorithm, const char* transport) {
  if (next_ == 0) return;
  Entry& e = ring_[current_.load(kRelaxed)];
  e.algorithm.store(algorithm, kRelaxed);
  e.transport.store(transport, kRelaxed);
}

void FlightRecorder::end(State state) {
  if (next_ == 0) return;
  Entry& e = ring_[current_.load(kRelaxed)];
  // Once: a failed call is ended where it fails and again as its error passes run().
  if (e.state.load(kRelaxed) != static_cast<uint32_t>(State::kEntered)) return;
  // A call that waited past the spin keeps whom it waited on and since when; one that did not
  // complete, when it ended. A call that completed at once reads no clock.
  if (const int64_t since = wait_.sinceUs.load(kRelaxed)) {
    e.waitedOn.store(wait_.peer.load(kRelaxed), kRelaxed);
    e.waitedFromUs.store(since, kRelaxed);
  }
  if (state != State::kDone) e.endedUs.store(coarseMicros(), kRelaxed);
  e.state.store(static_cast<uint32_t>(state), std::memory_order_release);
  wait_.reset();
}

void FlightRecorder::setError(const std::string& message) {
  std::lock_guard<std::mutex> g(errorMu_);
  error_ = message.substr(0, 2000);
}

std::string FlightRecorder::json(const std::string& reason) const {
  using Json = nlohmann::json;
  // Coarse monotonic microseconds to wall-clock ones, so that ranks' files line up.
  const int64_t now = coarseMicros();
  const int64_t toWall = clockMicros(CLOCK_REALTIME) - now;
  Json calls = Json::array();
  for (size_t i = 0; i < capacity_; ++i) {
    const Entry& e = ring_[i];
    for (int attempt = 0; attempt < 100; ++attempt) {
      const uint64_t v1 = e.version.load(std::memory_order_acquire);
      if (v1 == 0) break;  // never written
      if (v1 & 1) continue;
      const CallSignature sig{e.kind.load(kRelaxed), e.count.load(kRelaxed), e.seq.load(kRelaxed)};
      char label[kLabelBytes] = {};
      for (size_t w = 0; w < kLabelBytes / 8; ++w) {
        const uint64_t word = e.label[w].load(kRelaxed);
        std::memcpy(label + 8 * w, &word, 8);
        if (std::memchr(label + 8 * w, '\0', 8)) break;  // the words past it are stale
      }
      label[kLabelBytes - 1] = '\0';
      std::atomic_thread_fence(std::memory_order_acquire);
      if (e.version.load(kRelaxed) != v1) continue;
      const uint32_t state = e.state.load(std::memory_order_acquire);
      const char* algorithm = e.algorithm.load(kRelaxed);
      const char* transport = e.transport.load(kRelaxed);
      const int64_t ended = e.endedUs.load(kRelaxed);
      // The call in progress: the live wait; an ended one: what it kept.
      const bool live = state == static_cast<uint32_t>(State::kEntered) && sig.seq != 0 &&
                        i == current_.load(std::memory_order_acquire);
      const int32_t waitedOn = live ? wait_.peer.load(kRelaxed) : e.waitedOn.load(kRelaxed);
      const int64_t waitedFrom =
          live ? wait_.sinceUs.load(kRelaxed) : e.waitedFromUs.load(kRelaxed);
      const auto coll = static_cast<Collective>(sig.kind & 0xff);
      Json c;
      c["seq"] = sig.seq;
      c["kind"] = collectiveName(coll);
      c["count"] = sig.count;
      c["dtype"] = datatypeName(static_cast<mtxcomm_datatype_t>((sig.kind >> 8) & 0xff));
      c["op"] =
          collectiveReduces(coll) ? opName(static_cast<mtxcomm_op_t>((sig.kind >> 16) & 0xff)) : "";
      c["root"] =
          collectiveRooted(coll) ? static_cast<int>(static_cast<uint32_t>(sig.kind >> 32)) : -1;
      c["vector"] = ((sig.kind >> 24) & 1) != 0;
      c["call"] = describeCall(sig);
      c["name"] = std::string(label);
      c["algorithm"] = algorithm ? algorithm : "";
      c["transport"] = transport ? transport : "";
      c["state"] = stateName(state);
      c["waiting_on"] = waitedOn;
      c["waiting_since_us"] = waitedFrom ? waitedFrom + toWall : 0;
      c["ended_us"] = ended ? ended + toWall : 0;
      calls.push_back(std::move(c));
      break;
    }
  }
  std::sort(calls.begin(), calls.end(),
            [](const Json& a, const Json& b) { return a["seq"] < b["seq"]; });
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  Json out;
  out["format"] = "mtxcomm flight recorder 1";
  out["comm"] = commName_;
  out["rank"] = rank_;
  out["size"] = size_;
  out["host"] = host;
  out["pid"] = static_cast<int64_t>(getpid());
  out["reason"] = reason;
  {
    std::lock_guard<std::mutex> g(errorMu_);
    out["error"] = error_;
  }
  out["dumped_us"] = now + toWall;
  out["capacity"] = capacity_;
  out["calls"] = std::move(calls);
  return out.dump(1);
}

// ---- the process's recorders and their dump ------------------------------------------------

namespace {

std::mutex& registryMutex() {
  static auto* mu = new std::mutex();  // never destroyed: communicators may outlive statics
  return *mu;
}
std::vector<FlightRecorder*>& registry() {
  static auto* all = new std::vector<FlightRecorder*>();
  return *all;
}

// Letters, digits, '.', '_' and '-' of s; the rest become '_'.
std::string fileSafe(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  return out;
}

// A folder this user owns and nobody else can write, made if missing: "" when it is, else why
// not (a planted folder or link of another user is never written into).
std::string ensurePrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return strCat("cannot create it: ", std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return strCat("cannot stat it: ", std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return "it is not a directory (a link or a file)";
  if (st.st_uid != ::geteuid()) return strCat("it belongs to uid ", st.st_uid);
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return "others can write it";
  return "";
}

bool writeFile(const std::string& path, const std::string& text, std::string* why) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = strCat("cannot open ", path, ": ", std::strerror(errno));
    return false;
  }
  bool ok = ::fchmod(fd, 0600) == 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  if (!ok) *why = strCat("cannot write ", path, ": ", std::strerror(errno));
  ::close(fd);
  return ok;
}

std::mutex& dumpMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

}  // namespace

namespace {
void stopDumperIfIdle();
}  // namespace
void servePendingSigusr1();

void registerFlightRecorder(FlightRecorder* r) {
  std::lock_guard<std::mutex> g(registryMutex());
  registry().push_back(r);
}

void unregisterFlightRecorder(FlightRecorder* r) {
  // A request that came just before (a rank woken by it that destroys at once) is served while
  // this recorder is still there.
  servePendingSigusr1();
  {
    std::lock_guard<std::mutex> g(registryMutex());
    auto& all = registry();
    all.erase(std::remove(all.begin(), all.end(), r), all.end());
  }
  stopDumperIfIdle();
}

std::string flightRecorderDir() {
  if (const char* d = getEnv("MTXCOMM_FLIGHT_RECORDER_DIR"); d && *d) return d;
  const char* store = getEnv("MTXCOMM_STORE");
  if (store && std::strncmp(store, "file:", 5) == 0 && store[5]) {
    return std::string(store + 5) + "/mtxcomm.flight_recorder";
  }
  std::string job;
  for (const char* v : {"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "SLURM_JOB_ID"}) {
    const char* x = std::getenv(v);
    if (x && *x) {
      job = x;
      break;
    }
  }
  if (job.empty() && store && std::strncmp(store, "tcp:", 4) == 0) job = store + 4;
  if (job.empty()) job = strCat("pid", getpid());
  return "/tmp/mtxcomm_flight_" + fileSafe(job);
}

std::string dumpFlightRecorders(const std::string& reason) {
  std::lock_guard<std::mutex> serial(dumpMutex());
  std::vector<std::pair<std::string, std::string>> files;  // name, text
  {
    std::lock_guard<std::mutex> g(registryMutex());
    for (const FlightRecorder* r : registry()) {
      files.emplace_back(strCat(fileSafe(r->commName()), ".rank", r->rank(), ".json"),
                         r->json(reason));
    }
  }
  if (files.empty()) return "";
  const std::string dir = flightRecorderDir();
  const std::string unsafe = ensurePrivateDir(dir);
  if (!unsafe.empty()) {
    MTXCOMM_LOG(kWarn, -1, "flight recorder: not written to ", dir, ": ", unsafe,
                " (set MTXCOMM_FLIGHT_RECORDER_DIR to a folder of your own)");
    return "";
  }
  for (const auto& [name, text] : files) {
    std::string why;
    if (!writeFile(dir + "/" + name, text, &why)) {
      MTXCOMM_LOG(kWarn, -1, "flight recorder: ", why);
      return "";
    }
  }
  return dir;
}

// ---- SIGUSR1 ---------------------------------------------------------------------------------

namespace {

// The handler only posts a semaphore (signal-safety(7)); a thread of the library's, which runs
// while a recorder is registered and ends with the last one (a program that forks between its
// communicators forks a process of one thread), writes the records.
sem_t g_dumpRequests;
std::atomic<int> g_requestPid{0};
std::atomic<bool> g_requestPending{false};  // a SIGUSR1 not yet served
std::atomic<bool> g_handlesSigusr1{false};
std::mutex& dumperMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::thread g_dumper;   // guarded by dumperMutex()
pid_t g_dumperPid = 0;  // the process that started it (a forked child has no such thread)
std::atomic<bool> g_dumperStop{false};

void onSigusr1(int, siginfo_t* info, void*) {
  const int saved = errno;
  g_requestPid.store(info ? static_cast<int>(info->si_pid) : 0, kRelaxed);
  g_requestPending.store(true);
  sem_post(&g_dumpRequests);
  errno = saved;
}

}  // namespace

void servePendingSigusr1() {
  if (!g_requestPending.exchange(false)) return;
  const int from = g_requestPid.load(kRelaxed);
  const std::string dir =
      dumpFlightRecorders(from > 0 ? strCat("SIGUSR1 from pid ", from) : "SIGUSR1");
  if (!dir.empty()) {
    MTXCOMM_LOG(kWarn, -1, "flight recorder written to ", dir, " (SIGUSR1); mtxcomm_info ",
                "--why-stuck ", dir, " tells which rank the job waits for");
  }
}

namespace {

void dumpOnRequests() {
  pthread_setname_np(pthread_self(), "mtxcomm_flight");
  for (;;) {
    if (sem_wait(&g_dumpRequests) != 0) continue;  // EINTR
    if (g_dumperStop.load()) return;
    servePendingSigusr1();
  }
}

void installSigusr1() {
  struct sigaction old {};
  if (sigaction(SIGUSR1, nullptr, &old) != 0) return;
  // The program's own handler, or an ignored SIGUSR1, stays as it is.
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
  if (sem_init(&g_dumpRequests, 0, 0) != 0) return;
  struct sigaction sa {};
  sa.sa_sigaction = onSigusr1;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR1, &sa, nullptr) == 0) g_handlesSigusr1.store(true);
}

// In a forked child g_dumper is a copy of its parent's handle, with no such thread here: it is
// set aside (never joined; a leaked handle) and the child has no dumper. Under dumperMutex().
void forgetParentsDumper() {
  if (g_dumper.joinable() && g_dumperPid != getpid()) new std::thread(std::move(g_dumper));
}

// Ends the thread: always (at exit), or once no recorder is registered.
void stopDumper(bool onlyIfIdle) {
  std::thread t;
  {
    std::lock_guard<std::mutex> g(dumperMutex());
    if (onlyIfIdle) {
      std::lock_guard<std::mutex> r(registryMutex());
      if (!registry().empty()) return;
    }
    forgetParentsDumper();
    if (!g_dumper.joinable()) return;
    g_dumperStop.store(true);
    t = std::move(g_dumper);
  }
  sem_post(&g_dumpRequests);
  t.join();
}

// At exit the thread ends even where communicators were never destroyed: a std::thread still
// joinable when the static g_dumper is destroyed would std::terminate the process. The handler
// is registered after g_dumper was made, so it runs before g_dumper's destructor.
void stopDumperAtExit() { stopDumper(/*onlyIfIdle=*/false); }

// Starts the thread unless it runs (a request that came while none ran is served now).
void startDumper() {
  static std::once_flag atExit;
  std::call_once(atExit, [] { std::atexit(stopDumperAtExit); });
  std::lock_guard<std::mutex> g(dumperMutex());
  forgetParentsDumper();
  if (g_dumper.joinable()) return;
  g_dumperStop.store(false);
  try {
    g_dumper = std::thread(dumpOnRequests);
    g_dumperPid = getpid();
  } catch (const std::system_error&) {
    // No thread: SIGUSR1 is still caught, and served once one starts.
  }
}

// Ends the thread once no recorder is registered.
void stopDumperIfIdle() { stopDumper(/*onlyIfIdle=*/true); }

}  // namespace

bool flightRecorderHandlesSigusr1() {
  static std::once_flag once;
  std::call_once(once, installSigusr1);
  if (!g_handlesSigusr1.load()) return false;
  startDumper();
  return true;
}

}  // namespace mtxcomm
