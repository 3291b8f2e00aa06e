// Point-to-point messages through a shared-memory segment of rings: see shm_p2p.h.
#include "transports/shm/shm_p2p.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "lib/base/spin.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_wait.h"

namespace mtxcomm {

struct alignas(128) ShmP2pTransport::Control {
  alignas(64) std::atomic<uint32_t> doorbell;  // futex word: bumped by every sender to this rank
  std::atomic<uint32_t> sleepers;              // threads asleep on it (0: no wake system call)
  alignas(64) std::atomic<int64_t> pid;
  std::atomic<int> aborted;  // reason is written before it
  std::atomic<int> left;     // this rank destroyed its communicator
  char reason[512];
};

struct ShmP2pTransport::Ring {
  alignas(64) std::atomic<uint64_t> head;  // bytes written (the sender's)
  alignas(64) std::atomic<uint64_t> tail;  // bytes read (the receiver's)
};

struct ShmP2pTransport::Req : Request {
  Req(ShmP2pTransport* owner, int peer, bool isSend, int tag, const void* src, void* dst,
      size_t bytes)
      : Request(peer, isSend, bytes), owner(owner), tag(tag), src(src), dst(dst) {}
  ~Req() override {
    if (owner && !complete) owner->forget(this);
  }
  ShmP2pTransport* owner;  // null once the transport is gone
  const int tag;
  const void* const src;
  void* const dst;
  size_t written = 0;  // a send's bytes in the ring so far
  bool complete = false;
};

namespace {

struct FrameHeader {
  int32_t tag;
  uint32_t bytes;  // this frame's data
  uint64_t total;  // the message's
};
static_assert(sizeof(FrameHeader) == 16, "frames are 16-byte aligned");
constexpr size_t kFrame = sizeof(FrameHeader);
constexpr size_t kBudget = 8u << 20;  // the rings of one segment, about
constexpr size_t kMaxRing = 1u << 20, kMinRing = 4u << 10;
constexpr double kScanSeconds = 0.05;  // liveness scans, at most this often
constexpr size_t kDeferBytes = 4096;   // pullFrames: larger unmatched messages wait one round

size_t pad16(size_t x) { return (x + 15) & ~size_t{15}; }

void copyIn(char* ring, size_t ringBytes, uint64_t at, const void* src, size_t n) {
  const size_t pos = static_cast<size_t>(at & (ringBytes - 1));
  const size_t first = std::min(n, ringBytes - pos);
  std::memcpy(ring + pos, src, first);
  std::memcpy(ring, static_cast<const char*>(src) + first, n - first);
}

void copyOut(const char* ring, size_t ringBytes, uint64_t at, void* dst, size_t n) {
  const size_t pos = static_cast<size_t>(at & (ringBytes - 1));
  const size_t first = std::min(n, ringBytes - pos);
  std::memcpy(dst, ring + pos, first);
  std::memcpy(static_cast<char*>(dst) + first, ring, n - first);
}

std::string describe(const Request& r, int tag) {
  return strCat(r.isSend() ? "send to" : "receive from", " peer rank ", r.peer(), " (tag ", tag,
                ", ", r.bytes(), " bytes)");
}

}  // namespace

size_t ShmP2pTransport::ringBytesFor(int n) {
  const size_t pairs = static_cast<size_t>(std::max(n, 1)) * static_cast<size_t>(std::max(n, 1));
  size_t ring = kMaxRing;
  while (ring > kMinRing && ring * pairs > kBudget) ring /= 2;
  return ring;
}

size_t ShmP2pTransport::segmentBytes(int n) {
  const size_t pairs = static_cast<size_t>(n) * static_cast<size_t>(n);
  return shm::roundUp(sizeof(Control) * n, 128) + sizeof(Ring) * pairs + ringBytesFor(n) * pairs;
}

std::unique_ptr<ShmP2pTransport> ShmP2pTransport::create(Transport& t, int tag,
                                                         double timeoutSeconds) {
  const int n = t.size();
  const size_t bytes = segmentBytes(n);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeoutSeconds));
  char* base = shm::shareSegment(t, tag, bytes, deadline);
  auto p = std::unique_ptr<ShmP2pTransport>(new ShmP2pTransport(base, bytes, t.rank(), n));
  p->control(t.rank()).pid.store(getpid(), std::memory_order_release);
  // Every pid is published before any rank looks at one (a zero pid is never scanned anyway).
  std::vector<char> one(1), all(static_cast<size_t>(n));
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < n; ++q) {
    if (q == t.rank()) continue;
    reqs.push_back(t.isend(q, tag, one.data(), 1));
    reqs.push_back(t.irecv(q, tag, &all[static_cast<size_t>(q)], 1));
  }
  t.waitAll(reqs, deadline);
  return p;
}

