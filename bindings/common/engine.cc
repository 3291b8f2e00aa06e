// The engine's thread and cycle (engine.h); negotiation.h and executor.h do the rest.
#include "bindings/common/engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "bindings/common/executor.h"
#include "bindings/common/negotiation.h"

namespace mtxcomm::binding {

namespace {

void warn(int rank, const std::string& msg) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "[mtxcomm %s:%d rank %d] WARN %s\n", host, static_cast<int>(getpid()), rank,
               msg.c_str());
  std::fflush(stderr);
}

double configNumber(const char* name, double fallback) {
  char buf[64];
  if (mtxcomm_config_get(name, buf, sizeof(buf)) != MTXCOMM_SUCCESS) return fallback;
  return std::strtod(buf, nullptr);
}

class Engine {
 public:
  Status init();
  void shutdown();
  bool running() {
    std::lock_guard<std::mutex> lk(mu_);
    return thread_.joinable() && !stopped_;
  }
  void enqueue(Entry e);
  uint64_t collectives() {
    std::lock_guard<std::mutex> lk(mu_);
    return (executor_ ? executor_->collectives() : 0) + collectivesBefore_;
  }

  std::atomic<int> rank{-1}, size{-1}, localRank{-1}, localSize{-1};

 private:
  void loop();
  bool cycle();  // false: the engine stops
  void execute(std::vector<ReadyOp>& ready);
  Status libraryStatus(mtxcomm_result_t rc, const std::string& what) const;
  void failAll(const Status& st);
  bool stopped() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopped_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> submitted_;  // guarded by mu_
  bool shutdownRequested_ = false;
  bool stopped_ = false;
  Status failure_;  // guarded by mu_: set when the engine stopped for good
  std::thread thread_;
  std::unique_ptr<OpExecutor> executor_;  // guarded by mu_ (made and replaced by init)
  uint64_t collectivesBefore_ = 0;        // run by the executors of earlier inits

  // Engine-thread state.
  mtxcomm_comm_t comm_ = nullptr;
  std::unique_ptr<Negotiation> negotiation_;
  std::map<std::string, std::deque<Entry>> local_;  // this rank's entries per name, FIFO
  bool progress_ = false;  // the last cycle carried a request or a shutdown
  double cycleSeconds_ = 0.001;
  double stallSeconds_ = 60;
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
  int r = 0, n = 0, lr = 0, ln = 0;
  mtxcomm_comm_rank(comm, &r);
  mtxcomm_comm_size(comm, &n);
  mtxcomm_comm_local_rank(comm, &lr);
  mtxcomm_comm_local_size(comm, &ln);
  rank = r;
  size = n;
  localRank = lr;
  localSize = ln;
  cycleSeconds_ = configNumber("MTXCOMM_CYCLE_TIME", 0.001);
  const auto fusionBytes = static_cast<size_t>(configNumber("MTXCOMM_FUSION_BYTES", 64 << 20));
  stallSeconds_ = configNumber("MTXCOMM_STALL_WARNING", 60);
  comm_ = comm;
  negotiation_ = std::make_unique<Negotiation>(r, n);
  if (executor_) collectivesBefore_ += executor_->collectives();
  executor_ = std::make_unique<OpExecutor>(comm, r, n, fusionBytes);
  local_.clear();
  submitted_.clear();
  shutdownRequested_ = false;
  stopped_ = false;
  failure_ = {};
  thread_ = std::thread([this] { loop(); });
  return {};
}

void Engine::shutdown() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) return;
    shutdownRequested_ = true;
    cv_.notify_all();
    t = std::move(thread_);
  }
  t.join();
  rank = size = localRank = localSize = -1;
}

void Engine::enqueue(Entry e) {
  Status refuse;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) {
      refuse = {MTXCOMM_INVALID_USAGE,
                "mtxcomm is not initialised: call init() first (or it was shut down)"};
    } else if (stopped_) {
      refuse = failure_;
    } else {
      submitted_.push_back(std::move(e));
      cv_.notify_all();
      return;
    }
  }
  e.done(refuse);
}

void Engine::loop() {
  while (cycle()) {
  }
  mtxcomm_comm_destroy(comm_);
  comm_ = nullptr;
}

Status Engine::libraryStatus(mtxcomm_result_t rc, const std::string& what) const {
  if (rc == MTXCOMM_SUCCESS) return {};
  return {rc, "mtxcomm " + what + " failed on rank " + std::to_string(rank.load()) + ": " +
                  mtxcomm_get_last_error(comm_)};
}

