// Helpers shared by the shared-memory algorithms (algos/<collective>_shm.cc).
#ifndef MTXCOMM_ALGOS_SHM_CHUNKS_H_
#define MTXCOMM_ALGOS_SHM_CHUNKS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

#include "algos/patterns.h"
#include "algos/registry.h"
#include "lib/base/reduce.h"
#include "transports/shm/shm_group.h"

namespace mtxcomm {

// Chunks of a reduction at or above this many bytes are reduced in slices (each rank its
// 1/n, then a second barrier and a copy out) from minRanks ranks on; smaller ones are reduced
// whole (one barrier).
constexpr size_t kShmSliceBytes = 16 << 10;

inline bool shmSliced(size_t chunkBytes, int n, int minRanks = 3) {
  return n >= minRanks && chunkBytes >= kShmSliceBytes;
}

// dst = slot(set, 0) op slot(set, 1) op ... op slot(set, n-1) over count elements starting at
// byte offset `at` of each slot, always in rank order 0..n-1 (so every rank computes the same
// bits). dst may be slot(set, 0) + at.
inline void reduceSlots(const CollArgs& a, ShmGroup& g, int set, size_t at, void* dst,
                        size_t count) {
  reduceBuffers(a.dtype, a.op, dst, g.slot(set, 0) + at, g.slot(set, 1) + at, count);
  for (int q = 2; q < g.size(); ++q) {
    reduceBuffers(a.dtype, a.op, dst, dst, g.slot(set, q) + at, count);
  }
  if (a.avgDivisor > 0) divideBuffer(a.dtype, dst, count, a.avgDivisor);
}

// Every rank's bytes of a tiny reduction, gathered through the line boxes (one buffer per
// thread: ranks may be threads of one process).
inline std::vector<char>& lineScratch(int n) {
  thread_local std::vector<char> all;
  all.resize(static_cast<size_t>(n) * ShmGroup::kLineBytes);
  return all;
}

// dst = all[0] op all[1] op ... op all[n-1], the n ranks' count elements laid end to end in
// all, in rank order (the bits of reduceSlots), divided for MTXCOMM_AVG.
inline void reduceGathered(const CollArgs& a, int n, const char* all, void* dst) {
  const size_t bytes = a.count * a.elemSize;
  reduceBuffers(a.dtype, a.op, dst, all, all + bytes, a.count);
  for (int q = 2; q < n; ++q) {
    reduceBuffers(a.dtype, a.op, dst, dst, all + static_cast<size_t>(q) * bytes, a.count);
  }
  if (a.avgDivisor > 0) divideBuffer(a.dtype, dst, a.count, a.avgDivisor);
}

// Slice q of a chunk of len elements: byte offset and byte length (patterns::block*).
inline size_t sliceOffset(size_t len, int n, int q, size_t es) {
  return patterns::blockOffset(len, n, q) * es;
}
inline size_t sliceBytes(size_t len, int n, int q, size_t es) {
  return patterns::blockCount(len, n, q) * es;
}

// Sliced reduction of one chunk (the reduce-scatter half of Rabenseifner's algorithm on shared
// memory): every rank copies into its slot only the slices the others own; barrier; rank r
// reduces slice r in rank order — its own operand read in place from `in` — into the (unused)
// slice-r position of its own slot; barrier. On return reduced slice q lies at
// slot(set, q) + sliceOffset(q), computed once, so every reader gets the same bits.
// out, when given (this rank's output for the chunk, e.g. allreduce's receive buffer), also
// gets this rank's own reduced slice: reduced there block by block, each block then copied to
// the slot while it is in L1 (4 KiB blocks: within noise of 8 KiB, 3% faster than 32 KiB at np=2;
// one read of the slice less than reducing into the slot and copying out of it afterwards);
// copyOutSlices(..., skipOwn = true) then copies only the others' slices. Not where out's slice is
// this rank's input and this rank is not among the first two operands (the in-place case: the
// running sum would overwrite an operand not yet read); there the slot takes the sum and out is
// left alone (returns false).
inline constexpr size_t kOwnSliceBlockBytes = 4 << 10;
inline bool reduceChunkSliced(const CollArgs& a, ShmGroup& g, int set, const char* in, size_t len,
                              const char* what, char* out = nullptr) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize;
  char* mine = g.slot(set, me);
  for (int q = 0; q < n; ++q) {
    const size_t at = sliceOffset(len, n, q, es);
    if (q != me) copyBytes(mine + at, in + at, sliceBytes(len, n, q, es));
  }
  g.barrier(what);
  const size_t at = sliceOffset(len, n, me, es), cnt = sliceBytes(len, n, me, es) / es;
  auto operand = [&](int q) -> const char* { return q == me ? in + at : g.slot(set, q) + at; };
  // MTXCOMM_AVG: the owner divides its slice while it is in cache; every reader gets the
  // quotient's bits, as it got the sum's.
  auto reduceInto = [&](char* dst, size_t from, size_t count) {
    const size_t b = from * es;
    reduceBuffers(a.dtype, a.op, dst + b, operand(0) + b, operand(1) + b, count);
    for (int q = 2; q < n; ++q)
      reduceBuffers(a.dtype, a.op, dst + b, dst + b, operand(q) + b, count);
    if (a.avgDivisor > 0) divideBuffer(a.dtype, dst + b, count, a.avgDivisor);
  };
  const bool own = out && (out != in || me < 2);
  if (own) {
    const size_t block = std::max<size_t>(1, kOwnSliceBlockBytes / es);
    for (size_t i = 0; i < cnt; i += block) {
      const size_t k = std::min(block, cnt - i);
      reduceInto(out + at, i, k);
      copyBytes(mine + at + i * es, out + at + i * es, k * es);
    }
  } else {
    reduceInto(mine + at, 0, cnt);
  }
  g.barrier(what);
  return own;
}

// Copies the n reduced slices of a chunk (after reduceChunkSliced) to out; skipOwn: not this
// rank's own (reduceChunkSliced put it there already).
inline void copyOutSlices(ShmGroup& g, int set, size_t len, size_t es, char* out,
                          bool skipOwn = false) {
  const int n = g.size();
  for (int q = 0; q < n; ++q) {
    if (skipOwn && q == g.rank()) continue;
    const size_t at = sliceOffset(len, n, q, es);
    copyBytes(out + at, g.slot(set, q) + at, sliceBytes(len, n, q, es));
  }
}

}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_SHM_CHUNKS_H_
