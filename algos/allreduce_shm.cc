// allreduce / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment (transports/shm/shm_group.h); any count,
//   every op.
// Steps: at most 256 bytes (ShmGroup::kLineBytes): every rank writes its input into its
//   line-tagged box (ShmGroup::exchangeLines: 64-byte lines each carrying the exchange's
//   number, NCCL's LL protocol), reads every peer's as the tags arrive and reduces all of them
//   in rank order; no barrier. Otherwise, per chunk of at most ShmGroup::reductionChunkBytes()
//   (the slot, MTXCOMM_SHM_SLOT_BYTES, auto: one core's L2; half of it where only half a slot's
//   working set fits in the L2, shmReductionChunkBytes): small chunks (< 16 KiB): every rank copies
//   its chunk into its slot; one barrier; every rank
//     reduces the whole chunk from all slots, in rank order, straight into its receive buffer.
//   larger chunks (sliced; slice q of the chunk belongs to rank q): every rank copies into its
//     slot only the slices the others own; barrier; rank r reduces slice r — its own operand
//     read in place from its send buffer, the others' from their slots, in rank order — into
//     the (unused) slice-r position of its own slot; barrier; every rank copies all n reduced
//     slices out. Each slice is computed once, so every rank receives the same bits.
//   Sets of slots alternate; a set is rewritten only after every rank finished the chunk that
//   last used it (per-rank consumed counters), so copy-in of the next chunk overlaps nothing.
// Bytes moved per rank and element (n = 2, sliced): copy in 1/2 (read + write), reduce 1/2
//   (two reads + one write), copy out 1 (read + write): 2.5 reads + 2 writes = 18 bytes per
//   float32 element, of which one element's worth crosses cores. The whole-chunk variant moves
//   3 reads + 2 writes and reduces twice as much: measured at np = 2 (median of 5 runs, ratio to
//   Open MPI's MPI_Allreduce in the same run), whole-chunk 64K-64M geometric mean 0.53 (max
//   0.81 at 512 KiB); sliced 0.45 (max 0.63). Slots: every chunk costs two barriers, so a
//   512 KiB-4 MiB allreduce took 0.6-0.8x the time with 512 KiB or 1 MiB slots than with
//   256 KiB on an L2 of 1 MiB (np = 2-4; defaultShmSlotBytes sizes the slot from the L2); on
//   an L2 of 2 MiB a 1 MiB allreduce in 512 KiB chunks took 0.9x the time of one chunk at np = 2.
//   Numbers: bench/RESULTS.md.
// Example, n = 2, count = 4 (sliced): r0 owns [a b], r1 owns [c d]. r0 writes [c0 d0] into its
//   slot, r1 writes [a1 b1]; barrier; r0 computes a0+a1, b0+b1 (a0, b0 from its send buffer)
//   into its slot's [a b] place, r1 computes c0+c1, d0+d1 likewise; barrier; both copy
//   [a b] from slot 0 and [c d] from slot 1 into their receive buffers.
// Source: the shared-memory collectives of Open MPI coll/sm and MPICH (copy-in, reduce from
//   shared slots, copy-out); the slicing is the reduce-scatter + allgather structure of
//   Rabenseifner's algorithm mapped onto shared memory.
//   The tiny path: NCCL's LL (low-latency) protocol, flags stored with the data in each line.

#include <vector>

#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

// Sliced from two ranks on: measured faster than whole-chunk reduction (bench/RESULTS.md).
constexpr int kSliceMinRanks = 2;

void runAllreduceShm(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize, chunk = g.reductionChunkBytes() / es;
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  if (a.count * es <= ShmGroup::kLineBytes) {
    // Tiny: every rank's bytes through the line-tagged exchange, then the same rank-order
    // reduction as the slots' (so the bits are those of the barrier path).
    std::vector<char>& all = lineScratch(n);
    g.exchangeLines(send, a.count * es, all.data(), "allreduce (shm, lines)");
    reduceGathered(a, n, all.data(), recv);
    return;
  }
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet(len * es, ShmGroup::kExchangePositions);
    const char* in = send + off * es;
    if (!shmSliced(len * es, n, kSliceMinRanks)) {
      copyBytes(g.slot(set, me), in, len * es);
      g.barrier("allreduce (shm) copy-in");
      reduceSlots(a, g, set, 0, recv + off * es, len);
      g.finishChunk();
      continue;
    }
    const bool own = reduceChunkSliced(a, g, set, in, len, "allreduce (shm)", recv + off * es);
    copyOutSlices(g, set, len, es, recv + off * es, own);
    g.finishChunk();
  }
}

}  // namespace mtxcomm
