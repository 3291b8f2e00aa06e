#include "bindings/tensorflow/engine.h"

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
#include <sstream>
#include <thread>

namespace mtxcomm::binding {

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduceScatter:
      return "reducescatter";
  }
  return "?";
}

size_t TensorMeta::elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {

using Clock = std::chrono::steady_clock;

const char* dtypeName(mtxcomm_datatype_t t) {
  static const char* kNames[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                 "uint64", "float16", "bfloat16", "float32", "float64"};
  return t >= 0 && t < MTXCOMM_NUM_DATATYPES ? kNames[t] : "?";
}

const char* opName(mtxcomm_op_t op) {
  static const char* kNames[] = {"sum", "prod", "min", "max", "avg"};
  return op >= 0 && op < MTXCOMM_NUM_OPS ? kNames[op] : "?";
}

std::string describeTensors(const Request& r) {
  std::ostringstream s;
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    s << (i ? ", " : "") << dtypeName(r.tensors[i].dtype) << "[";
    for (size_t d = 0; d < r.tensors[i].shape.size(); ++d) {
      s << (d ? "," : "") << r.tensors[i].shape[d];
    }
    s << "]";
  }
  return s.str();
}

std::string describeRequest(const Request& r) {
  std::ostringstream s;
  s << kindName(r.kind);
  if (r.kind == Kind::kAllreduce || r.kind == Kind::kReduceScatter) s << "(" << opName(r.op) << ")";
  if (r.kind == Kind::kBroadcast) s << "(root " << r.root << ")";
  s << " of " << describeTensors(r);
  return s.str();
}

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? "," : "") << ranks[i];
  return s.str();
}

void warn(int rank, const std::string& msg) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "[mtxcomm %s:%d rank %d] WARN %s\n", host, static_cast<int>(getpid()), rank,
               msg.c_str());
  std::fflush(stderr);
}

// ---- wire format of one cycle's message --------------------------------------------------

class Writer {
 public:
  template <class T>
  void put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  std::vector<char>& bytes() { return buf_; }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  template <class T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string getString() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }

 private:
  void need(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw std::runtime_error("truncated request message");
  }
  const char* p_;
  const char* end_;
};

constexpr uint8_t kFlagShutdown = 1;

void writeRequest(Writer& w, const Request& r) {
  w.put<uint8_t>(static_cast<uint8_t>(r.kind));
  w.put<uint8_t>(static_cast<uint8_t>(r.op));
  w.put<int32_t>(r.root);
  w.putString(r.name);
  w.put<uint32_t>(static_cast<uint32_t>(r.tensors.size()));
  for (const TensorMeta& t : r.tensors) {
    w.put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) w.put<int64_t>(d);
  }
}

Request readRequest(Reader& rd) {
  Request r;
  r.kind = static_cast<Kind>(rd.get<uint8_t>());
  r.op = static_cast<mtxcomm_op_t>(rd.get<uint8_t>());
  r.root = rd.get<int32_t>();
  r.name = rd.getString();
  uint32_t nt = rd.get<uint32_t>();
  r.tensors.resize(nt);
  for (TensorMeta& t : r.tensors) {
    t.dtype = static_cast<mtxcomm_datatype_t>(rd.get<uint8_t>());
    uint32_t nd = rd.get<uint32_t>();
    t.shape.resize(nd);
    for (int64_t& d : t.shape) d = rd.get<int64_t>();
  }
  return r;
}

// ---- the engine ----------------------------------------------------------------------------

// What every rank knows about one name: per rank, the requests not yet run, oldest first.
struct NameQueue {
  struct Item {
    Request request;
    uint64_t order;  // global arrival number, the same on every rank
    Clock::time_point arrived;
  };
  std::vector<std::deque<Item>> perRank;
  bool stallWarned = false;
};

// One ready operation: the request of every rank, and this rank's entry.
struct Ready {
  std::vector<Request> requests;  // indexed by rank
  Entry entry;
  uint64_t order;
};

class Engine {
 public:
  Status init();
  void shutdown();
  bool running() {
    std::lock_guard<std::mutex> lk(mu_);
    return thread_.joinable() && !stopped_;
  }
  void enqueue(Entry e);

  std::atomic<int> rank{-1}, size{-1}, localRank{-1}, localSize{-1};
  std::atomic<uint64_t> collectives{0};