bool Engine::cycle() {
  std::vector<Entry> fresh;
  bool wantShutdown;
  {
    std::unique_lock<std::mutex> lk(mu_);
    // Idle: the last cycle brought nothing new. Sleep one cycle time unless work arrives.
    if (submitted_.empty() && !shutdownRequested_ && !progress_ && cycleSeconds_ > 0) {
      cv_.wait_for(lk, std::chrono::duration<double>(cycleSeconds_));
    }
    fresh.swap(submitted_);
    wantShutdown = shutdownRequested_;
  }
  std::vector<const Request*> requests;
  for (const Entry& e : fresh) requests.push_back(&e.request);
  std::vector<char> mine = encodeCycle(wantShutdown, requests);
  for (Entry& e : fresh) {
    std::string name = e.request.name;
    local_[name].push_back(std::move(e));
  }
  const int n = size.load();

  // Agree on this cycle's messages: their lengths, then the messages padded to the longest.
  uint64_t len = mine.size();
  std::vector<uint64_t> lens(n);
  Status st = libraryStatus(mtxcomm_allgather(&len, lens.data(), 1, MTXCOMM_UINT64, comm_, nullptr),
                            "negotiation (allgather of request sizes)");
  std::vector<int> shutdownRanks;
  if (st.ok()) {
    const size_t stride = *std::max_element(lens.begin(), lens.end());
    mine.resize(stride, 0);
    std::vector<char> all(stride * n);
    st = libraryStatus(
        mtxcomm_allgather(mine.data(), all.data(), stride, MTXCOMM_UINT8, comm_, nullptr),
        "negotiation (allgather of requests)");
    if (st.ok()) {
      try {
        shutdownRanks = negotiation_->ingest(all, stride);
      } catch (const std::exception& ex) {
        st = {MTXCOMM_INTERNAL_ERROR, std::string("mtxcomm negotiation: ") + ex.what()};
      }
    }
  }
  if (!st.ok()) {
    failAll(st);
    return false;
  }
  progress_ = false;
  for (uint64_t l : lens) progress_ = progress_ || l > kEmptyCycleBytes;
  std::vector<ReadyOp> ready;
  for (Agreed& a : negotiation_->takeReady()) {
    auto it = local_.find(a.name);
    ReadyOp op{std::move(a), std::move(it->second.front())};
    it->second.pop_front();
    if (it->second.empty()) local_.erase(it);
    ready.push_back(std::move(op));
  }
  execute(ready);
  if (stopped()) return false;
  if (!shutdownRanks.empty()) {
    std::string who = rankList(shutdownRanks);
    failAll(
        {MTXCOMM_REMOTE_ERROR,
         "mtxcomm was shut down: " + who +
             " called shutdown() (or exited) while this request "
             "waited for it; every rank must submit the same collectives before shutting down"});
    return false;
  }
  for (const std::string& w : negotiation_->stalled(stallSeconds_)) warn(rank.load(), w);
  return true;
}

void Engine::execute(std::vector<ReadyOp>& ready) {
  // Run in the agreed order; consecutive allreduces of one dtype and op are fused.
  size_t i = 0;
  while (i < ready.size()) {
    if (stopped()) {  // a collective failed: the rest cannot run
      for (size_t k = i; k < ready.size(); ++k) ready[k].entry.done(failure_);
      return;
    }
    Status st = negotiation_->check(ready[i].agreed);
    if (!st.ok()) {
      ready[i].entry.done(st);
      ++i;
      continue;
    }
    const Request& first = ready[i].agreed.requests[0];
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
  for (Entry& e : pending) {
    Status s = failure_;
    s.message = std::string(kindName(e.request.kind)) + " '" + e.request.name + "': " + s.message;
    e.done(s);
  }
}

Engine& engine() {
  static Engine* e = new Engine();  // never destroyed: its thread may outlive static destructors
  return *e;
}

}  // namespace

Status init() { return engine().init(); }
void shutdown() { engine().shutdown(); }
bool isInitialized() { return engine().running(); }
int rank() { return engine().rank.load(); }
int size() { return engine().size.load(); }
int localRank() { return engine().localRank.load(); }
int localSize() { return engine().localSize.load(); }
void enqueue(Entry entry) { engine().enqueue(std::move(entry)); }
uint64_t collectiveCount() { return engine().collectives(); }

}  // namespace mtxcomm::binding
