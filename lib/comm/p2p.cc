// The communicator's point-to-point channel (p2p.h): the queue, the progress thread, the
// header protocol and the waits.
#include "lib/comm/p2p.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <new>
#include <system_error>

#include "lib/base/error.h"
#include "lib/base/spin.h"

namespace mtxcomm {

// What the user threads and the progress thread share, under mu. Operations hold it too, so a
// wait outlives neither the channel's lock nor its failure state.
class P2pHub {
 public:
  std::mutex mu;
  std::condition_variable work;  // the progress thread sleeps on it: a post, a failure
  std::condition_variable done;  // waiters sleep on it: a completion
  std::deque<P2pOpPtr> queue;    // posted, not taken by the thread yet
  uint64_t posted = 0;           // operations ever posted (the thread's wake-up condition)
  // The channel, while waiting callers may progress it (progressOnCaller); null once it stops.
  P2p* owner = nullptr;
  int progressing = 0;                               // callers inside owner->tryProgress()
  std::chrono::steady_clock::duration callerSpin{};  // how long a waiting caller progresses
  std::condition_variable quiet;  // stop() waits on it for progressing to reach 0
  bool started = false;           // the thread runs (or ran); false: failChannel() aborts the view
  bool failed = false;
  mtxcomm_result_t code = MTXCOMM_SUCCESS;
  std::string reason;     // the first failure
  bool finished = false;  // the thread has ended: failChannel() aborts the view where asked
  bool tellPeers = false;
  bool viewAborted = false;

  // Under mu.
  void failLocked(mtxcomm_result_t c, const std::string& r, bool tell) {
    if (!failed) {
      failed = true;
      code = c;
      reason = r;
    }
    tellPeers = tellPeers || tell;
    work.notify_all();
  }
};

namespace {

constexpr uint64_t kHeaderMagic = 0x7032706d74786d31ull;  // "1mxtmp2p": catches a framing slip
// How long a waiting caller progresses the channel itself before it sleeps: long enough for a
// peer's reply through a framework's call (tens of microseconds), short enough that a rank
// waiting for a late peer gives its core back soon.
constexpr auto kCallerSpin = std::chrono::microseconds(100);
// With more ranks than cores a waiting caller's spin takes the core a peer needs: this much.
constexpr auto kOversubscribedCallerSpin = std::chrono::microseconds(5);
// The progress thread's longest sleep with operations in flight: on a view with a doorbell
// (ActivityWaiter) an arrival ends it at once; on one without (MPI, whose rendezvous moves only
// when a rank polls it) it bounds each handshake step of a large message, at the cost of 10^4
// wake-ups a second while an operation waits.
constexpr int kLongestSleepUs = 1000;
constexpr int kLongestSleepUsWithoutDoorbell = 100;

std::chrono::steady_clock::duration secondsToDuration(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(s, 31536000.0)));
}

}  // namespace

std::string describeP2pOp(const P2pOp& op) {
  if (op.peer == P2pOp::kAnySource) {
    return strCat("receive from any peer rank (tag ", op.tag, ", ", op.bytes, " bytes)");
  }
  return strCat(op.isSend ? "send to" : "receive from", " peer rank ", op.peer, " (tag ", op.tag,
                ", ", op.bytes, " bytes)");
}

bool progressOnCaller(P2pHub& hub) {
  P2p* channel;
  {
    std::lock_guard<std::mutex> lock(hub.mu);
    if (!hub.owner || hub.failed) return false;
    channel = hub.owner;
    ++hub.progressing;
  }
  bool moved = false;
  try {
    moved = channel->tryProgress();
  } catch (...) {
    // tryProgress fails the channel itself; nothing else to do here
  }
  std::lock_guard<std::mutex> lock(hub.mu);
  if (--hub.progressing == 0) hub.quiet.notify_all();
  return moved;
}

