// The engine's thread and cycle (engine.h); negotiation.h, executor.h and timeline.h do the rest.
#include "bindings/common/engine.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>

#include "bindings/common/executor.h"
#include "bindings/common/negotiation.h"
#include "bindings/common/timeline.h"

namespace mtxcomm::binding {

namespace {

using Clock = std::chrono::steady_clock;

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

void warn(int rank, const std::string& msg) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "[mtxcomm %s:%d rank %d] WARN %s\n", host, static_cast<int>(getpid()), rank,
               msg.c_str());
  std::fflush(stderr);
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

// A joined rank's part in an operation it did not submit: zero inputs of the agreed shapes,
// outputs into scratch that is thrown away.
Entry standIn(const Request& req) {
  struct Buffers {
    std::vector<std::vector<char>> in, out;
  };
  auto bufs = std::make_shared<Buffers>();
  Entry e;
  e.request = req;
  for (const TensorMeta& t : req.tensors) {
    bufs->in.emplace_back(t.bytes(), 0);
    e.inputs.push_back(bufs->in.back().data());
  }
  bufs->out.resize(req.tensors.size() + 1);  // alltoall: + received splits
  e.allocate = [bufs, req](size_t i, const std::vector<int64_t>& shape, std::string*) -> void* {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    bufs->out[i].assign(std::max<size_t>(1, n * mtxcomm_datatype_size(req.tensors[i].dtype)), 0);
    return bufs->out[i].data();
  };
  e.done = [bufs](const Status&) {};
  return e;
}

class Engine {
 public:
  Status init();
  Status shutdown();
  bool running() {
    std::lock_guard<std::mutex> lk(mu_);
    return thread_.joinable() && !stopped_;
  }
  void enqueue(Entry e);
  uint64_t collectives() {
    std::lock_guard<std::mutex> lk(mu_);
    return (executor_ ? executor_->collectives() : 0) + collectivesBefore_;
  }
  std::atomic<uint64_t> inlineCycles{0};  // cycles a submitting thread ran (runInline)

  std::atomic<int> rank{-1}, size{-1}, localRank{-1}, localSize{-1}, cpuShare{-1};

 private:
  void loop();
  // Sleeps until this rank has work, a peer asks for the next cycle, or a timer is due.
  void waitForWork();
  // One cycle, with cycleMu_ held: of the requests submitted since the last (or of `taken`, the
  // ones a submitter took). false: the engine stops.
  bool cycle(std::vector<Entry>* taken = nullptr);
  // A small request runs its cycle on the submitting thread (Entry::mayRunInline) when no peer
  // will keep it waiting there: in a world of one rank, or when every peer has entered the next
  // cycle (at once, or within the collectives' spin after this rank asked them to). That saves
  // the hand-over to the engine's thread and the completion from another thread, on both sides
  // of a pair of ranks that submit within the spin of each other. false: the engine's thread
  // must run it.
  bool runInline();
  // A peer asked for a cycle and this rank has nothing pending: such a cycle can make nothing
  // ready (every request needs this rank's copy), so wait up to MTXCOMM_CYCLE_TIME (at most
  // 1 ms) for this rank's own submission and bring it to the same cycle. A rank that arrives late
  // by less than that pays one exchange, not two (an empty one, then its own), and its compute is
  // not interrupted for the empty one. The peer waits in the exchange meanwhile (spinning, then on
  // a futex), which it would do for this rank's request anyway. Called with mu_ held.
  void lingerForOwnWork(std::unique_lock<std::mutex>& lk);
  bool exchange(const CycleMessage& msg, std::vector<int>* shutdownRanks,
                std::vector<Cancelled>* cancelled);
  void execute(std::vector<ReadyOp>& ready);
  void finishJoin(ReadyOp& op);
  Status libraryStatus(mtxcomm_result_t rc, const std::string& what) const;
  void failAll(const Status& st);
  Status failureOf(const Request& r) const;
  bool stopped() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopped_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> submitted_;  // guarded by mu_
  // Names of this rank's requests submitted and not yet done (guarded by mu_).
  std::unordered_set<std::string> inFlight_;
  bool shutdownRequested_ = false;
  // What destroying the communicator returned (a check an earlier call left pending that found
  // the ranks disagreeing): shutdown returns it once.
  Status destroyStatus_;
  bool stopped_ = false;
  Status failure_;  // guarded by mu_: set when the engine stopped for good
  std::thread thread_;
  std::unique_ptr<OpExecutor> executor_;           // guarded by mu_ (made and replaced by init)
  uint64_t collectivesBefore_ = 0;                 // run by the executors of earlier inits
  std::atomic<mtxcomm_comm_t> wakeComm_{nullptr};  // for enqueue's wakeup, while running

