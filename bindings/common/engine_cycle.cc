// One cycle of the engine (engine.h, engine_internal.h): this rank's new requests exchanged with
// every rank's (one allgather of fixed-size slots, a second for new requests that do not fit),
// the operations every rank has submitted run in the agreed order (allreduces of one op fused),
// stall verdicts and warnings, and the failure that stops the engine.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/common/engine_internal.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"

namespace mtxcomm::binding {

namespace {

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

}  // namespace

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

}  // namespace mtxcomm::binding