mtxcomm_result_t waitP2pOp(P2pOp& op, double timeoutSeconds, std::string* message) {
  // First the caller progresses the channel itself (no hand-over to the progress thread and
  // back: a round trip between two waiting ranks costs two cross-core transfers), for
  // kCallerSpin (kOversubscribedCallerSpin with more ranks than cores); then it sleeps, and
  // the progress thread completes op.
  const auto spinEnd = std::chrono::steady_clock::now() + op.hub->callerSpin;
  for (int k = 0; !op.done.load(std::memory_order_acquire); ++k) {
    if (!progressOnCaller(*op.hub)) cpuPause();
    if ((k & 15) == 15 && std::chrono::steady_clock::now() >= spinEnd) break;
  }
  if (!op.done.load(std::memory_order_acquire)) {
    P2pHub& hub = *op.hub;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + secondsToDuration(timeoutSeconds);
    std::unique_lock<std::mutex> lock(hub.mu);
    bool timedOut = false;
    while (!op.done.load(std::memory_order_acquire)) {
      const auto now = std::chrono::steady_clock::now();
      if (!timedOut && now >= deadline) {
        // The channel fails; the progress thread completes op (and every other) with it.
        hub.failLocked(
            MTXCOMM_TIMEOUT,
            strCat("timed out after ", timeoutSeconds, " s waiting for the ", describeP2pOp(op),
                   " (MTXCOMM_TIMEOUT, or the timeout of mtxcomm_wait); point-to-point "
                   "on this communicator is failed from now on"),
            /*tell=*/false);
        timedOut = true;
      }
      const auto until = timedOut ? now + std::chrono::milliseconds(50) : deadline;
      hub.done.wait_until(lock, until);
    }
  }
  if (message) *message = op.message;
  return op.code;
}

P2p::P2p(std::unique_ptr<Transport> view, int rank)
    : view_(std::move(view)),
      waiter_(dynamic_cast<ActivityWaiter*>(view_.get())),
      rank_(rank),
      hub_(std::make_shared<P2pHub>()) {
  hub_->owner = this;
  const unsigned cores = std::thread::hardware_concurrency();
  const bool oversubscribed = cores > 0 && static_cast<unsigned>(view_->size()) > cores;
  hub_->callerSpin = oversubscribed ? std::chrono::steady_clock::duration(kOversubscribedCallerSpin)
                                    : std::chrono::steady_clock::duration(kCallerSpin);
}

P2p::~P2p() {
  stop(MTXCOMM_INVALID_USAGE, "the communicator was destroyed on this rank", /*tellPeers=*/false);
}

P2pOpPtr P2p::post(bool isSend, int peer, int tag, void* buf, size_t bytes) {
  auto op = std::make_shared<P2pOp>(hub_, isSend, peer, tag, buf, bytes);
  std::unique_lock<std::mutex> lock(hub_->mu);
  if (hub_->failed) {
    mtxcomm::fail(MTXCOMM_INVALID_USAGE,
                  "point-to-point on this communicator failed earlier: ", hub_->reason);
  }
  if (!hub_->started) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      mtxcomm::fail(MTXCOMM_SYSTEM_ERROR,
                    "cannot start the point-to-point progress thread: ", e.what());
    }
    hub_->started = true;
  }
  hub_->queue.push_back(op);
  ++hub_->posted;
  lock.unlock();
  // Started on the caller where the channel is free: a send that fits the view's buffers
  // (the shared-memory rings) then completes here, and the thread is not woken for it.
  tryProgress();
  if (!op->done.load(std::memory_order_acquire)) {
    hub_->work.notify_one();
    if (waiter_) waiter_->wake();  // the thread may sleep on the view's activity instead
  }
  return op;
}

bool P2p::tryProgress() {
  std::unique_lock<std::mutex> progress(progressMu_, std::try_to_lock);
  if (!progress.owns_lock()) return false;
  return round();
}

