// reduce / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count, every op.
// Steps, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: either (two ranks, or chunks under
//   16 KiB) every rank copies its chunk into its slot, barrier, and the root reduces the whole
//   chunk from all slots, in rank order, into its receive buffer; or the chunk is reduced in
//   slices exactly as allreduce / shm does (reduceChunkSliced in algos/shm_chunks.h: each rank
//   copies in the slices others own and reduces its own) and the root copies the slices out.
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