ShmP2pTransport::ShmP2pTransport(char* base, size_t bytes, int rank, int size)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      ringBytes_(ringBytesFor(size)),
      sends_(static_cast<size_t>(size)),
      incoming_(static_cast<size_t>(size)),
      deferredAt_(static_cast<size_t>(size), ~uint64_t{0}) {}

ShmP2pTransport::~ShmP2pTransport() {
  for (auto& q : sends_) {
    for (Req* r : q) r->owner = nullptr;
  }
  for (auto& kv : recvs_) {
    for (Req* r : kv.second) r->owner = nullptr;
  }
  for (auto& in : incoming_) {
    if (in.recv) in.recv->owner = nullptr;
  }
  control(rank_).left.store(1, std::memory_order_seq_cst);
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) ringDoorbell(q);
  }
  munmap(base_, bytes_);
}

ShmP2pTransport::Control& ShmP2pTransport::control(int r) const {
  return reinterpret_cast<Control*>(base_)[r];
}

ShmP2pTransport::Ring& ShmP2pTransport::ring(int from, int to) const {
  char* rings = base_ + shm::roundUp(sizeof(Control) * size_, 128);
  return reinterpret_cast<Ring*>(rings)[static_cast<size_t>(from) * size_ + to];
}

char* ShmP2pTransport::ringData(int from, int to) const {
  const size_t pairs = static_cast<size_t>(size_) * size_;
  char* data = base_ + shm::roundUp(sizeof(Control) * size_, 128) + sizeof(Ring) * pairs;
  return data + (static_cast<size_t>(from) * size_ + to) * ringBytes_;
}

void ShmP2pTransport::ringDoorbell(int r) {
  Control& c = control(r);
  c.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) > 0) shm::futexWake(&c.doorbell);
}

uint32_t ShmP2pTransport::activitySeen() const {
  return control(rank_).doorbell.load(std::memory_order_seq_cst);
}