 private:
  void loop();
  bool cycle();  // false: the engine stops
  void ingest(const std::vector<char>& all, size_t stride, std::vector<int>* shutdownRanks);
  std::vector<Ready> takeReady();
  Status check(const Ready& op) const;
  void execute(std::vector<Ready>& ready);
  void runAllreduces(std::vector<Ready*>& group);
  Status runOne(Ready& op);
  Status libraryStatus(mtxcomm_result_t rc, const std::string& what) const;
  void failAll(const Status& st);
  bool stopped() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopped_;
  }
  void stallCheck();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> submitted_;  // guarded by mu_
  bool shutdownRequested_ = false;
  bool stopped_ = false;
  Status failure_;  // guarded by mu_: set when the engine stopped for good
  std::thread thread_;

  // Engine-thread state.
  mtxcomm_comm_t comm_ = nullptr;
  std::map<std::string, NameQueue> table_;
  std::map<std::string, std::deque<Entry>> local_;  // this rank's entries per name, FIFO
  uint64_t nextOrder_ = 0;
  bool progress_ = false;  // the last cycle carried a request or a shutdown
  double cycleSeconds_ = 0.001;
  size_t fusionBytes_ = 64 << 20;
  double stallSeconds_ = 60;
  std::vector<char> fusion_;
};

double configNumber(const char* name, double fallback) {
  char buf[64];
  if (mtxcomm_config_get(name, buf, sizeof(buf)) != MTXCOMM_SUCCESS) return fallback;
  return std::strtod(buf, nullptr);
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
  fusionBytes_ = static_cast<size_t>(configNumber("MTXCOMM_FUSION_BYTES", 64 << 20));
  stallSeconds_ = configNumber("MTXCOMM_STALL_WARNING", 60);
  comm_ = comm;
  table_.clear();
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
  Writer w;
  w.put<uint8_t>(wantShutdown ? kFlagShutdown : 0);
  w.put<uint32_t>(static_cast<uint32_t>(fresh.size()));
  for (Entry& e : fresh) {
    writeRequest(w, e.request);
    std::string name = e.request.name;
    local_[name].push_back(std::move(e));
  }
  std::vector<char>& mine = w.bytes();
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
        ingest(all, stride, &shutdownRanks);
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
  for (uint64_t l : lens) progress_ = progress_ || l > sizeof(uint8_t) + sizeof(uint32_t);
  std::vector<Ready> ready = takeReady();
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
  stallCheck();
  return true;
}

void Engine::ingest(const std::vector<char>& all, size_t stride, std::vector<int>* shutdownRanks) {
  const int n = size.load();
  const auto now = Clock::now();
  for (int r = 0; r < n; ++r) {
    Reader rd(all.data() + r * stride, stride);
    uint8_t flags = rd.get<uint8_t>();
    if (flags & kFlagShutdown) shutdownRanks->push_back(r);
    uint32_t count = rd.get<uint32_t>();
    for (uint32_t i = 0; i < count; ++i) {
      Request req = readRequest(rd);
      NameQueue& q = table_[req.name];
      if (q.perRank.empty()) q.perRank.resize(n);
      q.perRank[r].push_back({std::move(req), nextOrder_++, now});
    }
  }
}

std::vector<Ready> Engine::takeReady() {
  std::vector<Ready> ready;
  for (auto it = table_.begin(); it != table_.end();) {
    NameQueue& q = it->second;
    for (;;) {
      bool complete = true;
      for (auto& d : q.perRank) complete = complete && !d.empty();
      if (!complete) break;
      Ready op;
      op.order = 0;
      for (auto& d : q.perRank) {
        op.order = std::max(op.order, d.front().order);
        op.requests.push_back(std::move(d.front().request));
        d.pop_front();
      }
      auto& mineQ = local_[it->first];
      op.entry = std::move(mineQ.front());
      mineQ.pop_front();
      if (mineQ.empty()) local_.erase(it->first);
      ready.push_back(std::move(op));
      q.stallWarned = false;
    }
    bool empty = true;
    for (auto& d : q.perRank) empty = empty && d.empty();
    it = empty ? table_.erase(it) : std::next(it);
  }
  std::sort(ready.begin(), ready.end(),
            [](const Ready& a, const Ready& b) { return a.order < b.order; });
  return ready;
}