  // Engine-thread state.
  mtxcomm_comm_t comm_ = nullptr;
  bool notifies_ = false;     // the communicator carries notifications (one node, shm)
  bool peerTrouble_ = false;  // the idle wait found a peer dead or aborted: exchange at once
  bool idle_ = false;         // what this rank last told the peers (mtxcomm_comm_set_idle)
  std::unique_ptr<Negotiation> negotiation_;
  std::unique_ptr<Timeline> timeline_;
  std::map<std::string, std::deque<Entry>> local_;  // this rank's entries per name, FIFO
  uint64_t cycles_ = 0;                             // cycles run (the same on every rank)
  // Serialises cycles: the engine's thread, or a submitter (runInline). What a cycle uses is
  // guarded by it (the engine's idle wait too takes it to look); progress_ is read without.
  std::mutex cycleMu_;
  std::atomic<bool> progress_{false};  // polling mode: the last cycle carried something
  double cycleSeconds_ = 0.001;
  double stallWarnSeconds_ = 60;
  double stallTimeoutSeconds_ = 300;
  Clock::time_point nextStallCheck_ = Clock::time_point::max();
  // When the next MTXCOMM_STALL_WARNING falls due (every rank warns from its own table).
  Clock::time_point nextStallWarning_ = Clock::time_point::max();
  void warnStalled();
};

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

Status Engine::libraryStatus(mtxcomm_result_t rc, const std::string& what) const {
  if (rc == MTXCOMM_SUCCESS) return {};
  return {rc, "mtxcomm " + what + " failed on rank " + std::to_string(rank.load()) + ": " +
                  mtxcomm_get_last_error(comm_)};
}

bool Engine::exchange(const CycleMessage& msg, std::vector<int>* shutdownRanks,
                      std::vector<Cancelled>* cancelled) {
  const int n = size.load();
  const size_t slot = negotiation_->slotBytes();
  std::vector<char> mine(slot);
  std::vector<char> extras = negotiation_->encode(msg, mine.data());
  std::vector<char> all(slot * n);
  Status st =
      libraryStatus(mtxcomm_allgather(mine.data(), all.data(), slot, MTXCOMM_UINT8, comm_, nullptr),
                    "negotiation (allgather of requests)");
  size_t stride = 0;
  std::vector<char> allExtras;
  if (st.ok() && negotiation_->needsSecondExchange(all, &stride)) {
    stride = (stride + 7) / 8 * 8;
    extras.resize(stride, 0);
    allExtras.resize(stride * n);
    st = libraryStatus(
        mtxcomm_allgather(extras.data(), allExtras.data(), stride, MTXCOMM_UINT8, comm_, nullptr),
        "negotiation (allgather of new requests)");
  }
  if (st.ok()) {
    try {
      *shutdownRanks = negotiation_->ingest(all, allExtras, stride, cancelled);
    } catch (const std::exception& ex) {
      st = {MTXCOMM_INTERNAL_ERROR, std::string("mtxcomm negotiation: ") + ex.what()};
    }
  }
  if (!st.ok()) {
    failAll(st);
    return false;
  }
  return true;
}

bool Engine::cycle(std::vector<Entry>* taken) {
  std::vector<Entry> fresh;
  bool wantShutdown;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (taken) {
      fresh.swap(*taken);
    } else {
      lingerForOwnWork(lk);
      fresh.swap(submitted_);
    }
    wantShutdown = shutdownRequested_;
  }
  const auto cycleStart = Clock::now();  // the timeline's CYCLE: after any linger
  CycleMessage msg;
  msg.shutdown = wantShutdown;
  for (Entry& e : fresh) {
    const int id = negotiation_->cachedId(e.request);
    if (id >= 0) {
      msg.cached.push_back(static_cast<uint32_t>(id));
    } else {
      msg.requests.push_back(e.request);
    }
    std::string name = e.request.name;
    local_[name].push_back(std::move(e));
  }
  std::sort(msg.cached.begin(), msg.cached.end());
  if (rank.load() == 0) {
    msg.cancelled = negotiation_->stallVerdicts(stallTimeoutSeconds_, &nextStallCheck_);
  }
  if (notifies_) {
    const bool reason = !fresh.empty() || wantShutdown || !msg.cancelled.empty() || peerTrouble_;
    if (reason) {
      mtxcomm_comm_notify(comm_, cycles_ + 1);  // every rank joins this cycle promptly
    } else {
      // Woken by a timer with nothing to say: run the cycle only if a peer asked for it.
      mtxcomm_notify_state_t st{};
      mtxcomm_comm_notify_state(comm_, &st);
      if (st.cycle > cycles_) mtxcomm_comm_enter_cycle(comm_, cycles_ + 1);  // runInline looks
      if (st.cycle <= cycles_) {
        warnStalled();
        if (rank.load() == 0 && nextStallCheck_ <= Clock::now()) {
          Clock::time_point next;
          negotiation_->stallVerdicts(stallTimeoutSeconds_, &next);
          nextStallCheck_ = next;
        }
        return true;
      }
    }
  }
  std::vector<int> shutdownRanks;
  std::vector<Cancelled> cancelled;
  if (!exchange(msg, &shutdownRanks, &cancelled)) return false;
  peerTrouble_ = false;
  ++cycles_;
  const auto agreedAt = Clock::now();
  if (timeline_) {
    timeline_->complete(
        "engine", "CYCLE", cycleStart, agreedAt,
        "\"cycle\": " + std::to_string(cycles_) + ", \"new\": " + std::to_string(fresh.size()));
  }
  const int me = rank.load();
  if (!cancelled.empty()) {
    // A stall error: every rank, the ones that never submitted the tensor too, leaves its
    // flight record (docs/debugging.md).
    char dir[4096] = "";
    mtxcomm_comm_dump_flight_recorder(comm_, cancelled.front().message.c_str(), dir, sizeof(dir));
    if (dir[0]) {
      warn(me, std::string("flight recorder written to ") + dir + ": mtxcomm_info --why-stuck " +
                   dir + " tells which rank the job waits for");
    }
  }
  for (const Cancelled& cx : cancelled) {
    if (std::find(cx.ranks.begin(), cx.ranks.end(), me) == cx.ranks.end()) continue;
    auto it = local_.find(cx.name);
    if (it == local_.end() || it->second.empty()) continue;
    Entry e = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) local_.erase(it);
    e.done({MTXCOMM_TIMEOUT, cx.message});
  }
  progress_ = !fresh.empty() || wantShutdown || !cancelled.empty();
  std::vector<ReadyOp> ready;
  for (Agreed& a : negotiation_->takeReady()) {
    ReadyOp op;
    op.agreedAt = agreedAt;
    if (a.joined[me]) {
      op.entry = standIn(a.requests[me]);
    } else {
      auto it = local_.find(a.name);
      op.entry = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) local_.erase(it);
      if (timeline_ && timeline_->enabled()) {
        std::string args = "\"cycle\": " + std::to_string(cycles_) + ", \"arrival_us\": {";
        for (size_t r = 0; r < a.arrivalUs.size(); ++r) {
          args += (r ? ", " : "") + std::string("\"") + std::to_string(r) +
                  "\": " + (a.joined[r] ? std::string("null") : std::to_string(a.arrivalUs[r]));
        }
        timeline_->complete(a.name, "NEGOTIATE", op.entry.submitted, agreedAt, args + "}");
      }
    }
    op.agreed = std::move(a);
    ready.push_back(std::move(op));
  }
  progress_ = progress_ || !ready.empty();
  execute(ready);
  if (timeline_) timeline_->flush();
  if (stopped()) return false;
  if (!shutdownRanks.empty()) {
    std::string who = rankList(shutdownRanks);
    failAll({MTXCOMM_REMOTE_ERROR,
             "mtxcomm was shut down: " + who +
                 " called shutdown() (or exited) before this request could run (it waited for "
                 "that rank, or came after); every rank must submit the same collectives before "
                 "shutting down"});
    return false;
  }
  warnStalled();
  if (me == 0 && negotiation_->pending()) {
    Clock::time_point next;
    negotiation_->stallVerdicts(stallTimeoutSeconds_, &next);
    nextStallCheck_ = next;
  } else if (me == 0) {
    nextStallCheck_ = Clock::time_point::max();
  }
  return true;
}