void ShmP2pTransport::waitActivity(uint32_t seen, Clock::duration atMost) {
  Control& c = control(rank_);
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (c.doorbell.load(std::memory_order_seq_cst) == seen) shm::futexWait(&c.doorbell, seen, atMost);
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmP2pTransport::wake() { ringDoorbell(rank_); }

void ShmP2pTransport::forget(Req* r) {
  const auto drop = [r](std::deque<Req*>& q) {
    q.erase(std::remove(q.begin(), q.end(), r), q.end());
  };
  if (r->isSend()) {
    drop(sends_[static_cast<size_t>(r->peer())]);
    return;
  }
  auto it = recvs_.find({r->peer(), r->tag});
  if (it != recvs_.end()) drop(it->second);
  Incoming& in = incoming_[static_cast<size_t>(r->peer())];
  if (in.recv == r) {
    // Abandoned mid-message: the rest is read and dropped.
    in.recv = nullptr;
    in.discard = true;
  }
}

void ShmP2pTransport::failWith(mtxcomm_result_t code, const std::string& msg) {
  if (failure_.empty()) {
    failure_ = msg;
    failCode_ = code;
  }
  fail(code, msg);
}

RequestPtr ShmP2pTransport::isend(int peer, int tag, const void* buf, size_t bytes) {
  if (!failure_.empty()) fail(failCode_, failure_);
  auto r = std::make_unique<Req>(this, peer, true, tag, buf, nullptr, bytes);
  sends_[static_cast<size_t>(peer)].push_back(r.get());
  pushSends(peer);
  return r;
}

RequestPtr ShmP2pTransport::irecv(int peer, int tag, void* buf, size_t bytes) {
  if (!failure_.empty()) fail(failCode_, failure_);
  auto r = std::make_unique<Req>(this, peer, false, tag, nullptr, buf, bytes);
  const auto key = std::make_pair(peer, tag);
  auto held = unexpected_.find(key);
  if (held != unexpected_.end() && !held->second.empty()) {
    std::vector<char> data = std::move(held->second.front());
    held->second.pop_front();
    if (held->second.empty()) unexpected_.erase(held);
    deliver(*r, data);
    return r;
  }
  Incoming& in = incoming_[static_cast<size_t>(peer)];
  if (in.active && in.tag == tag && in.recv == nullptr && !in.discard) {
    in.recv = r.get();  // arriving already, into its own buffer: handed over when complete
  } else {
    recvs_[key].push_back(r.get());
  }
  return r;
}

void ShmP2pTransport::deliver(Req& r, std::vector<char>& data) {
  if (data.size() != r.bytes()) {
    failWith(MTXCOMM_INTERNAL_ERROR,
             strCat(describe(r, r.tag), ": the peer sent ", data.size(), " bytes (shared memory)"));
  }
  if (!data.empty()) std::memcpy(r.dst, data.data(), data.size());
  r.complete = true;
}

bool ShmP2pTransport::pushSends(int peer) {
  auto& q = sends_[static_cast<size_t>(peer)];
  if (q.empty()) return false;
  Ring& rg = ring(rank_, peer);
  char* data = ringData(rank_, peer);
  uint64_t head = rg.head.load(std::memory_order_relaxed);
  bool moved = false;
  while (!q.empty()) {
    Req& r = *q.front();
    const size_t free =
        ringBytes_ - static_cast<size_t>(head - rg.tail.load(std::memory_order_acquire));
    const size_t left = r.bytes() - r.written;
    if (free < kFrame + std::min<size_t>(left, 16)) break;
    size_t len = std::min(left, (free - kFrame) & ~size_t{15});
    // Wait for room rather than cut a message into slivers.
    if (len < left && len < std::min<size_t>(left, ringBytes_ / 4)) break;
    FrameHeader h{r.tag, static_cast<uint32_t>(len), r.bytes()};
    copyIn(data, ringBytes_, head, &h, kFrame);
    if (len)
      copyIn(data, ringBytes_, head + kFrame, static_cast<const char*>(r.src) + r.written, len);
    head += kFrame + pad16(len);
    r.written += len;
    moved = true;
    if (r.written < r.bytes()) break;
    r.complete = true;
    q.pop_front();
  }
  if (moved) {
    rg.head.store(head, std::memory_order_release);
    ringDoorbell(peer);
  }
  return moved;
}

bool ShmP2pTransport::pullFrames(int peer) {
  Ring& rg = ring(peer, rank_);
  const uint64_t head = rg.head.load(std::memory_order_acquire);
  const uint64_t start = rg.tail.load(std::memory_order_relaxed);
  uint64_t tail = start;
  if (tail == head) return false;
  const char* data = ringData(peer, rank_);
  Incoming& in = incoming_[static_cast<size_t>(peer)];
  while (tail != head) {
    FrameHeader h;
    copyOut(data, ringBytes_, tail, &h, kFrame);
    if (!in.active) {
      const auto it = recvs_.find({peer, h.tag});
      if ((it == recvs_.end() || it->second.empty()) && h.total > kDeferBytes &&
          deferredAt_[static_cast<size_t>(peer)] != tail) {
        // A large message no receive was posted for: left in the ring for one round, in which
        // its receive is usually posted (the user-message channel posts a payload's receive
        // once its header has arrived), so it is copied once, straight into it. Still
        // unmatched then, it is copied aside, so that it blocks nothing behind it.
        deferredAt_[static_cast<size_t>(peer)] = tail;
        break;
      }
      in = Incoming();
      in.active = true;
      in.tag = h.tag;
      in.total = h.total;
      if (it != recvs_.end() && !it->second.empty()) {
        in.recv = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) recvs_.erase(it);
        in.direct = true;
        if (in.recv->bytes() != h.total) {
          failWith(MTXCOMM_INTERNAL_ERROR, strCat(describe(*in.recv, h.tag), ": the peer sent ",
                                                  h.total, " bytes (shared memory)"));
        }
      } else {
        in.held.resize(h.total);
      }
    }
    if (h.bytes && !in.discard) {
      char* dst = in.direct ? static_cast<char*>(in.recv->dst) : in.held.data();
      copyOut(data, ringBytes_, tail + kFrame, dst + in.got, h.bytes);
    }
    in.got += h.bytes;
    tail += kFrame + pad16(h.bytes);
    if (in.got == in.total) {
      if (in.discard) {
        // its receive was abandoned
      } else if (in.direct) {
        in.recv->complete = true;
      } else if (in.recv) {
        deliver(*in.recv, in.held);
      } else {
        unexpected_[{peer, in.tag}].push_back(std::move(in.held));
      }
      in = Incoming();
    }
  }
  if (tail == start) return false;
  rg.tail.store(tail, std::memory_order_release);
  ringDoorbell(peer);  // room for its sends
  return true;
}