// The ranks must agree on everything but what a collective lets differ (the first dimension of
// an allgather). The message is computed from the agreed table, so it is the same on every rank.
Status Engine::check(const Ready& op) const {
  const Request& r0 = op.requests[0];
  const Request& mine = op.requests[rank.load()];
  const std::string head = std::string(kindName(mine.kind)) + " '" + mine.name + "'";
  auto mismatch = [&](const char* what, auto&& same) -> Status {
    std::vector<int> bad;
    for (size_t r = 1; r < op.requests.size(); ++r) {
      if (!same(op.requests[r])) bad.push_back(static_cast<int>(r));
    }
    if (bad.empty()) return {};
    std::ostringstream s;
    s << "mtxcomm " << head << ": the ranks disagree on the " << what << ": rank 0 has "
      << describeRequest(r0);
    for (int r : bad) s << ", rank " << r << " has " << describeRequest(op.requests[r]);
    return {MTXCOMM_INVALID_ARGUMENT, s.str()};
  };
  Status st = mismatch("collective", [&](const Request& r) { return r.kind == r0.kind; });
  if (!st.ok()) return st;
  if (r0.kind == Kind::kAllreduce || r0.kind == Kind::kReduceScatter) {
    st = mismatch("reduction op", [&](const Request& r) { return r.op == r0.op; });
    if (!st.ok()) return st;
  }
  if (r0.kind == Kind::kBroadcast) {
    st = mismatch("root", [&](const Request& r) { return r.root == r0.root; });
    if (!st.ok()) return st;
    if (r0.root < 0 || r0.root >= size.load()) {
      return {MTXCOMM_INVALID_ARGUMENT, "mtxcomm " + head + ": root_rank " +
                                            std::to_string(r0.root) + " is not in [0, " +
                                            std::to_string(size.load()) + ")"};
    }
  }
  st = mismatch("number of tensors",
                [&](const Request& r) { return r.tensors.size() == r0.tensors.size(); });
  if (!st.ok()) return st;
  st = mismatch("dtypes", [&](const Request& r) {
    for (size_t i = 0; i < r.tensors.size(); ++i) {
      if (r.tensors[i].dtype != r0.tensors[i].dtype) return false;
    }
    return true;
  });
  if (!st.ok()) return st;
  const bool firstMayDiffer = r0.kind == Kind::kAllgather;
  st = mismatch(firstMayDiffer ? "shape after the first dimension" : "shapes",
                [&](const Request& r) {
                  for (size_t i = 0; i < r.tensors.size(); ++i) {
                    const auto& a = r.tensors[i].shape;
                    const auto& b = r0.tensors[i].shape;
                    if (a.size() != b.size()) return false;
                    for (size_t d = firstMayDiffer ? 1 : 0; d < a.size(); ++d) {
                      if (a[d] != b[d]) return false;
                    }
                  }
                  return true;
                });
  if (!st.ok()) return st;
  if ((r0.kind == Kind::kAllgather || r0.kind == Kind::kReduceScatter) &&
      r0.tensors[0].shape.empty()) {
    return {MTXCOMM_INVALID_ARGUMENT,
            "mtxcomm " + head + ": the tensor must have at least one dimension (got a scalar)"};
  }
  return {};
}

void Engine::execute(std::vector<Ready>& ready) {
  // Run in the agreed order; consecutive allreduces of one dtype and op are fused.
  size_t i = 0;
  while (i < ready.size()) {
    if (stopped()) {  // a collective failed: the rest cannot run
      for (size_t k = i; k < ready.size(); ++k) ready[k].entry.done(failure_);
      return;
    }
    Status st = check(ready[i]);
    if (!st.ok()) {
      ready[i].entry.done(st);
      ++i;
      continue;
    }
    if (ready[i].requests[0].kind != Kind::kAllreduce) {
      ready[i].entry.done(runOne(ready[i]));
      ++i;
      continue;
    }
    std::vector<Ready*> group{&ready[i]};
    size_t j = i + 1;
    while (j < ready.size() && ready[j].requests[0].kind == Kind::kAllreduce &&
           ready[j].requests[0].op == ready[i].requests[0].op && check(ready[j]).ok()) {
      group.push_back(&ready[j]);
      ++j;
    }
    runAllreduces(group);
    i = j;
  }
}

