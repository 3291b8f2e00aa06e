// reduce / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count, every op.
// Steps: at most 256 bytes (ShmGroup::kLineBytes): every rank but the root writes its input
//   into its line-tagged box and returns; the root reads each as its tags arrive and reduces
//   them in rank order (ShmGroup::gatherLines; no barrier, the non-roots wait for nobody, as in
//   Open MPI's eager sends). Otherwise, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: either (two
//   ranks, or chunks under 16 KiB) every rank copies its chunk into its slot, barrier, and the root
//   reduces the whole chunk from all slots, in rank order, into its receive buffer; or the chunk is
//   reduced in slices exactly as allreduce / shm does (reduceChunkSliced in algos/shm_chunks.h:
//   each rank copies in the slices others own and reduces its own) and the root copies the slices
//   out.
// Bytes moved per rank and element: copy in (1 read, 1 write); the root n reads and 1 write.
// Example, n = 3, root 1: all copy in; barrier; r1 computes slot0 + slot1 + slot2.
// Source: Open MPI coll/sm reduce (copy-in, reduce from shared slots).

#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

void runReduceShm(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize, chunk = g.slotBytes() / es;
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  if (a.count * es <= ShmGroup::kLineBytes) {
    // Tiny: every rank but the root writes its bytes into its line box and returns; the root
    // reads them as they arrive and reduces in rank order (the bits of the slots' path). The
    // others' calls are checked later (ShmGroup::deferCheck), as a broadcast root's are.
    std::vector<char>& all = lineScratch(n);
    g.gatherLines(a.root, send, a.count * es, all.data(), "reduce (shm, lines)");
    if (me == a.root) {
      reduceGathered(a, n, all.data(), recv);
    } else {
      g.deferCheck(-1);
    }
    return;
  }
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet();
    const char* in = send + off * es;
    if (!shmSliced(len * es, n)) {
      copyBytes(g.slot(set, me), in, len * es);
      g.barrier("reduce (shm) copy-in");
      if (me == a.root) reduceSlots(a, g, set, 0, recv + off * es, len);
      g.finishChunk();
      continue;
    }
    reduceChunkSliced(a, g, set, in, len, "reduce (shm)");
    if (me == a.root) copyOutSlices(g, set, len, es, recv + off * es);
    g.finishChunk();
  }
}

}  // namespace mtxcomm