bool P2p::round() {
  std::deque<P2pOpPtr> fresh;
  std::unique_lock<std::mutex> lock(hub_->mu);
  if (hub_->failed) return false;
  fresh.swap(hub_->queue);
  lock.unlock();
  bool moved = !fresh.empty();
  try {
    for (const P2pOpPtr& op : fresh) start(op);
    fresh.clear();
    if (!reqs_.empty() && poll()) moved = true;
  } catch (const Error& e) {
    lock.lock();
    // Operations taken but not started yet are failed with the others.
    for (auto& op : fresh) hub_->queue.push_front(std::move(op));
    hub_->failLocked(e.code(), e.what(), /*tell=*/false);
    moved = true;
  } catch (const std::bad_alloc&) {
    lock.lock();
    for (auto& op : fresh) hub_->queue.push_front(std::move(op));
    hub_->failLocked(MTXCOMM_SYSTEM_ERROR, "out of memory", /*tell=*/false);
    moved = true;
  }
  if (moved && waiter_ && hub_->failed) waiter_->wake();
  return moved;
}

void P2p::failChannel(mtxcomm_result_t code, const std::string& reason, bool tellPeers) {
  bool abortHere = false;
  {
    std::lock_guard<std::mutex> lock(hub_->mu);
    hub_->failLocked(code, reason, tellPeers);
    if (waiter_ && !hub_->finished) waiter_->wake();
    if (!hub_->started || hub_->finished) {
      // No thread uses the view, and none will start (the channel has failed).
      hub_->started = true;
      abortHere = true;
    }
  }
  if (abortHere) abortViewOnce();
}

void P2p::stop(mtxcomm_result_t code, const std::string& reason, bool tellPeers) {
  failChannel(code, reason, tellPeers);
  {
    // No caller progresses the channel from now on (it may be destroyed after this).
    std::unique_lock<std::mutex> lock(hub_->mu);
    hub_->owner = nullptr;
    hub_->quiet.wait(lock, [&] { return hub_->progressing == 0; });
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void P2p::abortViewOnce() {
  {
    std::lock_guard<std::mutex> lock(hub_->mu);
    if (!hub_->tellPeers || hub_->viewAborted) return;
    hub_->viewAborted = true;
  }
  try {
    view_->abort(strCat("rank ", rank_, ": ", hub_->reason));
  } catch (...) {
    // Best effort: the peers then fail at their timeout.
  }
}

void P2p::run() {
  int idle = 0;  // rounds in a row in which nothing moved
  for (;;) {
    // Read before the round: an arrival after it makes waitActivity below return at once.
    const uint32_t seen = waiter_ ? waiter_->activitySeen() : 0;
    uint64_t postsSeen;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      postsSeen = hub_->posted;
    }
    bool moved, inFlight;
    {
      std::lock_guard<std::mutex> progress(progressMu_);
      moved = round();
      inFlight = !reqs_.empty();
    }
    std::unique_lock<std::mutex> lock(hub_->mu);
    if (hub_->failed) break;
    if (moved || hub_->posted != postsSeen) {
      idle = 0;
      continue;
    }
    if (!inFlight) {
      // Nothing in flight: sleep until a post or a failure.
      hub_->work.wait(lock, [&] { return hub_->posted != postsSeen || hub_->failed; });
      idle = 0;
      continue;
    }
    // In flight, nothing moved: spin, yield, then sleep in growing steps (a post wakes it).
    ++idle;
    lock.unlock();
    if (idle < 64) {
      cpuPause();
    } else if (idle < 128) {
      sched_yield();
    } else {
      const int longest = waiter_ ? kLongestSleepUs : kLongestSleepUsWithoutDoorbell;
      const int us = std::min(longest, 10 << std::min(idle - 128, 7));
      if (waiter_) {
        // Woken by an arrival, a post or a failure (each rings the view's doorbell).
        waiter_->waitActivity(seen, std::chrono::microseconds(us));
      } else {
        lock.lock();
        hub_->work.wait_for(lock, std::chrono::microseconds(us),
                            [&] { return hub_->posted != postsSeen || hub_->failed; });
      }
    }
  }
  std::lock_guard<std::mutex> progress(progressMu_);
  failAll();
}

void P2p::failAll() {
  std::deque<P2pOpPtr> queued;
  mtxcomm_result_t code;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(hub_->mu);
    queued.swap(hub_->queue);
    code = hub_->code;
    reason = hub_->reason;
  }
  // Abandoned first: once the requests are gone, no transport touches a user buffer.
  std::vector<P2pOpPtr> ops;
  reqs_.clear();
  for (Slot& s : slots_) {
    if (s.op) ops.push_back(std::move(s.op));
  }
  slots_.clear();
  for (auto& [key, box] : inboxes_) ops.insert(ops.end(), box.recvs.begin(), box.recvs.end());
  inboxes_.clear();  // parked header receives too
  for (auto& [tag, q] : anyRecvs_) ops.insert(ops.end(), q.begin(), q.end());
  anyRecvs_.clear();
  for (auto& [tag, q] : selfRecvs_) ops.insert(ops.end(), q.begin(), q.end());
  selfRecvs_.clear();
  selfMsgs_.clear();
  ops.insert(ops.end(), queued.begin(), queued.end());
  for (const P2pOpPtr& op : ops) {
    if (op->done.load(std::memory_order_acquire)) continue;  // a send of two parts, listed twice
    complete(*op, code, strCat("rank ", rank_, ": ", describeP2pOp(*op), ": ", reason));
  }
  {
    // From here failChannel() aborts the view itself where asked; before, it is asked here.
    std::lock_guard<std::mutex> lock(hub_->mu);
    hub_->finished = true;
  }
  abortViewOnce();
}

