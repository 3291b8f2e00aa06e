// The engine's thread (engine.h): init and shutdown, submissions, sleeping until there is work
// or a peer asks for a cycle, and a submitter's inline cycle. One cycle is engine_cycle.cc;
// negotiation.h, executor.h and timeline.h do the rest.
#include "bindings/common/engine.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings/common/engine_internal.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"

namespace mtxcomm::binding {

namespace {

// Set while this thread runs a cycle (the engine's thread, or a submitter running one itself):
// a request submitted from inside that cycle (a completion callback) never runs one itself.
thread_local bool tInCycle = false;

// A cycle a submitter runs itself takes at most this many bytes of requests: a larger copy goes
// to the engine's thread, beside the framework's.
constexpr size_t kInlineBytes = 128 << 10;

size_t requestBytes(const Request& r) {
  size_t bytes = 0;
  for (const TensorMeta& t : r.tensors) bytes += t.bytes();
  return bytes;
}

std::string configString(const char* name) {
  char buf[4096];
  if (mtxcomm_config_get(name, buf, sizeof(buf)) != MTXCOMM_SUCCESS) return "";
  return buf;
}

double configNumber(const char* name, double fallback) {
  const std::string v = configString(name);
  return v.empty() ? fallback : std::strtod(v.c_str(), nullptr);
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

void warn(int rank, const std::string& msg) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "[mtxcomm %s:%d rank %d] WARN %s\n", host, static_cast<int>(getpid()), rank,
               msg.c_str());
  std::fflush(stderr);
}

Status Engine::init() {
  std::lock_guard<std::mutex> lk(mu_);
  if (thread_.joinable() && !stopped_) return {};
  if (thread_.joinable()) thread_.join();
  mtxcomm_comm_t comm = nullptr;
  mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  if (rc != MTXCOMM_SUCCESS) {
    return {rc, std::string("mtxcomm init failed: ") + mtxcomm_get_last_error(nullptr)};
  }
  int r = 0, n = 0, lr = 0, ln = 0, share = 1;
  mtxcomm_comm_rank(comm, &r);
  mtxcomm_comm_size(comm, &n);
  mtxcomm_comm_local_rank(comm, &lr);
  mtxcomm_comm_local_size(comm, &ln);
  mtxcomm_comm_cpu_share(comm, &share);
  cycleSeconds_ = configNumber("MTXCOMM_CYCLE_TIME", 0.001);
  const auto fusionBytes = static_cast<size_t>(configNumber("MTXCOMM_FUSION_BYTES", 64 << 20));
  stallWarnSeconds_ = configNumber("MTXCOMM_STALL_WARNING", 60);
  stallTimeoutSeconds_ = configNumber("MTXCOMM_STALL_TIMEOUT", 300);
  const int cacheCapacity = static_cast<int>(configNumber("MTXCOMM_CACHE_CAPACITY", 1024));
  timeline_.reset();
  const std::string timelinePath = configString("MTXCOMM_TIMELINE");
  if (!timelinePath.empty() && timelinePath != "(unset)") {
    auto t = std::make_unique<Timeline>();
    std::string err;
    if (t->open(timelinePath, r,
                static_cast<size_t>(configNumber("MTXCOMM_TIMELINE_MAX_BYTES", 100 << 20)), &err)) {
      timeline_ = std::move(t);
    } else {
      warn(r, err);
    }
  }
  mtxcomm_notify_state_t probe;
  notifies_ = mtxcomm_comm_notify_state(comm, &probe) == MTXCOMM_SUCCESS;
  peerTrouble_ = false;
  idle_ = false;
  comm_ = comm;
  rank = r;
  size = n;
  localRank = lr;
  localSize = ln;
  cpuShare = share;
  negotiation_ = std::make_unique<Negotiation>(r, n, cacheCapacity);
  if (executor_) collectivesBefore_ += executor_->collectives();
  executor_ = std::make_unique<OpExecutor>(comm, r, n, fusionBytes, timeline_.get());
  local_.clear();
  submitted_.clear();
  cycles_ = 0;
  progress_ = false;
  nextStallCheck_ = Clock::time_point::max();
  nextStallWarning_ = Clock::time_point::max();
  shutdownRequested_ = false;
  stopped_ = false;
  failure_ = {};
  wakeComm_ = notifies_ ? comm : nullptr;
  worldComm = comm;
  thread_ = std::thread([this] { loop(); });
  return {};
}

Status Engine::shutdown() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) return {};
    shutdownRequested_ = true;
    cv_.notify_all();
    if (mtxcomm_comm_t c = wakeComm_.load()) mtxcomm_comm_wakeup(c);
    t = std::move(thread_);
  }
  t.join();
  rank = size = localRank = localSize = cpuShare = -1;
  return std::exchange(destroyStatus_, Status{});
}

