// The line exchange of a ShmGroup (shm_group.h, exchangeLines, broadcastLines, gatherLines):
// NCCL's LL protocol on shared memory. Every rank writes its bytes, after the call's signature,
// into 64-byte lines of its own box, each line tagged with the exchange's number after its
// data; readers copy a peer's lines as their tags arrive. One cross-core transfer per line and
// no barrier.
#include <cstdint>
#include <cstring>

#include "lib/base/error.h"
#include "transports/shm/shm_group.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_wait.h"

namespace mtxcomm {

ShmGroup::Line* ShmGroup::line(int r, uint64_t x, size_t j) const {
  static_assert(sizeof(Line) == 64, "a line is one cache line");
  char* boxes = slotStart(2, 0) + static_cast<size_t>(size_) * kSmallSlots * kSmallBytes;
  const size_t box = static_cast<size_t>(r) * kLineSlots + (x - 1) % kLineSlots;
  return reinterpret_cast<Line*>(boxes) + box * shm::kLinesPerBox + j;
}

void ShmGroup::awaitLineBox(uint64_t x) {
  // This rank's box for exchange x was last used by x - kLineSlots: every peer must have read
  // it.
  if (x <= kLineSlots || x - kLineSlots <= linesReadByAll_) return;
  uint64_t least = UINT64_MAX;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    waitFor(q, Counter::kLinesRead, x - kLineSlots, "reusing a line box", -1);
    least = std::min(least, control(q).linesRead.load(std::memory_order_acquire));
  }
  linesReadByAll_ = least;
}

void ShmGroup::writeLines(uint64_t x, const void* data, size_t bytes) {
  unsigned char stream[shm::kLinesPerBox * shm::kLineData];
  const uint64_t header[3] = {call_.kind, call_.count, call_.seq};
  std::memcpy(stream, header, shm::kLineHeader);
  std::memcpy(stream + shm::kLineHeader, data, bytes);
  const size_t lines = (shm::kLineHeader + bytes + shm::kLineData - 1) / shm::kLineData;
  std::memset(stream + shm::kLineHeader + bytes, 0,
              lines * shm::kLineData - shm::kLineHeader - bytes);
  for (size_t j = 0; j < lines; ++j) {
    Line* l = line(rank_, x, j);
    std::memcpy(l->data, stream + j * shm::kLineData, shm::kLineData);
    l->tag.store(x, std::memory_order_release);
  }
}

void ShmGroup::readLines(int q, uint64_t x, void* out, size_t bytes, const char* what) {
  unsigned char stream[shm::kLinesPerBox * shm::kLineData];
  const size_t lines = (shm::kLineHeader + bytes + shm::kLineData - 1) / shm::kLineData;
  for (size_t j = 0; j < lines; ++j) {
    auto tag = [this, x, j](int r) { return line(r, x, j)->tag.load(std::memory_order_acquire); };
    waitUntil(q, tag, x, what);
    std::memcpy(stream + j * shm::kLineData, line(q, x, j)->data, shm::kLineData);
    if (j == 0) {
      uint64_t theirs[3];
      std::memcpy(theirs, stream, shm::kLineHeader);
      CallSignature sig;
      sig.kind = theirs[0];
      sig.count = theirs[1];
      sig.seq = theirs[2];
      checkSameCall(q, sig);
    }
  }
  std::memcpy(out, stream + shm::kLineHeader, bytes);
}

void ShmGroup::exchangeLines(const void* mine, size_t bytes, char* all, const char* what) {
  if (bytes > kLineBytes) fail(MTXCOMM_INTERNAL_ERROR, "exchangeLines of ", bytes, " bytes");
  const uint64_t x = ++lines_;
  awaitLineBox(x);
  writeLines(x, mine, bytes);
  published(control(rank_));
  char* own = all + static_cast<size_t>(rank_) * bytes;
  if (own != mine) std::memcpy(own, mine, bytes);  // in place: already there
  for (int i = 1; i < size_; ++i) {
    const int q = (rank_ + i) % size_;
    readLines(q, x, all + static_cast<size_t>(q) * bytes, bytes, what);
  }
  control(rank_).linesRead.store(x, std::memory_order_release);
  published(control(rank_));
}

void ShmGroup::broadcastLines(int root, void* buf, size_t bytes, const char* what) {
  if (bytes > kLineBytes) fail(MTXCOMM_INTERNAL_ERROR, "broadcastLines of ", bytes, " bytes");
  const uint64_t x = ++lines_;
  Control& mine = control(rank_);
  if (rank_ == root) {
    awaitLineBox(x);
    mine.linesRead.store(x, std::memory_order_release);  // nothing of x to read
    writeLines(x, buf, bytes);
  } else {
    readLines(root, x, buf, bytes, what);
    mine.linesRead.store(x, std::memory_order_release);
  }
  published(mine);
}

void ShmGroup::gatherLines(int root, const void* mine, size_t bytes, char* all, const char* what) {
  if (bytes > kLineBytes) fail(MTXCOMM_INTERNAL_ERROR, "gatherLines of ", bytes, " bytes");
  const uint64_t x = ++lines_;
  Control& me = control(rank_);
  if (rank_ != root) {
    awaitLineBox(x);
    me.linesRead.store(x, std::memory_order_release);  // nothing of x to read
    writeLines(x, mine, bytes);
  } else {
    char* own = all + static_cast<size_t>(rank_) * bytes;
    if (own != mine) std::memcpy(own, mine, bytes);
    for (int i = 1; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      readLines(q, x, all + static_cast<size_t>(q) * bytes, bytes, what);
    }
    me.linesRead.store(x, std::memory_order_release);
  }
  published(me);
}

}  // namespace mtxcomm
