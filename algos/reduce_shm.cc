// reduce / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count, every op.
// Steps: at most 256 bytes (ShmGroup::kLineBytes): every rank but the root writes its input
//   into its line-tagged box and returns; the root reads each as its tags arrive and reduces
//   them in rank order (ShmGroup::gatherLines; no barrier, the non-roots wait for nobody, as in
//   Open MPI's eager sends). Otherwise, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: either (two
//   ranks, or chunks under 64 KiB) every rank but the root copies its chunk into its slot, posts
//   it and goes on (it writes that slot again two chunks later, once nextSet has seen the root
//   finish this one), and the root waits for each post and reduces its own input where it lies
//   and the others' slots, in rank order, into its receive buffer (in place at a root >= 2, its
//   input goes through its slot first: the sum would overwrite it before its turn); or the chunk
//   is reduced in slices exactly as allreduce / shm does (reduceChunkSliced in
//   algos/shm_chunks.h: each rank copies in the slices others own and reduces its own) and the
//   root copies the slices out.
// Bytes moved per rank and element: a non-root copies in (1 read, 1 write); the root n reads
// and 1 write.
// Example, n = 3, root 1: r0 and r2 copy in and post; r1 computes slot0 + in + slot2.
// Source: Open MPI coll/sm reduce (copy-in, reduce from shared slots); the eager non-roots as
// in Open MPI's btl/vader eager sends.

#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

namespace {
// Below this many bytes a chunk is reduced whole by the root (the non-roots post and go on);
// at and above it, from 3 ranks on, in slices (every rank reduces 1/n, two barriers).
constexpr size_t kReduceSliceBytes = 64 << 10;
}  // namespace

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
  bool eager = false;  // some chunk went through the eager path: the root's call not compared
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet();
    const char* in = send + off * es;
    if (!shmSliced(len * es, n, 3, kReduceSliceBytes)) {
      // Eager: a non-root posts its slot and goes on; it writes that slot again two chunks
      // later, after nextSet has seen the root finish this chunk. The root waits for each
      // post (checking that rank's call) and reduces in rank order.
      if (me != a.root) {
        copyBytes(g.slot(set, me), in, len * es);
        g.postPieces(1);
        g.finishChunk();
        eager = true;
        continue;
      }
      // The root reduces its own input where it lies, in rank order (the bits of every other
      // path), unless the reduction would overwrite it before its turn (in place, root >= 2).
      char* out = recv + off * es;
      const bool ownSlot = in == out && me >= 2;
      if (ownSlot) copyBytes(g.slot(set, me), in, len * es);
      for (int q = 0; q < n; ++q) {
        if (q != me) g.waitPieces(q, 1, "reduce (shm) copy-in");
      }
      reduceSlots(a, g, set, 0, out, len, ownSlot ? nullptr : in);
      g.finishChunk();
      continue;
    }
    reduceChunkSliced(a, g, set, in, len, "reduce (shm)");
    if (me == a.root) copyOutSlices(g, set, len, es, recv + off * es);
    g.finishChunk();
  }
  if (eager) g.deferCheck(-1);
}

}  // namespace mtxcomm
