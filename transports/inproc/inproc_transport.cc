#include "transports/inproc/inproc_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "lib/base/backoff.h"
#include "lib/base/error.h"

namespace mtxcomm {

namespace {

enum Status : int { kPending = 0, kDone = 1, kSizeMismatch = 2 };

struct Entry {
  uint64_t ctx;
  int src;  // global rank of the sender
  int tag;
  void* buf;
  size_t bytes;
  std::atomic<int>* status;
  size_t* otherBytes;  // where a size mismatch reports the other side's size
};

struct Mailbox {
  std::mutex mu;
  std::deque<Entry> sends;  // unmatched sends to this rank
  std::deque<Entry> recvs;  // unmatched receives posted by this rank
};

struct World {
  explicit World(int n) : boxes(n) {}
  std::vector<Mailbox> boxes;
  // Ranks that aborted, per communicator context: (context, global rank) -> reason.
  std::mutex deadMu;
  std::map<std::pair<uint64_t, int>, std::string> dead;
  std::atomic<int> deadCount{0};

  void markDead(uint64_t ctx, int global, const std::string& reason) {
    std::lock_guard<std::mutex> lock(deadMu);
    if (dead.emplace(std::make_pair(ctx, global), reason).second) deadCount.fetch_add(1);
  }
  // The reason rank global left context ctx, if it did.
  bool isDead(uint64_t ctx, int global, std::string* reason) {
    if (deadCount.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(deadMu);
    auto it = dead.find({ctx, global});
    if (it == dead.end()) return false;
    *reason = it->second;
    return true;
  }
};

class InprocRequest : public Request {
 public:
  InprocRequest(std::shared_ptr<World> world, int box, int peer, bool isSend, size_t bytes)
      : Request(peer, isSend, bytes), world_(std::move(world)), box_(box) {}
  ~InprocRequest() override {
    if (status_.load(std::memory_order_acquire) != kPending) return;
    // Abandoned (the wait failed): withdraw the entry so nobody touches its buffer later.
    Mailbox& mb = world_->boxes[box_];
    std::lock_guard<std::mutex> lock(mb.mu);
    auto& q = isSend() ? mb.sends : mb.recvs;
    q.erase(
        std::remove_if(q.begin(), q.end(), [&](const Entry& e) { return e.status == &status_; }),
        q.end());
  }
  std::atomic<int> status_{kPending};
  size_t otherBytes_ = 0;
  int tag_ = 0;

 private:
  std::shared_ptr<World> world_;
  int box_;
};

// Completes a matched pair under the mailbox lock.
void complete(Entry& send, Entry& recv) {
  if (send.bytes != recv.bytes) {
    *send.otherBytes = recv.bytes;
    *recv.otherBytes = send.bytes;
    send.status->store(kSizeMismatch, std::memory_order_release);
    recv.status->store(kSizeMismatch, std::memory_order_release);
    return;
  }
  if (send.bytes) std::memcpy(recv.buf, send.buf, send.bytes);
  send.status->store(kDone, std::memory_order_release);
  recv.status->store(kDone, std::memory_order_release);
}

class InprocTransport : public Transport {
 public:
  InprocTransport(std::shared_ptr<World> world, std::vector<int> globalOf, int rank, uint64_t ctx)
      : world_(std::move(world)), globalOf_(std::move(globalOf)), rank_(rank), ctx_(ctx) {}

  const char* name() const override { return "inproc"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(globalOf_.size()); }

  RequestPtr isend(int peer, int tag, const void* buf, size_t bytes) override {
    checkPeer(peer);
    const int dst = globalOf_[peer], me = globalOf_[rank_];
    auto req = std::make_unique<InprocRequest>(world_, dst, peer, true, bytes);
    req->tag_ = tag;
    Entry mine{ctx_, me, tag, const_cast<void*>(buf), bytes, &req->status_, &req->otherBytes_};
    Mailbox& mb = world_->boxes[dst];
    std::lock_guard<std::mutex> lock(mb.mu);
    for (auto it = mb.recvs.begin(); it != mb.recvs.end(); ++it) {
      if (it->ctx == ctx_ && it->src == me && it->tag == tag) {
        complete(mine, *it);
        mb.recvs.erase(it);
        return req;
      }
    }
    mb.sends.push_back(mine);
    return req;
  }