bool ShmP2pTransport::progress() {
  bool moved = false;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    if (pushSends(q)) moved = true;
    if (pullFrames(q)) moved = true;
  }
  return moved;
}

void ShmP2pTransport::checkPeers(const std::vector<RequestPtr>& reqs) {
  const auto now = Clock::now();
  const bool scan = now >= nextScan_;
  if (scan) {
    nextScan_ = now + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(kScanSeconds));
  }
  for (const RequestPtr& p : reqs) {
    if (!p) continue;
    const auto& r = static_cast<const Req&>(*p);
    if (r.complete) continue;
    Control& c = control(r.peer());
    std::string why;
    if (c.aborted.load(std::memory_order_acquire)) {
      why = strCat("aborted: ", std::string(c.reason, strnlen(c.reason, sizeof(c.reason))));
    } else if (c.left.load(std::memory_order_acquire)) {
      if (r.optional) continue;  // a peer that has left is no candidate of an any-source receive
      why = "destroyed its communicator";
    } else if (scan) {
      const long pid = static_cast<long>(c.pid.load(std::memory_order_acquire));
      if (pid > 0 && processGone(pid)) why = strCat("(pid ", pid, ", on this node) has exited");
    }
    if (why.empty()) continue;
    // What it wrote before it went is still delivered.
    if (!r.isSend()) pullFrames(r.peer());
    if (r.complete) continue;
    // A peer that died or aborted fails a receive from any source as well (as Gloo's does): no
    // message comes from it, and where no other peer sends, the receive would wait forever.
    failWith(MTXCOMM_REMOTE_ERROR, strCat("peer rank ", r.peer(), " ", why, " while this rank ",
                                          r.isSend()   ? "sent to it"
                                          : r.optional ? "waited to receive from any source"
                                                       : "waited to receive from it",
                                          " (tag ", r.tag, "; shared memory)"));
  }
}

bool ShmP2pTransport::testAll(std::vector<RequestPtr>& reqs) {
  if (!failure_.empty()) fail(failCode_, failure_);
  progress();
  bool allDone = true;
  for (RequestPtr& p : reqs) {
    if (!p) continue;
    if (static_cast<Req&>(*p).complete) {
      p.reset();
    } else {
      allDone = false;
    }
  }
  if (!allDone) checkPeers(reqs);
  return allDone;
}

void ShmP2pTransport::waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) {
  for (int spins = 0;; ++spins) {
    const uint32_t seen = activitySeen();
    if (testAll(reqs)) return;
    checkCancelled();
    const auto now = Clock::now();
    for (const RequestPtr& p : reqs) {
      if (!p) continue;
      if (now >= deadline) {
        failWith(MTXCOMM_TIMEOUT, strCat("timed out in a ", describe(*p, static_cast<Req&>(*p).tag),
                                         " (shared memory)"));
      }
      if (spins >= 64) noteWaitingOn(p->peer());
      break;
    }
    if (spins < 64) {
      cpuPause();
    } else {
      waitActivity(seen, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50)));
    }
  }
}

std::unique_ptr<Transport> ShmP2pTransport::split(const std::vector<int>&, uint64_t) {
  fail(MTXCOMM_UNSUPPORTED, "the shared-memory point-to-point transport is not split");
}

void ShmP2pTransport::abort(const std::string& reason) {
  Control& c = control(rank_);
  const size_t n = std::min(reason.size(), sizeof(c.reason) - 1);
  std::memcpy(c.reason, reason.data(), n);
  c.reason[n] = 0;
  c.aborted.store(1, std::memory_order_seq_cst);
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) ringDoorbell(q);
  }
}

}  // namespace mtxcomm