// Allreduces of several entries (each with one or more tensors): tensors are bucketed by dtype
// in their agreed order, and each bucket is reduced in fusion-buffer sized pieces. A tensor
// larger than the fusion buffer, or alone in its piece, is reduced straight from its input into
// its output.
void Engine::runAllreduces(std::vector<Ready*>& group) {
  struct Piece {
    Ready* op;
    size_t tensor;
    const void* in;
    void* out;
    size_t bytes;
    size_t count;
  };
  const mtxcomm_op_t op = group[0]->requests[0].op;
  std::map<Ready*, Status> status;
  std::map<int, std::vector<Piece>> byDtype;
  std::vector<int> dtypeOrder;
  for (Ready* r : group) {
    const Request& req = r->requests[0];
    for (size_t t = 0; t < req.tensors.size(); ++t) {
      const TensorMeta& m = req.tensors[t];
      std::string err;
      void* out = r->entry.allocate(t, m.shape, &err);
      if (!out && m.elements() > 0) {
        status[r] = {MTXCOMM_SYSTEM_ERROR, "mtxcomm allreduce '" + req.name + "': " + err};
      }
      if (!byDtype.count(m.dtype)) dtypeOrder.push_back(m.dtype);
      byDtype[m.dtype].push_back({r, t, r->entry.inputs[t], out,
                                  m.elements() * mtxcomm_datatype_size(m.dtype), m.elements()});
    }
  }
  // An allocation failure on one rank must not desynchronise the ranks: every piece is still
  // reduced (from a zero buffer if need be); only that entry reports the error.
  for (int dt : dtypeOrder) {
    auto dtype = static_cast<mtxcomm_datatype_t>(dt);
    const size_t esize = mtxcomm_datatype_size(dtype);
    std::vector<Piece>& pieces = byDtype[dt];
    size_t p = 0;
    while (p < pieces.size()) {
      size_t q = p, bytes = 0;
      while (q < pieces.size() && (q == p || bytes + pieces[q].bytes <= fusionBytes_)) {
        bytes += pieces[q].bytes;
        ++q;
      }
      Status st;
      if (q == p + 1) {
        Piece& pc = pieces[p];
        std::vector<char> scratch;
        void* out = pc.out;
        if (!out) {
          scratch.resize(pc.bytes);
          out = scratch.data();
        }
        st = libraryStatus(mtxcomm_allreduce(pc.in, out, pc.count, dtype, op, comm_, nullptr),
                           "allreduce '" + pc.op->requests[0].name + "'");
      } else {
        if (fusion_.size() < bytes) fusion_.resize(bytes);
        size_t off = 0;
        for (size_t k = p; k < q; ++k) {
          std::memcpy(fusion_.data() + off, pieces[k].in, pieces[k].bytes);
          off += pieces[k].bytes;
        }
        st = libraryStatus(mtxcomm_allreduce(fusion_.data(), fusion_.data(), bytes / esize, dtype,
                                             op, comm_, nullptr),
                           "allreduce of " + std::to_string(q - p) + " fused tensors (first '" +
                               pieces[p].op->requests[0].name + "')");
        off = 0;
        for (size_t k = p; k < q; ++k) {
          if (pieces[k].out) std::memcpy(pieces[k].out, fusion_.data() + off, pieces[k].bytes);
          off += pieces[k].bytes;
        }
      }
      collectives.fetch_add(1);
      for (size_t k = p; k < q; ++k) {
        if (!st.ok() && status[pieces[k].op].ok()) status[pieces[k].op] = st;
      }
      if (!st.ok()) {
        // The communicator is poisoned: report to these entries, then stop everything.
        for (Ready* r : group) r->entry.done(status[r].ok() ? st : status[r]);
        failAll(st);
        return;
      }
      p = q;
    }
  }
  for (Ready* r : group) r->entry.done(status[r]);
}