  RequestPtr irecv(int peer, int tag, void* buf, size_t bytes) override {
    checkPeer(peer);
    const int src = globalOf_[peer], me = globalOf_[rank_];
    auto req = std::make_unique<InprocRequest>(world_, me, peer, false, bytes);
    req->tag_ = tag;
    Entry mine{ctx_, src, tag, buf, bytes, &req->status_, &req->otherBytes_};
    Mailbox& mb = world_->boxes[me];
    std::lock_guard<std::mutex> lock(mb.mu);
    for (auto it = mb.sends.begin(); it != mb.sends.end(); ++it) {
      if (it->ctx == ctx_ && it->src == src && it->tag == tag) {
        complete(*it, mine);
        mb.sends.erase(it);
        return req;
      }
    }
    mb.recvs.push_back(mine);
    return req;
  }

  void waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) override {
    for (RequestPtr& r : reqs) {
      if (!r) continue;
      auto* req = static_cast<InprocRequest*>(r.get());
      Backoff backoff;
      int st;
      while ((st = req->status_.load(std::memory_order_acquire)) == kPending) {
        if (backoff.sleeping()) {
          checkCancelled();
          noteWaitingOn(req->peer());
          checkPeerAlive(*req);
          if (Clock::now() > deadline) {
            fail(MTXCOMM_TIMEOUT, "timed out waiting for a ", what(*req),
                 " (the peer never posted the matching operation)");
          }
        }
        backoff.pause();
      }
      if (st == kSizeMismatch) sizeMismatch(*req);
    }
  }

  bool testAll(std::vector<RequestPtr>& reqs) override {
    bool all = true;
    for (RequestPtr& r : reqs) {
      if (!r) continue;
      auto* req = static_cast<InprocRequest*>(r.get());
      const int st = req->status_.load(std::memory_order_acquire);
      if (st == kPending) {
        checkCancelled();
        checkPeerAlive(*req);
        all = false;
        continue;
      }
      if (st == kSizeMismatch) sizeMismatch(*req);
      r.reset();
    }
    return all;
  }

  std::unique_ptr<Transport> split(const std::vector<int>& members, uint64_t ctx) override {
    std::vector<int> globalOf;
    int newRank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      globalOf.push_back(globalOf_[members[i]]);
      if (members[i] == rank_) newRank = static_cast<int>(i);
    }
    if (newRank < 0) fail(MTXCOMM_INTERNAL_ERROR, "split: this rank is not among the members");
    return std::make_unique<InprocTransport>(world_, std::move(globalOf), newRank, ctx);
  }

  void abort(const std::string& reason) override {
    world_->markDead(ctx_, globalOf_[rank_], reason);
  }

 private:
  void checkPeer(int peer) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      fail(MTXCOMM_INTERNAL_ERROR, "inproc: invalid peer rank ", peer, " (size ", size(), ", rank ",
           rank_, ")");
    }
  }
  // Throws MTXCOMM_REMOTE_ERROR when the peer of a pending request has aborted.
  void checkPeerAlive(const InprocRequest& req) const {
    std::string reason;
    if (world_->isDead(ctx_, globalOf_[req.peer()], &reason)) {
      fail(MTXCOMM_REMOTE_ERROR, "peer rank ", req.peer(), " aborted while this rank waited",
           " for a ", what(req), " (peer's reason: ", reason, ")");
    }
  }
  [[noreturn]] static void sizeMismatch(const InprocRequest& req) {
    fail(MTXCOMM_INVALID_USAGE, "size mismatch on a ", what(req), ": peer posted ", req.otherBytes_,
         " bytes (the ranks disagree on the call: a different collective, count, datatype or "
         "root)");
  }
  static std::string what(const InprocRequest& r) {
    return strCat(r.isSend() ? "send to" : "receive from", " peer rank ", r.peer(), " (tag ",
                  r.tag_, ", ", r.bytes(), " bytes)");
  }

  std::shared_ptr<World> world_;
  std::vector<int> globalOf_;
  int rank_;
  uint64_t ctx_;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> makeInprocTransports(int n) {
  auto world = std::make_shared<World>(n);
  std::vector<int> identity(n);
  for (int i = 0; i < n; ++i) identity[i] = i;
  std::vector<std::unique_ptr<Transport>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<InprocTransport>(world, identity, i, 0));
  }
  return out;
}

}  // namespace mtxcomm
