// The data path of a ShmGroup (shm_group.h): the chunk sets of slots and their reuse, the
// barrier, the pieces a broadcast's root publishes, and the ring of small slots. The other
// units: shm_segment (the segment: layout, mapping), shm_calls (call signatures and deferred
// checks), shm_notify (notifications, idle, cycles), shm_wait (waits, abort, liveness) and
// shm_lines (the line exchange).
#include "transports/shm/shm_group.h"

#include <algorithm>
#include <cstdint>

#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_wait.h"

namespace mtxcomm {

char* ShmGroup::slot(int set, int r) const { return slotStart(set, r) + slotShift_; }

char* ShmGroup::smallSlot(int r) const {
  char* ring = slotStart(2, 0);  // just past the two chunk sets
  const uint64_t i = smalls_ - 1;
  return ring + (static_cast<size_t>(r) * kSmallSlots + i % kSmallSlots) * kSmallBytes;
}

char* ShmGroup::beginSmall(bool writer) {
  const uint64_t i = smalls_++;
  // Only the writer rewrites a slot, so only it must know that every reader is done with the
  // message kSmallSlots back. It remembers how far all readers had got when it last looked,
  // so most calls touch no peer's cache line at all.
  if (writer && i >= kSmallSlots && i - kSmallSlots + 1 > smallReadByAll_) {
    uint64_t least = UINT64_MAX;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      waitFor(q, Counter::kSmallConsumed, i - kSmallSlots + 1, "reusing a small slot", -1);
      least = std::min(least, control(q).smallConsumed.load(std::memory_order_acquire));
    }
    smallReadByAll_ = least;
  }
  return smallSlot(rank_);
}

void ShmGroup::postSmall() {
  Control& mine = control(rank_);
  const uint64_t i = smalls_ - 1;
  mine.smallCall[i % kSmallSlots].store(call_);
  mine.smallPosted.store(smalls_, std::memory_order_release);
  published(mine);
}

void ShmGroup::waitSmall(int root, const char* what) {
  waitFor(root, Counter::kSmallPosted, smalls_, what, -1);
  checkSameCall(root, control(root).smallCall[(smalls_ - 1) % kSmallSlots].load());
}

void ShmGroup::finishSmall() {
  control(rank_).smallConsumed.store(smalls_, std::memory_order_release);
  published(control(rank_));
}

int ShmGroup::nextSet(size_t bytes, size_t minPositions) {
  const uint64_t g = chunks_++;
  // The set's (g / 2)-th chunk takes position (g / 2) mod positions.
  constexpr size_t kPositionBytes = 4096;
  const size_t span =
      std::max<size_t>(1, (bytes + kPositionBytes - 1) / kPositionBytes) * kPositionBytes;
  const size_t positions = bytes > 0 ? slotBytes_ / span : 0;
  slotShift_ = positions >= std::max<size_t>(2, minPositions)
                   ? static_cast<size_t>((g >> 1) % positions) * span
                   : 0;
  // Usually known without reading a peer's line: a barrier in the previous chunk proved it.
  if (g >= 2 && consumedByAll_ < g - 1) {
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) waitFor(q, Counter::kConsumed, g - 1, "reusing a shared-memory slot", -1);
    }
    consumedByAll_ = g - 1;
  }
  return static_cast<int>(g & 1);
}

void ShmGroup::finishChunk() {
  control(rank_).consumed.store(chunks_, std::memory_order_release);
  published(control(rank_));
}

// The posted word counts pieces: chunk g (0-based) with its first k pieces published reads
// g * (kMaxPieces + 1) + k, which only grows.
void ShmGroup::postPieces(int pieces) {
  Control& mine = control(rank_);
  if (pieces == 1) mine.postCall[(chunks_ - 1) & 1].store(call_);
  mine.posted.store((chunks_ - 1) * (kMaxPieces + 1) + static_cast<uint64_t>(pieces),
                    std::memory_order_release);
  published(mine);
}

void ShmGroup::waitPieces(int root, int pieces, const char* what) {
  waitFor(root, Counter::kPosted, (chunks_ - 1) * (kMaxPieces + 1) + static_cast<uint64_t>(pieces),
          what, pieces == 1 ? static_cast<int>((chunks_ - 1) & 1) : -1);
}

void ShmGroup::barrier(const char* what) {
  const uint64_t target = ++arrivals_;
  Control& mine = control(rank_);
  // Double-buffered by barrier parity: a peer can write barrier k+1's call only after this
  // rank arrived at k+1, so it never overwrites the word this rank is comparing at k.
  mine.call[target & 1].store(call_);
  mine.arrived.store(target, std::memory_order_release);
  published(mine);
  for (int i = 1; i < size_; ++i) {
    waitFor((rank_ + i) % size_, Counter::kArrived, target, what, static_cast<int>(target & 1));
  }
  // Every peer is at this barrier, so it has finished every chunk before the current one
  // (finishChunk's release store precedes its arrival's): nextSet need not ask again.
  if (chunks_ > 0) consumedByAll_ = std::max(consumedByAll_, chunks_ - 1);
}

}  // namespace mtxcomm
