// The calls of a ShmGroup: every rank publishes the signature of each call it enters (and
// whether it rejected it) with a digest of all its calls so far; a peer in another call fails
// with MTXCOMM_INVALID_USAGE naming both. A call that returns before its peers have entered it
// (a broadcast's root, a small reduce's non-root) defers its check to a later call or to
// destroy (shm_group.h, enterCall, deferCheck, checkDeferredAtDestroy).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "lib/base/error.h"
#include "transports/shm/shm_group.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_wait.h"

namespace mtxcomm {

namespace {

// The digest of a rank's calls up to this one: the previous digest mixed with the call's
// signature and whether the rank rejected it (splitmix64's finaliser, twice). Equal digests
// at call s mean equal calls 1..s but with a chance of 2^-64.
uint64_t callDigest(uint64_t previous, const CallSignature& call, bool rejected) {
  const uint64_t count = (call.count << 17) | (call.count >> 47);  // apart from kind's bits
  return shm::mixWord(shm::mixWord(previous, call.kind ^ count), call.seq * 2 + (rejected ? 1 : 0));
}

}  // namespace

void ShmGroup::enterCall(const CallSignature& call, const std::string& rejectedBecause) {
  call_ = call;
  // The owed wakes belong to the first collective after the notify; once a later one starts,
  // every peer has entered that one: none sleeps on it any more.
  if (!owed_.empty()) {
    if (owedCall_ == 0) {
      owedCall_ = call.seq;
    } else if (call.seq != owedCall_) {
      owed_.clear();
    }
  }
  Control& mine = control(rank_);
  const size_t h = call.seq % kHistory;
  mine.history[h].store(call);
  if (!rejectedBecause.empty()) {
    std::snprintf(mine.rejectReason, sizeof(mine.rejectReason), "%s", rejectedBecause.c_str());
  }
  mine.rejected[h].store(rejectedBecause.empty() ? 0 : 1, std::memory_order_relaxed);
  digest_ = callDigest(digest_, call, !rejectedBecause.empty());
  mine.digest[h].store(digest_, std::memory_order_relaxed);
  mine.callSeq.store(call.seq, std::memory_order_release);
  if (!rejectedBecause.empty()) {
    published(mine);  // a waiter on this rank learns it at once
    return;           // the call fails anyway: its own reason is the one to give
  }
  // A broadcast runs the deferred checks only when the oldest is kMaxDeferred calls old (with
  // this rank a reader of its only peer in between, fewer than kMaxDeferred are pending then),
  // so a loop of broadcasts touches a peer's lines at most once per kMaxDeferred calls; any
  // other call (a small reduce too, whose non-roots defer theirs: ranks that each named another
  // root hear of it at their next reduce) checks what it can, waiting for none.
  if (deferredCount_ == 0) return;
  const bool broadcast = static_cast<Collective>(call.kind & 0xff) == Collective::kBroadcast;
  if (!broadcast || deferredOverdue()) {
    checkDeferred(broadcast ? DeferredWait::kOverdue : DeferredWait::kNone);
  }
}

void ShmGroup::checkDeferredAtDestroy() {
  if (deferredCount_ == 0) return;
  destroying_ = true;
  checkDeferred(DeferredWait::kAll);
  destroying_ = false;
}

std::string ShmGroup::foundWhere() const {
  return destroying_ ? std::string(" (found when this rank destroyed the communicator")
                     : strCat(" (found when this rank entered call #", call_.seq);
}

void ShmGroup::deferCheck(int checked) {
  // Nothing to defer when the only peer was compared already (a reader of two ranks).
  if (size_ == 1 || (size_ == 2 && checked >= 0 && checked != rank_)) return;
  if (verified_.empty()) verified_.assign(static_cast<size_t>(size_), 0);
  deferred_[(deferredFirst_ + deferredCount_) % kMaxDeferred] = Deferred{call_, digest_};
  ++deferredCount_;
}

bool ShmGroup::deferredOverdue() const {
  return deferredCount_ > 0 && (deferredCount_ >= kMaxDeferred ||
                                call_.seq - deferred_[deferredFirst_].call.seq >= kMaxDeferred);
}

void ShmGroup::checkDeferred(DeferredWait wait) {
  while (deferredCount_ > 0) {
    auto at = [this](size_t i) -> const Deferred& {
      return deferred_[(deferredFirst_ + i) % kMaxDeferred];
    };
    uint64_t least = UINT64_MAX;  // every peer's calls agree with this rank's up to here
    int lagging = -1;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Control& c = control(p);
      const uint64_t theirs = c.callSeq.load(std::memory_order_acquire);
      // The newest deferred call p has entered and that is not yet checked against it.
      size_t i = deferredCount_;
      while (i > 0 && at(i - 1).call.seq > theirs) --i;
      if (i > 0 && at(i - 1).call.seq > verified_[p]) {
        const Deferred& d = at(i - 1);
        const uint64_t digest = c.digest[d.call.seq % kHistory].load(std::memory_order_relaxed);
        // The entry is d's only if p has not moved kHistory calls on meanwhile (never: a peer
        // runs at most a ring of small messages ahead).
        const bool current = c.callSeq.load(std::memory_order_acquire) - d.call.seq < kHistory;
        if (current && digest != d.digest) {
          // Some call up to d differs: name the first deferred one that does.
          for (size_t j = 0; j < i; ++j) {
            if (at(j).call.seq > verified_[p]) checkPeerCall(p, at(j).call);
          }
          fail(MTXCOMM_INVALID_USAGE, "the ranks disagree on a call up to call #", d.call.seq, " (",
               describeCall(d.call), "): peer rank ", p, "'s calls differ from this rank's",
               foundWhere(), ")");
        }
        verified_[p] = d.call.seq;
      }
      if (verified_[p] < least) {
        least = verified_[p];
        lagging = p;
      }
    }
    while (deferredCount_ > 0 && at(0).call.seq <= least) {
      deferredFirst_ = (deferredFirst_ + 1) % kMaxDeferred;
      --deferredCount_;
    }
    if (deferredCount_ == 0 || wait == DeferredWait::kNone ||
        (wait == DeferredWait::kOverdue && !deferredOverdue())) {
      return;
    }
    // Wait for the peer that has not entered the oldest deferred call yet.
    waitFor(lagging, Counter::kCall, at(0).call.seq,
            destroying_ ? "destroy's check of an earlier call" : "a call's deferred check", -1);
  }
}