void Engine::enqueue(Entry e) {
  e.submitted = Clock::now();
  Status refuse;
  bool wake = false, mayRunInline = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) {
      refuse = {MTXCOMM_INVALID_USAGE,
                "mtxcomm is not initialised: call init() first (or it was shut down)"};
    } else if (stopped_) {
      refuse = failureOf(e.request);
    } else if (!inFlight_.insert(e.request.name).second) {
      // Which of two concurrent requests of one name pairs with which on the other ranks is
      // not defined (threads, graph order): refused, as Horovod does, never a wrong pairing.
      refuse = {MTXCOMM_INVALID_USAGE,
                "mtxcomm " + std::string(kindName(e.request.kind)) + " '" + e.request.name +
                    "': another request of this name is in flight on this rank (two concurrent "
                    "collectives need different names)"};
    } else {
      // The name is free again just before the caller hears the result.
      e.done = [this, name = e.request.name, done = std::move(e.done)](const Status& st) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          inFlight_.erase(name);
        }
        done(st);
      };
      mayRunInline = e.mayRunInline;
      wake = submitted_.empty();
      submitted_.push_back(std::move(e));
    }
  }
  if (wake) {
    if (mayRunInline && runInline()) return;
    // After unlocking: a woken engine thread takes mu_ first thing, and on a rank with one core
    // it would run, find mu_ held, and sleep again (two more context switches per call).
    cv_.notify_all();
    if (mtxcomm_comm_t c = wakeComm_.load()) mtxcomm_comm_wakeup(c);
    return;
  }
  if (!refuse.ok()) e.done(refuse);
}

bool Engine::runInline() {
  if (tInCycle || !cycleMu_.try_lock()) return false;
  std::unique_lock<std::mutex> held(cycleMu_, std::adopt_lock);
  // What may stop it: the engine stopped (the request was failed with the rest), the engine's
  // thread took the request (nothing left), a shutdown, too many bytes for this thread.
  auto eligible = [this](std::vector<Entry>* take) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_ || submitted_.empty()) return 1;
    size_t bytes = 0;
    for (const Entry& e : submitted_) bytes += requestBytes(e.request);
    if (bytes > kInlineBytes || shutdownRequested_) return 0;
    if (take) take->swap(submitted_);
    return 2;
  };
  if (int go = eligible(nullptr); go < 2) return go == 1;
  if (size.load() > 1) {
    // Only a rank with nothing waiting for peers (what the cycle makes ready is then this
    // submission's alone, never a large request of earlier cycles) and whose peers announce
    // their cycles through the segment.
    if (!notifies_ || peerTrouble_ || !local_.empty()) return false;
    // Ask the peers (their engines, or their submitters spinning here, see it) and give them
    // the collectives' spin to come, none when they are all there; past it the engine's thread
    // waits instead of this one.
    const uint64_t next = cycles_ + 1;
    int in = 0;
    mtxcomm_comm_notify(comm_, next);
    mtxcomm_comm_peers_in_cycle(comm_, next, 1, &in);
    if (in < size.load() - 1) return false;
  }
  std::vector<Entry> taken;
  if (int go = eligible(&taken); go < 2) return go == 1;
  inlineCycles.fetch_add(1, std::memory_order_relaxed);
  tInCycle = true;
  cycle(&taken);
  tInCycle = false;
  // The engine's thread takes over what this cycle left: requests submitted meanwhile, ones
  // waiting for peers (it must leave its idle wait for them), or the engine's end.
  const bool left = !local_.empty();
  held.unlock();
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    wake = !submitted_.empty() || stopped_ || left;
  }
  if (wake) {
    cv_.notify_all();
    if (mtxcomm_comm_t c = wakeComm_.load()) mtxcomm_comm_wakeup(c);
  }
  return true;
}

void Engine::loop() {
  pthread_setname_np(pthread_self(), "mtxcomm_engine");  // for top -H, perf and gdb
  for (;;) {
    waitForWork();
    std::lock_guard<std::mutex> held(cycleMu_);
    tInCycle = true;
    const bool more = !stopped() && cycle();
    tInCycle = false;
    if (!more) break;
  }
  std::lock_guard<std::mutex> held(cycleMu_);  // no submitter runs a cycle any more (stopped)
  wakeComm_ = nullptr;
  worldComm = nullptr;
  if (timeline_) timeline_->flush();
  // The handle is gone after the call: its error is this thread's record.
  if (const mtxcomm_result_t rc = mtxcomm_comm_destroy(comm_)) {
    destroyStatus_ = {rc, mtxcomm_get_last_error(comm_)};
  }
  comm_ = nullptr;
}

