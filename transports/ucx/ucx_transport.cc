// The UCX transport's views, requests and progress (ucx_transport.h); opening UCX and the
// worker: ucx_worker.cc.
#include "transports/ucx/ucx_transport.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "lib/base/backoff.h"
#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "transports/ucx/ucx_api.h"
#include "transports/ucx/ucx_worker.h"

namespace mtxcomm {

namespace {

constexpr size_t kMaxChunk = size_t{1} << 30;
constexpr uint64_t kCtxMask = 0xFFFFFFull;  // 24 bits
constexpr uint64_t kCtrlCtx = 0xFFFFFFull;  // context of control frames
constexpr uint64_t kAbortTag = 0xFFFF;
constexpr size_t kMaxReason = 4096;
constexpr int kMaxPollMs = 100;
// A progress call costs microseconds (it polls every UCX transport), far more than a pause
// instruction: spin only briefly, then yield (another rank may need this core), then sleep on
// the worker's event fd.
constexpr int kSpinPolls = 64;
constexpr int kYieldPolls = 64;

uint64_t makeTag(uint64_t ctx24, int src, uint64_t tag) {
  return ctx24 << 40 | (static_cast<uint64_t>(src) & 0xFFFFFF) << 16 | (tag & 0xFFFF);
}
int tagSource(uint64_t t) { return static_cast<int>((t >> 16) & 0xFFFFFF); }
constexpr uint64_t kFullMask = ~uint64_t{0};
constexpr uint64_t kCtrlMask = kCtxMask << 40 | 0xFFFF;

// The 24-bit tag context of a view: 0 for the root transport, otherwise a hash that is never
// the control context.
uint64_t contextBits(uint64_t ctx) {
  if (ctx == 0) return 0;
  uint64_t h = ctx * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  return h % (kCtrlCtx - 1) + 1;
}

// One UCX operation: a whole message, or one piece of at most kMaxChunk of a larger one.
struct UcxOp {
  void* req = nullptr;  // UCX request while in flight
  bool done = false;
  ucs_status_t status = UCS_OK;
  ucp_tag_recv_info_t info{};
  size_t bytes = 0;
};

class UcxShared;

class UcxRequest : public Request {
 public:
  UcxRequest(std::shared_ptr<UcxShared> shared, int peer, int gpeer, bool isSend, size_t bytes,
             int tag)
      : Request(peer, isSend, bytes), shared(std::move(shared)), gpeer(gpeer), tag(tag) {}
  ~UcxRequest() override;
  std::shared_ptr<UcxShared> shared;
  int gpeer;
  int tag;
  std::vector<UcxOp> ops;  // reserved before posting: ops' addresses stay put
};

struct EpArg {
  UcxShared* shared;
  int gpeer;
};

// Per process: the worker, one endpoint per peer, the failure state. Guarded by mu.
class UcxShared {
 public:
  UcxShared(std::shared_ptr<UcxWorker> w, int rank, int size, PeerLiveness live)
      : lost_(size), live_(std::move(live)), w_(std::move(w)), rank_(rank), eps_(size, nullptr) {}

  ~UcxShared() {
    std::lock_guard<std::mutex> lk(mu);
    closeEndpoints({}, !failed_.empty() || !aborts_.empty());
  }

  void connect(const std::vector<std::string>& addresses, const std::vector<bool>& sameNode) {
    std::lock_guard<std::mutex> lk(mu);
    for (int p = 0; p < static_cast<int>(eps_.size()); ++p) {
      if (p == rank_) continue;
      args_.push_back(std::make_unique<EpArg>(EpArg{this, p}));
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(addresses[p].data());
      // UCX's shared-memory transports cannot report a failed peer, so asking for peer error
      // handling would push node-local traffic onto loopback TCP: node-local endpoints go
      // without it (a dead node-local peer is noticed by PeerLiveness instead).
      ep.err_mode = sameNode[p] ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxShared::onEndpointError;
      ep.err_handler.arg = args_.back().get();
      ucs_status_t s = ucx().ucp_ep_create(w_->worker, &ep, &eps_[p]);
      if (s != UCS_OK) {
        eps_[p] = nullptr;
        closeEndpoints({}, true);
        fail(MTXCOMM_SYSTEM_ERROR, "ucx transport: cannot create an endpoint to peer rank ", p,
             ": ", ucxStatusText(s));
      }
    }
  }

  static void onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* a = static_cast<EpArg*>(arg);
    if (a->shared->lost_[a->gpeer].empty()) a->shared->lost_[a->gpeer] = ucxStatusText(status);
  }