void P2p::complete(P2pOp& op, mtxcomm_result_t code, std::string message) {
  op.code = code;
  op.message = std::move(message);
  {
    std::lock_guard<std::mutex> lock(hub_->mu);
    op.done.store(true, std::memory_order_release);
  }
  hub_->done.notify_all();
}

void P2p::add(RequestPtr req, P2pOpPtr op, Part part, std::unique_ptr<char[]> scratch, Key key) {
  reqs_.push_back(std::move(req));
  slots_.push_back(Slot{std::move(op), part, std::move(scratch), key});
}

void P2p::start(const P2pOpPtr& op) {
  op->seq = nextSeq_++;
  if (!op->isSend) op->source = op->peer;
  if (!op->isSend && op->peer == P2pOp::kAnySource) {
    startAny(op);
    return;
  }
  if (op->peer == rank_) {
    startSelf(op);
    return;
  }
  if (!op->isSend) {
    const Key key(op->peer, op->tag);
    Inbox& box = inboxes_[key];
    if (box.arrived) {
      deliver(key, op);  // no older receive waits for it (it would have taken it)
    } else {
      box.recvs.push_back(op);
      postHeader(key, box);
    }
    return;
  }
  const uint64_t bytes = op->bytes;
  std::memcpy(op->header, &bytes, 8);
  std::memcpy(op->header + 8, &kHeaderMagic, 8);
  const bool inlined = op->bytes <= P2pOp::kInlineBytes;
  if (inlined && op->bytes > 0) std::memcpy(op->header + 16, op->buf, op->bytes);
  op->partsLeft = inlined ? 1 : 2;
  add(view_->isend(op->peer, op->tag, op->header, P2pOp::kHeaderBytes), op, Part::kSend);
  if (!inlined) add(view_->isend(op->peer, op->tag, op->buf, op->bytes), op, Part::kSend);
}

void P2p::compact(const std::function<bool(size_t)>& takeOut) {
  size_t keep = 0;
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (takeOut(i)) continue;
    if (keep != i) {
      reqs_[keep] = std::move(reqs_[i]);
      slots_[keep] = std::move(slots_[i]);
    }
    ++keep;
  }
  reqs_.resize(keep);
  slots_.resize(keep);
}