bool ShmGroup::checkPeerCall(int p, const CallSignature& call) {
  if (call.seq == 0) return true;
  Control& c = control(p);
  const uint64_t theirs = c.callSeq.load(std::memory_order_acquire);
  if (theirs < call.seq) return false;             // not there yet
  if (theirs - call.seq >= kHistory) return true;  // too far on (never, for a deferred check)
  const size_t h = call.seq % kHistory;
  const CallSignature sig = c.history[h].load();
  const bool rejected = c.rejected[h].load(std::memory_order_relaxed) != 0;
  // Re-read: the entry is ours only if the peer has not moved kHistory calls on meanwhile.
  if (c.callSeq.load(std::memory_order_acquire) - call.seq >= kHistory || sig.seq != call.seq) {
    return true;
  }
  if (rejected) {
    fail(MTXCOMM_INVALID_USAGE, "peer rank ", p, " rejected ",
         call.seq == call_.seq ? std::string("this call") : strCat("call #", call.seq), " (",
         describeCall(sig),
         "): ", std::string(c.rejectReason, strnlen(c.rejectReason, sizeof(c.rejectReason))));
  }
  checkSameCall(p, call, sig);
  return true;
}

void ShmGroup::awaitArrivals(const char* what) {
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    waitFor(q, Counter::kCall, call_.seq, what, -1);
    checkPeerCall(q);
  }
}

void ShmGroup::checkSameCall(int p, const CallSignature& mine, const CallSignature& theirs) {
  if (theirs == mine) return;
  // Calls of different numbers met (a barrier of one call against another's): an earlier call
  // returned before every peer had entered it (a broadcast). Name the pair of calls of the same
  // number where the ranks first differ, when the histories still hold it.
  CallSignature ours = mine;
  if (theirs.seq < mine.seq && mine.seq - theirs.seq < kHistory) {
    const CallSignature own = control(rank_).history[theirs.seq % kHistory].load();
    if (own.seq == theirs.seq && own != theirs) ours = own;
  } else if (theirs.seq > mine.seq) {
    checkPeerCall(p, mine);  // throws naming p's call of this number if it differs
  }
  const std::string found =
      ours.seq == call_.seq && !destroying_
          ? std::string()
          : strCat(foundWhere(), ": a broadcast returns before every peer has entered it)");
  fail(MTXCOMM_INVALID_USAGE, "the ranks disagree on the call: this rank called ",
       describeCall(ours), " but peer rank ", p, " called ", describeCall(theirs),
       " (every rank must pass the same collective, count, datatype, op and root)", found);
}

}  // namespace mtxcomm