  bool claimContext(uint64_t bits) { return contexts_.insert(bits).second; }
  void releaseContext(uint64_t bits) { contexts_.erase(bits); }

  // Posts one message (several pieces above kMaxChunk). Called with mu held.
  void post(UcxRequest& r, uint64_t ctxBits, void* buf, size_t bytes) {
    const size_t pieces = bytes == 0 ? 1 : (bytes + kMaxChunk - 1) / kMaxChunk;
    r.ops.resize(pieces);
    const uint64_t tag = makeTag(ctxBits, r.isSend() ? rank_ : r.gpeer, r.tag);
    for (size_t i = 0; i < pieces; ++i) {
      UcxOp& op = r.ops[i];
      op.bytes = std::min(kMaxChunk, bytes - i * kMaxChunk);
      char* p = static_cast<char*>(buf) + i * kMaxChunk;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
      prm.datatype = ucp_dt_make_contig(1);
      ucs_status_ptr_t sp;
      if (r.isSend()) {
        ucp_ep_h ep = eps_[r.gpeer];
        if (!ep) {
          op.done = true;
          op.status = UCS_ERR_CONNECTION_RESET;
          continue;
        }
        sp = ucx().ucp_tag_send_nbx(ep, p, op.bytes, tag, &prm);
      } else {
        // Always a request, so that ucp_tag_recv_request_test reports the received length.
        prm.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        sp = ucx().ucp_tag_recv_nbx(w_->worker, p, op.bytes, tag, kFullMask, &prm);
      }
      if (sp == nullptr) {
        op.done = true;
      } else if (UCS_PTR_IS_ERR(sp)) {
        op.done = true;
        op.status = UCS_PTR_STATUS(sp);
      } else {
        op.req = sp;
      }
    }
  }

  // Progresses until every request in reqs has completed or until passes; cancels those still
  // in flight and frees all. Called with mu held.
  void finish(const std::vector<void*>& reqs, Clock::time_point until) {
    for (void* q : reqs) {
      while (ucx().ucp_request_check_status(q) == UCS_INPROGRESS && Clock::now() < until) {
        ucx().ucp_worker_progress(w_->worker);
      }
      if (ucx().ucp_request_check_status(q) == UCS_INPROGRESS) {
        ucx().ucp_request_cancel(w_->worker, q);
      }
      ucx().ucp_request_free(q);
    }
  }

  // Updates an op; true when it is complete. Called with mu held.
  bool test(UcxRequest& r, UcxOp& op) {
    if (op.done) return true;
    ucs_status_t s = r.isSend() ? ucx().ucp_request_check_status(op.req)
                                : ucx().ucp_tag_recv_request_test(op.req, &op.info);
    if (s == UCS_INPROGRESS) return false;
    ucx().ucp_request_free(op.req);
    op.req = nullptr;
    op.done = true;
    op.status = s;
    return true;
  }

  // A request given up on (its waitAll threw): receives are cancelled, and a send still in
  // flight force-closes the endpoint of its peer, which completes it, so no buffer is touched
  // after this returns. Called without mu held.
  void release(UcxRequest& r) {
    std::lock_guard<std::mutex> lk(mu);
    bool pendingSend = false;
    for (UcxOp& op : r.ops) {
      if (!op.req) continue;
      if (test(r, op)) continue;
      if (r.isSend()) {
        pendingSend = true;
      } else {
        ucx().ucp_request_cancel(w_->worker, op.req);
      }
    }
    if (pendingSend) closeEndpoints({r.gpeer}, true);
    // A cancelled receive completes at the next progress; wait for that, briefly.
    std::vector<void*> left;
    for (UcxOp& op : r.ops) {
      if (op.req) left.push_back(op.req);
      op.req = nullptr;
    }
    finish(left, Clock::now() + std::chrono::milliseconds(200));
  }

  // Receives pending ABORT frames. Called with mu held.
  void receiveAborts() {
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg =
          ucx().ucp_tag_probe_nb(w_->worker, makeTag(kCtrlCtx, 0, kAbortTag), kCtrlMask, 1, &info);
      if (!msg) return;
      std::string reason(std::min(info.length, kMaxReason), '\0');
      std::vector<char> buf(info.length ? info.length : 1);
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
      prm.datatype = ucp_dt_make_contig(1);
      ucs_status_ptr_t sp =
          ucx().ucp_tag_msg_recv_nbx(w_->worker, buf.data(), info.length, msg, &prm);
      if (UCS_PTR_IS_PTR(sp)) finish({sp}, Clock::now() + std::chrono::milliseconds(200));
      reason.assign(buf.data(), std::min(info.length, kMaxReason));
      aborts_.emplace(tagSource(info.sender_tag), reason);
    }
  }