Status Engine::runOne(Ready& op) {
  const int n = size.load();
  const int me = rank.load();
  const Request& req = op.requests[me];
  const TensorMeta& m = req.tensors[0];
  const mtxcomm_datatype_t dtype = m.dtype;
  const size_t esize = mtxcomm_datatype_size(dtype);
  const std::string what = std::string(kindName(req.kind)) + " '" + req.name + "'";
  // Elements per row of dimension 0 (the whole tensor for a scalar).
  size_t rowElems = 1;
  for (size_t d = 1; d < m.shape.size(); ++d) rowElems *= static_cast<size_t>(m.shape[d]);
  std::string err;
  auto alloc = [&](const std::vector<int64_t>& shape) -> void* {
    size_t elems = 1;
    for (int64_t d : shape) elems *= static_cast<size_t>(d);
    void* p = op.entry.allocate(0, shape, &err);
    return p || elems == 0 ? p : nullptr;
  };
  Status st;
  switch (req.kind) {
    case Kind::kBroadcast: {
      void* out = alloc(m.shape);
      std::vector<char> scratch;
      if (!out) scratch.resize(m.elements() * esize), out = scratch.data();
      st = libraryStatus(
          mtxcomm_broadcast(op.entry.inputs[0], out, m.elements(), dtype, req.root, comm_, nullptr),
          what);
      break;
    }
    case Kind::kAllgather: {
      std::vector<size_t> rows(n);
      size_t total = 0, maxRows = 0;
      for (int r = 0; r < n; ++r) {
        rows[r] = static_cast<size_t>(op.requests[r].tensors[0].shape[0]);
        total += rows[r];
        maxRows = std::max(maxRows, rows[r]);
      }
      std::vector<int64_t> shape = m.shape;
      shape[0] = static_cast<int64_t>(total);
      void* out = alloc(shape);
      std::vector<char> scratch;
      if (!out) scratch.resize(total * rowElems * esize), out = scratch.data();
      const size_t block = maxRows * rowElems;  // elements each rank contributes, padded
      bool even = true;
      for (size_t r : rows) even = even && r == maxRows;
      if (even) {
        st = libraryStatus(mtxcomm_allgather(op.entry.inputs[0], out, block, dtype, comm_, nullptr),
                           what);
      } else {
        std::vector<char> send(block * esize, 0), recv(block * esize * n);
        std::memcpy(send.data(), op.entry.inputs[0], rows[me] * rowElems * esize);
        st = libraryStatus(
            mtxcomm_allgather(send.data(), recv.data(), block, dtype, comm_, nullptr), what);
        size_t off = 0;
        for (int r = 0; r < n && st.ok(); ++r) {
          std::memcpy(static_cast<char*>(out) + off, recv.data() + r * block * esize,
                      rows[r] * rowElems * esize);
          off += rows[r] * rowElems * esize;
        }
      }
      break;
    }
    case Kind::kReduceScatter: {
      // Rank r gets rows [start_r, start_r + rows_r) of the reduced tensor; the first
      // (dim0 % size) ranks get one extra row.
      const size_t dim0 = static_cast<size_t>(m.shape[0]);
      auto rowsOf = [&](int r) { return dim0 / n + (static_cast<size_t>(r) < dim0 % n ? 1 : 0); };
      const size_t maxRows = rowsOf(0);
      std::vector<int64_t> shape = m.shape;
      shape[0] = static_cast<int64_t>(rowsOf(me));
      void* out = alloc(shape);
      std::vector<char> scratch;
      const size_t block = maxRows * rowElems;
      if (!out) scratch.resize(block * esize), out = scratch.data();
      if (dim0 % n == 0) {
        st = libraryStatus(
            mtxcomm_reduce_scatter(op.entry.inputs[0], out, block, dtype, req.op, comm_, nullptr),
            what);
      } else {
        std::vector<char> send(block * esize * n, 0), recv(block * esize);
        size_t start = 0;
        for (int r = 0; r < n; ++r) {
          std::memcpy(send.data() + r * block * esize,
                      static_cast<const char*>(op.entry.inputs[0]) + start * rowElems * esize,
                      rowsOf(r) * rowElems * esize);
          start += rowsOf(r);
        }
        st = libraryStatus(
            mtxcomm_reduce_scatter(send.data(), recv.data(), block, dtype, req.op, comm_, nullptr),
            what);
        if (st.ok()) std::memcpy(out, recv.data(), rowsOf(me) * rowElems * esize);
      }
      break;
    }
    case Kind::kAllreduce:
      break;  // runAllreduces
  }
  collectives.fetch_add(1);
  if (!st.ok()) {
    failAll(st);
    return st;
  }
  if (!err.empty()) return {MTXCOMM_SYSTEM_ERROR, "mtxcomm " + what + ": " + err};
  return {};
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
  table_.clear();
  for (Entry& e : pending) {
    Status s = failure_;
    s.message = std::string(kindName(e.request.kind)) + " '" + e.request.name + "': " + s.message;
    e.done(s);
  }
}

void Engine::stallCheck() {
  if (stallSeconds_ <= 0) return;
  const auto now = Clock::now();
  for (auto& kv : table_) {
    NameQueue& q = kv.second;
    if (q.stallWarned) continue;
    std::vector<int> have, missing;
    Clock::time_point first = now;
    for (size_t r = 0; r < q.perRank.size(); ++r) {
      if (q.perRank[r].empty()) {
        missing.push_back(static_cast<int>(r));
      } else {
        have.push_back(static_cast<int>(r));
        first = std::min(first, q.perRank[r].front().arrived);
      }
    }
    if (missing.empty() || std::chrono::duration<double>(now - first).count() < stallSeconds_) {
      continue;
    }
    q.stallWarned = true;
    const Request& r = q.perRank[have[0]].front().request;
    warn(rank.load(), std::string(kindName(r.kind)) + " '" + kv.first + "' submitted by " +
                          rankList(have) + " has waited " + std::to_string(int(stallSeconds_)) +
                          " s for " + rankList(missing) +
                          " (a rank stopped early, or the ranks run different code?)");
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
uint64_t collectiveCount() { return engine().collectives.load(); }

}  // namespace mtxcomm::binding
