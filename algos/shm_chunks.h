// Helpers shared by the shared-memory algorithms (algos/<collective>_shm.cc).
#ifndef MTXCOMM_ALGOS_SHM_CHUNKS_H_
#define MTXCOMM_ALGOS_SHM_CHUNKS_H_

#include <cstddef>

#include "algos/registry.h"
#include "lib/reduce.h"
#include "transports/shm/shm_group.h"

namespace mtxcomm {

// Chunks of a reduction at or above this many bytes are reduced in slices (each rank its
// 1/n, then a second barrier and a copy out) when there are more than two ranks; smaller ones,
// and all on two ranks, are reduced whole by every rank (one barrier, fewer bytes moved).
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
}

}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_SHM_CHUNKS_H_