  // Sends every peer an ABORT frame, progressing at most 200 ms. Called without mu held.
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lk(mu);
    if (abortSent_) return;
    abortSent_ = true;
    if (failed_.empty()) failed_ = "this rank aborted: " + reason;
    abortReason_ = reason.substr(0, kMaxReason);
    std::vector<void*> reqs;
    for (int p = 0; p < static_cast<int>(eps_.size()); ++p) {
      if (!eps_[p] || !lost_[p].empty()) continue;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
      prm.datatype = ucp_dt_make_contig(1);
      ucs_status_ptr_t sp =
          ucx().ucp_tag_send_nbx(eps_[p], abortReason_.data(), abortReason_.size(),
                                 makeTag(kCtrlCtx, rank_, kAbortTag), &prm);
      if (UCS_PTR_IS_PTR(sp)) reqs.push_back(sp);
    }
    // Frames that have not left within 200 ms stay queued until the endpoints close.
    finish(reqs, Clock::now() + std::chrono::milliseconds(200));
  }

  // Waits until the worker has news or ms pass. Releases mu while asleep.
  void sleep(std::unique_lock<std::mutex>& lk, int ms) {
    if (w_->efd < 0) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(ms, 1) * 200));
      lk.lock();
      return;
    }
    ucs_status_t s = ucx().ucp_worker_arm(w_->worker);
    if (s == UCS_ERR_BUSY) return;  // events pending: progress again
    sleeping = true;
    lk.unlock();
    pollfd pfd{w_->efd, POLLIN, 0};
    ::poll(&pfd, 1, ms);
    lk.lock();
    sleeping = false;
  }

  // A thread sleeps on the armed worker (sleep()): testAll then leaves progress to it, since
  // progress here could take the events that are to wake it (it would sleep its full time).
  bool sleeping = false;

  ucp_worker_h worker() const { return w_->worker; }
  const UcxApi& ucx() const { return *w_->api; }
  int rank() const { return rank_; }

  std::mutex mu;
  std::string failed_;                 // the first error on this rank ("" = healthy)
  std::map<int, std::string> aborts_;  // global rank -> reason of its ABORT frame
  std::vector<std::string> lost_;      // per global rank: why its endpoint failed ("" = fine)
  PeerLiveness live_;

 private:
  // Closes the endpoints of peers (every peer when empty): flushed (up to 1 s), or at once
  // (force, or a peer whose endpoint has failed). All closes are posted first, so a flush to one
  // peer does not wait for another's.
  void closeEndpoints(const std::vector<int>& peers, bool force) {
    std::vector<void*> reqs;
    for (int p = 0; p < static_cast<int>(eps_.size()); ++p) {
      if (!eps_[p] || (!peers.empty() && std::find(peers.begin(), peers.end(), p) == peers.end())) {
        continue;
      }
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = force || !lost_[p].empty() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      ucs_status_ptr_t sp = ucx().ucp_ep_close_nbx(eps_[p], &prm);
      eps_[p] = nullptr;
      if (UCS_PTR_IS_PTR(sp)) reqs.push_back(sp);
    }
    finish(reqs, Clock::now() + std::chrono::milliseconds(force ? 200 : 1000));
  }

  std::shared_ptr<UcxWorker> w_;
  int rank_;
  std::vector<ucp_ep_h> eps_;  // by global rank; null for this rank and closed endpoints
  std::vector<std::unique_ptr<EpArg>> args_;
  std::set<uint64_t> contexts_;
  bool abortSent_ = false;
  std::string abortReason_;  // the ABORT payload (lives while the frames are in flight)
};

UcxRequest::~UcxRequest() {
  for (const UcxOp& op : ops) {
    if (op.req) {
      shared->release(*this);
      break;
    }
  }
}

class UcxTransport : public Transport {
 public:
  UcxTransport(std::shared_ptr<UcxShared> shared, std::vector<int> members, int rank,
               uint64_t ctxBits, std::unique_ptr<Transport> keepAlive)
      : shared_(std::move(shared)),
        members_(std::move(members)),
        rank_(rank),
        ctxBits_(ctxBits),
        keepAlive_(std::move(keepAlive)) {}
  ~UcxTransport() override {
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->releaseContext(ctxBits_);
  }

  const char* name() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  RequestPtr isend(int peer, int tag, const void* buf, size_t bytes) override {
    return post(true, peer, tag, const_cast<void*>(buf), bytes);
  }
  RequestPtr irecv(int peer, int tag, void* buf, size_t bytes) override {
    return post(false, peer, tag, buf, bytes);
  }