bool P2p::poll() {
  // A header receive that only receives from any source want may go unanswered: its peer
  // leaving is no error for them (another peer may send).
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (reqs_[i] && slots_[i].part == Part::kHeader) {
      reqs_[i]->optional = inboxes_[slots_[i].key].recvs.empty();
    }
  }
  view_->testAll(reqs_);
  // Completed slots are taken out first: handling them posts new requests.
  std::vector<Slot> finished;
  compact([&](size_t i) {
    if (reqs_[i]) return false;
    finished.push_back(std::move(slots_[i]));
    return true;
  });
  for (Slot& s : finished) onDone(s);
  return !finished.empty();
}

void P2p::onDone(Slot& slot) {
  switch (slot.part) {
    case Part::kSend:
      if (--slot.op->partsLeft == 0) complete(*slot.op, MTXCOMM_SUCCESS, "");
      break;
    case Part::kHeader:
      onHeader(slot.key);
      break;
    case Part::kPayload:
      complete(*slot.op, MTXCOMM_SUCCESS, "");
      break;
    case Part::kDrain:
      break;  // the scratch goes with the slot
  }
}

void P2p::onHeader(const Key& key) {
  Inbox& box = inboxes_[key];
  box.posted = false;
  box.arrived = true;
  P2pOpPtr recv = takeReceiver(key, box);
  if (recv) deliver(key, recv);  // else held for the next receive that matches it
}

void P2p::deliver(const Key& key, const P2pOpPtr& recv) {
  Inbox& box = inboxes_[key];
  box.arrived = false;
  recv->source = key.first;
  uint64_t sent = 0, magic = 0;
  std::memcpy(&sent, box.header, 8);
  std::memcpy(&magic, box.header + 8, 8);
  if (magic != kHeaderMagic) {
    mtxcomm::fail(MTXCOMM_INTERNAL_ERROR,
                  "point-to-point: a malformed message header from peer rank ", key.first, " (tag ",
                  key.second, ")");
  }
  if (sent != recv->bytes) {
    if (sent > P2pOp::kInlineBytes) {
      std::unique_ptr<char[]> scratch(new (std::nothrow) char[sent]);
      if (!scratch) {
        mtxcomm::fail(MTXCOMM_SYSTEM_ERROR,
                      "point-to-point: out of memory draining a mismatched message of ", sent,
                      " bytes from peer rank ", key.first, " (tag ", key.second, ")");
      }
      char* where = scratch.get();
      add(view_->irecv(key.first, key.second, where, sent), nullptr, Part::kDrain,
          std::move(scratch));
    }
    mismatch(*recv, sent);
  } else if (sent <= P2pOp::kInlineBytes) {
    if (sent) std::memcpy(recv->buf, box.header + 16, sent);
    complete(*recv, MTXCOMM_SUCCESS, "");
  } else {
    add(view_->irecv(key.first, key.second, recv->buf, sent), recv, Part::kPayload);
  }
  // The next message of (peer, tag) follows the payload: its header receive is posted after.
  if (wanted(key, box)) {
    postHeader(key, box);
  } else if (!box.posted) {
    inboxes_.erase(key);
  }
}

void P2p::mismatch(P2pOp& recv, size_t sentBytes) {
  complete(recv, MTXCOMM_INVALID_USAGE,
           strCat("rank ", rank_,
                  ": size mismatch on a point-to-point message: the receive from "
                  "peer rank ",
                  recv.source, recv.peer == P2pOp::kAnySource ? " (any source)" : "", " (tag ",
                  recv.tag, ") is for ", recv.bytes, " bytes, the matching send of peer rank ",
                  recv.source, " has ", sentBytes,
                  " bytes (nothing was written to the receive buffer; the message is consumed)"));
}

}  // namespace mtxcomm
