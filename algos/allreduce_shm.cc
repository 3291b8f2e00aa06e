// allreduce / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment (transports/shm/shm_group.h); any count,
//   every op.
// Steps, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: every rank copies its chunk into its slot
//   and arrives at a barrier; then either (two ranks, or a chunk under 16 KiB) every rank
//   reduces the whole chunk from all slots, in rank order, straight into its receive buffer;
//   or (more ranks, larger chunks) rank r reduces slice r of the chunk into slot 0, a second
//   barrier follows, and every rank copies the reduced chunk out. Slots alternate between two
//   sets, so the next chunk's copy-in overlaps nobody's reads.
// Bytes moved per rank and element: 1 write + 1 read (copy in), n reads (+1 write into the
//   receive buffer) — no message passing and no intermediate copies: memory bandwidth bound.
//   Sliced: copy in, (n/n) reads + 1/n writes, copy out.
// Example, n = 2, count = 4: r0 writes [a0 b0 c0 d0] into slot 0, r1 [a1 b1 c1 d1] into slot
//   1; barrier; both compute slot0 + slot1 = [a0+a1 ...] into their receive buffers.
// Chosen design and its numbers: bench/RESULTS.md. Source: the shared-memory collectives of
//   Open MPI coll/sm and MPICH's shm allreduce (copy-in/reduce/copy-out through shared slots).
#include <cstring>

#include "algos/patterns.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

// Sliced from two ranks on: measured faster than whole-chunk reduction (bench/RESULTS.md).
constexpr int kSliceMinRanks = 2;

void runAllreduceShm(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize, chunk = g.slotBytes() / es;
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet();
    const char* in = send + off * es;
    if (!shmSliced(len * es, n, kSliceMinRanks)) {
      std::memcpy(g.slot(set, me), in, len * es);
      g.barrier("allreduce (shm) copy-in");
      reduceSlots(a, g, set, 0, recv + off * es, len);
      g.finishChunk();
      continue;
    }
    // Slice q of the chunk is reduced by rank q. Copy in only the slices the others reduce;
    // this rank's own slice position in its slot then receives its reduced slice.
    auto sliceOff = [&](int q) { return patterns::blockOffset(len, n, q) * es; };
    auto sliceLen = [&](int q) { return patterns::blockCount(len, n, q) * es; };
    char* mine = g.slot(set, me);
    for (int q = 0; q < n; ++q) {
      if (q != me) std::memcpy(mine + sliceOff(q), in + sliceOff(q), sliceLen(q));
    }
    g.barrier("allreduce (shm) copy-in");
    // Operands in rank order; this rank's own straight from its send buffer.
    const size_t so = sliceOff(me), cnt = sliceLen(me) / es;
    auto operand = [&](int q) -> const char* { return q == me ? in + so : g.slot(set, q) + so; };
    char* dst = mine + so;
    reduceBuffers(a.dtype, a.op, dst, operand(0), operand(1), cnt);
    for (int q = 2; q < n; ++q) reduceBuffers(a.dtype, a.op, dst, dst, operand(q), cnt);
    g.barrier("allreduce (shm) reduce");
    for (int q = 0; q < n; ++q) {
      std::memcpy(recv + off * es + sliceOff(q), g.slot(set, q) + sliceOff(q), sliceLen(q));
    }
    g.finishChunk();
  }
}

}  // namespace mtxcomm