  void waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) override {
    UcxShared& s = *shared_;
    std::unique_lock<std::mutex> lk(s.mu);
    checkHealthy();
    const std::vector<UcxRequest*> mine = ownRequests(reqs, "waitAll");
    int polls = 0;
    for (;;) {
      while (s.ucx().ucp_worker_progress(s.worker()) != 0) {
      }
      UcxRequest* pending = nullptr;
      for (UcxRequest* r : mine) {
        for (UcxOp& op : r->ops) {
          if (!s.test(*r, op)) {
            if (!pending) pending = r;
            continue;
          }
          checkOp(*r, op);
        }
      }
      if (!pending) return;
      checkCancelled();
      s.receiveAborts();
      checkPeers(mine);
      if (Clock::now() >= deadline) {
        failWith(MTXCOMM_TIMEOUT, strCat("timed out waiting to ", describe(*pending)));
      }
      if (++polls < kSpinPolls) continue;
      noteWaitingOn(pending->peer());
      if (polls < kSpinPolls + kYieldPolls) {
        lk.unlock();
        sched_yield();
        lk.lock();
        continue;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      s.sleep(lk, static_cast<int>(std::clamp<long>(left.count(), 1, kMaxPollMs)));
    }
  }

  bool testAll(std::vector<RequestPtr>& reqs) override {
    UcxShared& s = *shared_;
    std::unique_lock<std::mutex> lk(s.mu);
    checkHealthy();
    const std::vector<UcxRequest*> mine = ownRequests(reqs, "testAll");
    while (!s.sleeping && s.ucx().ucp_worker_progress(s.worker()) != 0) {
    }
    std::vector<bool> done(mine.size(), true);
    bool all = true;
    for (size_t i = 0; i < mine.size(); ++i) {
      for (UcxOp& op : mine[i]->ops) {
        if (!s.test(*mine[i], op)) {
          done[i] = false;
          continue;
        }
        checkOp(*mine[i], op);
      }
      all = all && done[i];
    }
    if (!all) {
      checkCancelled();
      s.receiveAborts();
      checkPeers(mine);
    }
    lk.unlock();  // a request's destructor takes the lock
    size_t i = 0;
    for (RequestPtr& r : reqs) {
      if (!r) continue;
      if (done[i++]) r.reset();
    }
    return all;
  }

  std::unique_ptr<Transport> split(const std::vector<int>& members, uint64_t contextId) override {
    std::vector<int> global;
    int me = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] < 0 || members[i] >= size()) {
        fail(MTXCOMM_INVALID_ARGUMENT, "ucx transport: split member ", members[i], " out of range");
      }
      global.push_back(members_[members[i]]);
      if (members[i] == rank_) me = static_cast<int>(i);
    }
    if (me < 0) fail(MTXCOMM_INVALID_ARGUMENT, "ucx transport: split without this rank");
    const uint64_t bits = contextBits(contextId);
    std::lock_guard<std::mutex> lk(shared_->mu);
    if (!shared_->claimContext(bits)) {
      fail(MTXCOMM_INTERNAL_ERROR, "ucx transport: context id ", contextId,
           " is already used by a live communicator on this rank");
    }
    return std::make_unique<UcxTransport>(shared_, std::move(global), me, bits, nullptr);
  }

  void abort(const std::string& reason) override { shared_->abort(reason); }

 private:
  RequestPtr post(bool isSend, int peer, int tag, void* buf, size_t bytes) {
    if (peer < 0 || peer >= size() || peer == rank_) {
      fail(MTXCOMM_INVALID_ARGUMENT, "ucx transport: bad peer ", peer);
    }
    if (tag < 0 || tag > kMaxTag) fail(MTXCOMM_INVALID_ARGUMENT, "ucx transport: bad tag ", tag);
    std::lock_guard<std::mutex> lk(shared_->mu);
    checkHealthy();
    auto r = std::make_unique<UcxRequest>(shared_, peer, members_[peer], isSend, bytes, tag);
    shared_->post(*r, ctxBits_, buf, bytes);
    return r;
  }

  // The requests of reqs (null entries skipped), each checked to be a UCX one.
  static std::vector<UcxRequest*> ownRequests(std::vector<RequestPtr>& reqs, const char* entry) {
    std::vector<UcxRequest*> mine;
    for (RequestPtr& r : reqs) {
      if (!r) continue;
      auto* u = dynamic_cast<UcxRequest*>(r.get());
      if (!u) {
        fail(MTXCOMM_INVALID_USAGE, "ucx transport: ", entry,
             " given a request of another transport");
      }
      mine.push_back(u);
    }
    return mine;
  }

  void checkHealthy() const {
    if (!shared_->failed_.empty()) {
      fail(MTXCOMM_INVALID_USAGE, "ucx transport failed earlier: ", shared_->failed_);
    }
  }

  // " (rank G of the initial communicator)" in a view of a split, where view ranks differ from
  // the ranks of the communicator UCX was set up for (the one a user sees from init).
  std::string rootName(int gpeer) const {
    return ctxBits_ == 0 ? std::string()
                         : strCat(" (rank ", gpeer, " of the initial communicator)");
  }

  // The peer's rank in this view, or its root rank when it is not a member.
  std::string peerName(int gpeer) const {
    auto it = std::find(members_.begin(), members_.end(), gpeer);
    if (it != members_.end()) return strCat("peer rank ", it - members_.begin(), rootName(gpeer));
    return strCat("rank ", gpeer, " of the initial communicator");
  }

  std::string describe(const UcxRequest& r) const {
    return strCat(r.isSend() ? "send " : "receive ", r.bytes(), " bytes ",
                  r.isSend() ? "to " : "from ", "peer rank ", r.peer(), rootName(r.gpeer), " (tag ",
                  r.tag, ") over ucx");
  }

  [[noreturn]] void failWith(mtxcomm_result_t code, const std::string& msg) {
    if (shared_->failed_.empty()) shared_->failed_ = msg;
    throw Error(code, msg);
  }

  void checkOp(const UcxRequest& r, const UcxOp& op) {
    if (op.status == UCS_OK && (r.isSend() || op.info.length == op.bytes)) return;
    if (op.status == UCS_ERR_MESSAGE_TRUNCATED || op.status == UCS_OK) {
      failWith(MTXCOMM_INTERNAL_ERROR,
               strCat("size mismatch: ", describe(r), " matched a message of ",
                      op.status == UCS_OK ? strCat(op.info.length, " bytes") : "more bytes",
                      " (the ranks disagree on the schedule)"));
    }
    const std::string& lost = shared_->lost_[r.gpeer];
    failWith(MTXCOMM_REMOTE_ERROR,
             strCat("cannot ", describe(r), ": ", ucxStatusText(op.status),
                    lost.empty() ? "" : " (connection to the peer lost: " + lost + ")"));
  }

  // A peer that aborted, whose endpoint failed, or (on this node) whose process is gone.
  void checkPeers(const std::vector<UcxRequest*>& mine) {
    UcxShared& s = *shared_;
    for (const auto& [g, reason] : s.aborts_) {
      if (std::find(members_.begin(), members_.end(), g) == members_.end()) continue;
      failWith(MTXCOMM_REMOTE_ERROR, strCat(peerName(g), " aborted: ", reason));
    }
    for (UcxRequest* r : mine) {
      bool done = true;
      for (const UcxOp& op : r->ops) done = done && op.done;
      if (!done && !s.lost_[r->gpeer].empty()) {
        failWith(MTXCOMM_REMOTE_ERROR,
                 strCat("cannot ", describe(*r), ": connection to the peer lost (",
                        s.lost_[r->gpeer], ")"));
      }
    }
    const int dead = s.live_.findDeadPeer();
    if (dead >= 0 && std::find(members_.begin(), members_.end(), dead) != members_.end()) {
      failWith(MTXCOMM_REMOTE_ERROR,
               strCat(peerName(dead), " (on this node) has exited without finishing"));
    }
  }

  std::shared_ptr<UcxShared> shared_;
  std::vector<int> members_;  // global rank of each rank of this view
  int rank_;
  uint64_t ctxBits_;
  std::unique_ptr<Transport> keepAlive_;
};

}  // namespace

std::unique_ptr<Transport> makeUcxTransport(std::shared_ptr<UcxWorker> worker, int rank,
                                            const std::vector<std::string>& addresses,
                                            const std::vector<std::string>& liveIds,
                                            const std::vector<bool>& sameNode,
                                            std::unique_ptr<Transport> keepAlive) {
  const int n = static_cast<int>(addresses.size());
  auto shared =
      std::make_shared<UcxShared>(std::move(worker), rank, n, PeerLiveness(liveIds, rank));
  shared->connect(addresses, sameNode);
  std::vector<int> members(n);
  for (int r = 0; r < n; ++r) members[r] = r;
  {
    std::lock_guard<std::mutex> lk(shared->mu);
    shared->claimContext(0);
  }
  return std::make_unique<UcxTransport>(shared, std::move(members), rank, 0, std::move(keepAlive));
}

}  // namespace mtxcomm
