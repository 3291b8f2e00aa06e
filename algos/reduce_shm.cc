// reduce / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count, every op.
// Steps, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: every rank copies its chunk into its slot
//   and arrives at a barrier; then either the root reduces the whole chunk from all slots, in
//   rank order, into its receive buffer (two ranks, or chunks under 16 KiB); or rank r reduces
//   slice r into slot 0, a second barrier follows, and the root copies the chunk out.
// Bytes moved per rank and element: copy in (1 read, 1 write); the root n reads and 1 write.
// Example, n = 3, root 1: all copy in; barrier; r1 computes slot0 + slot1 + slot2.
// Source: Open MPI coll/sm reduce (copy-in, reduce from shared slots).
#include <cstring>

#include "algos/patterns.h"
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
    std::memcpy(g.slot(set, me), send + off * es, len * es);
    g.barrier("reduce (shm) copy-in");
    if (!shmSliced(len * es, n)) {
      if (me == a.root) reduceSlots(a, g, set, 0, recv + off * es, len);
      g.finishChunk();
      continue;
    }
    const size_t sliceOff = patterns::blockOffset(len, n, me) * es;
    reduceSlots(a, g, set, sliceOff, g.slot(set, 0) + sliceOff, patterns::blockCount(len, n, me));
    g.barrier("reduce (shm) reduce");
    if (me == a.root) std::memcpy(recv + off * es, g.slot(set, 0), len * es);
    g.finishChunk();
  }
}

}  // namespace mtxcomm