void Engine::lingerForOwnWork(std::unique_lock<std::mutex>& lk) {
  // Only a rank with nothing of its own anywhere (nothing submitted, nothing waiting for
  // peers, not joined: a joined rank's join waits in local_) and woken by a peer's request.
  if (!notifies_ || !submitted_.empty() || shutdownRequested_ || peerTrouble_ || !local_.empty() ||
      cycleSeconds_ <= 0) {
    return;
  }
  mtxcomm_notify_state_t st{};
  mtxcomm_comm_notify_state(comm_, &st);
  if (st.cycle <= cycles_) return;  // a timer woke it (a stall check or warning): no peer waits
  // At most 1 ms whatever MTXCOMM_CYCLE_TIME says: the peer's cycle may carry a shutdown or a
  // stall verdict, which this rank's own request cannot help, and each waits this long.
  constexpr double kMostSeconds = 0.001;
  cv_.wait_for(lk, seconds(std::min(cycleSeconds_, kMostSeconds)),
               [this] { return !submitted_.empty() || shutdownRequested_; });
}

void Engine::waitForWork() {
  if (!notifies_) {
    // Polling: every rank cycles every MTXCOMM_CYCLE_TIME while idle.
    std::unique_lock<std::mutex> lk(mu_);
    auto wanted = [this] { return !submitted_.empty() || shutdownRequested_ || stopped_; };
    if (size.load() == 1) {
      // No peer: nothing arrives but this process's own submissions, and nothing can stall.
      cv_.wait(lk, wanted);
    } else if (!wanted() && !progress_ && cycleSeconds_ > 0) {
      cv_.wait_for(lk, seconds(cycleSeconds_));
    }
    return;
  }
  for (;;) {
    mtxcomm_notify_state_t seen{};
    double wait = 3600.0;
    {
      // A submitter may run a cycle meanwhile (runInline): the state is read under its lock,
      // and one that leaves work for this thread wakes it after unlocking.
      std::lock_guard<std::mutex> held(cycleMu_);
      // Idle (nothing of this rank's own waits for a peer): a peer's request need not wake this
      // rank at once, its own submission will (mtxcomm_comm_set_idle). Set before the state is
      // taken: a notify either sees it or is seen.
      const bool idle = size.load() > 1 && local_.empty();
      if (idle != idle_) {
        mtxcomm_comm_set_idle(comm_, idle ? 1 : 0);
        idle_ = idle;
      }
      mtxcomm_comm_notify_state(comm_, &seen);  // before looking at the queue: no lost wakeup
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!submitted_.empty() || shutdownRequested_) return;
      }
      if (seen.cycle > cycles_ || peerTrouble_) return;
      const auto now = Clock::now();
      const Clock::time_point due = std::min(nextStallCheck_, nextStallWarning_);
      if (now >= due) return;
      if (due != Clock::time_point::max()) {
        wait = std::min(wait, std::chrono::duration<double>(due - now).count());
      }
    }
    mtxcomm_notify_state_t now_{};
    if (mtxcomm_comm_wait_notify(comm_, &seen, std::max(0.0, wait), &now_) != MTXCOMM_SUCCESS) {
      // A peer died or aborted while this rank slept (or the wait itself failed): nobody will
      // notify this rank, so the next cycle runs its exchange, whose error names the peer.
      std::lock_guard<std::mutex> held(cycleMu_);
      peerTrouble_ = true;
      return;
    }
  }
}

namespace {

Engine& engine() {
  static Engine* e = new Engine();  // never destroyed: its thread may outlive static destructors
  return *e;
}

}  // namespace

Status init() { return engine().init(); }
Status shutdown() { return engine().shutdown(); }
bool isInitialized() { return engine().running(); }
int rank() { return engine().rank.load(); }
int size() { return engine().size.load(); }
int localRank() { return engine().localRank.load(); }
int localSize() { return engine().localSize.load(); }
int cpuShare() { return engine().cpuShare.load(); }
mtxcomm_comm_t worldComm() { return engine().worldComm.load(); }
void enqueue(Entry entry) { engine().enqueue(std::move(entry)); }
uint64_t collectiveCount() { return engine().collectives(); }
uint64_t inlineCycleCount() { return engine().inlineCycles.load(); }

}  // namespace mtxcomm::binding