void Engine::warnStalled() {
  for (const std::string& w : negotiation_->stalled(stallWarnSeconds_)) warn(rank.load(), w);
  nextStallWarning_ = negotiation_->nextStallWarning(stallWarnSeconds_);
}

void Engine::finishJoin(ReadyOp& op) {
  std::string err;
  void* out = op.entry.allocate(0, {}, &err);
  if (out) {
    const int32_t last = op.agreed.lastJoined;
    std::memcpy(out, &last, sizeof(last));
  }
  op.entry.done(out ? Status{} : Status{MTXCOMM_SYSTEM_ERROR, "mtxcomm join: " + err});
}

void Engine::execute(std::vector<ReadyOp>& ready) {
  // Run in the agreed order; consecutive allreduces of one op are fused.
  size_t i = 0;
  while (i < ready.size()) {
    if (stopped()) {  // a collective failed: the rest cannot run
      for (size_t k = i; k < ready.size(); ++k)
        ready[k].entry.done(failureOf(ready[k].entry.request));
      return;
    }
    Status st = negotiation_->check(ready[i].agreed);
    if (!st.ok()) {
      ready[i].entry.done(st);
      ++i;
      continue;
    }
    negotiation_->remember(ready[i].agreed);
    const Request& first = ready[i].agreed.requests[rank.load()];
    if (first.kind == Kind::kJoin) {
      finishJoin(ready[i]);
      ++i;
      continue;
    }
    if (first.kind != Kind::kAllreduce) {
      st = executor_->runOne(ready[i]);
      if (!st.ok()) failAll(st);
      ++i;
      continue;
    }
    std::vector<ReadyOp*> group{&ready[i]};
    size_t j = i + 1;
    while (j < ready.size() && ready[j].agreed.requests[0].kind == Kind::kAllreduce &&
           ready[j].agreed.requests[0].op == first.op &&
           negotiation_->check(ready[j].agreed).ok()) {
      negotiation_->remember(ready[j].agreed);
      group.push_back(&ready[j]);
      ++j;
    }
    st = executor_->runAllreduces(group);
    if (!st.ok()) failAll(st);
    i = j;
  }
}

// Stops the engine for good: every waiting entry, and every later one, gets st.
void Engine::failAll(const Status& st) {
  std::vector<Entry> pending;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopped_) {
      stopped_ = true;
      failure_ = st;
    }
    for (Entry& e : submitted_) pending.push_back(std::move(e));
    submitted_.clear();
  }
  for (auto& kv : local_) {
    for (Entry& e : kv.second) pending.push_back(std::move(e));
  }
  local_.clear();
  negotiation_->clear();
  for (Entry& e : pending) e.done(failureOf(e.request));
}

// The engine's failure as one request hears it, named the same whether the request waited when
// the engine stopped or came after.
Status Engine::failureOf(const Request& r) const {
  Status s = failure_;
  s.message = std::string(kindName(r.kind)) + " '" + r.name + "': " + s.message;
  return s;
}

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
void enqueue(Entry entry) { engine().enqueue(std::move(entry)); }
uint64_t collectiveCount() { return engine().collectives(); }
uint64_t inlineCycleCount() { return engine().inlineCycles.load(); }

}  // namespace mtxcomm::binding
