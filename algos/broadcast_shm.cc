// broadcast / shm: through a shared-memory slot, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count.
// Steps, per chunk (MTXCOMM_SHM_SLOT_BYTES, or a quarter of it when the message is larger than
//   one slot: chunkBytes): the root copies the chunk into its slot
//   16 KiB at a time, publishing each piece as it is written (a counter, no barrier); every
//   other rank waits for each piece and copies it out, so the readers' copy of a chunk runs
//   beside the root's (a 64 KiB broadcast costs about one copy, not two in a row). Slots alternate
//   between two sets: the root waits for the readers only before rewriting a set two chunks later,
//   so it runs ahead and a small broadcast costs the root one copy and one store.
// Bytes moved: the root reads and writes each byte once (out of place: twice, the second copy
//   into its receive buffer made after the chunk is posted, while the readers copy it out),
//   every other rank reads and writes it once — a pipelined two-copy broadcast.
// Messages of at most 4 KiB go through a ring of 16 small slots per rank instead, so the root
//   can run up to 16 broadcasts ahead of the slowest reader (more ranks than cores); those of
//   at most 256 bytes through the root's ring of 16 line boxes (ShmGroup::broadcastLines: the
//   data in 64-byte lines that each carry the message's number, the call's signature in the
//   first — a reader's one cross-core transfer per line, where a slot costs a counter, the
//   call and the data).
// No rank waits for every other to have entered the call (Open MPI's and NCCL's broadcasts do
//   not check at all): a reader compares its root's call with the root's first post and fails
//   at once when they differ; the root, and a reader's other peers, are compared later
//   (ShmGroup::deferCheck) — a disagreement fails the ranks that waited on a disagreeing peer
//   in this call and the others at their next call that is not a broadcast, or within
//   ShmGroup::kMaxDeferred broadcasts, before that call moves a byte.
// Example, n = 3, root 2: r2 writes the chunk into slot 2 and posts; r0 and r1 see the post and
//   copy slot 2 out.
// Source: Open MPI coll/sm broadcast (root writes shared segments, the others read them).

#include <algorithm>
#include <cstddef>

#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

// Bytes per published piece of a chunk: kPieceBytes (a piece and its copy stay in the L1 data
// cache of any x86-64 or Arm server core), more when the slot would have more than
// ShmGroup::kMaxPieces pieces; a multiple of the element size.
constexpr size_t kPieceBytes = 16 << 10;
size_t pieceBytes(size_t slotBytes, size_t es) {
  const size_t maxPieces = static_cast<size_t>(ShmGroup::kMaxPieces);
  const size_t bytes = std::max(kPieceBytes, (slotBytes + maxPieces - 1) / maxPieces);
  return std::max(es, bytes / es * es);
}

// Bytes per chunk: the whole slot for a message that fits in one; for a larger one a quarter
// of it (at least kPieceBytes, at most the slot), so that the root's two sets in flight stay in its
// L2 cache beside the source it streams (the slot is sized from the L2). Whole 1 MiB slots cost
// 1.21-1.34x the two-copy floor at 2-32 MiB on a Xeon with 2 MiB of L2 per core, quarter
// slots 1.01-1.09x (bench/RESULTS.md).
size_t chunkBytes(size_t slotBytes, size_t bytes) {
  return bytes <= slotBytes ? slotBytes : std::min(slotBytes, std::max(kPieceBytes, slotBytes / 4));
}

// The peers' calls are checked later (ShmGroup::deferCheck): a reader has compared its root's
// call with the root's first post, the other peers' are compared at a later call.
void deferCheck(const CollArgs& a, ShmGroup& g) { g.deferCheck(g.rank() == a.root ? -1 : a.root); }

void runBroadcastShm(const CollArgs& a, ShmGroup& g) {
  const int me = g.rank();
  const size_t es = a.elemSize, chunk = chunkBytes(g.slotBytes(), a.count * es) / es;
  char* recv = static_cast<char*>(a.recvbuf);
  const char* send = static_cast<const char*>(a.sendbuf);
  if (a.count * es <= ShmGroup::kLineBytes) {
    // Tiny: through the root's tagged lines, one cross-core transfer per 64 bytes.
    if (me == a.root && send != recv) copyBytes(recv, send, a.count * es);
    g.broadcastLines(a.root, recv, a.count * es, "broadcast (shm, lines)");
    deferCheck(a, g);
    return;
  }
  if (a.count * es <= ShmGroup::kSmallBytes) {
    // Small: through the ring of small slots, so the root can run ahead of slow readers.
    char* mine = g.beginSmall(/*writer=*/me == a.root);
    if (me == a.root) {
      if (send != recv) copyBytes(recv, send, a.count * es);
      copyBytes(mine, recv, a.count * es);
      g.postSmall();
    } else {
      g.waitSmall(a.root, "broadcast (shm)");
      copyBytes(recv, g.smallSlot(a.root), a.count * es);
    }
    g.finishSmall();
    deferCheck(a, g);
    return;
  }
  const size_t piece = pieceBytes(g.slotBytes(), es);
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t bytes = std::min(chunk, a.count - off) * es;
    const int set = g.nextSet(bytes);
    const char* from = me == a.root ? send + off * es : g.slot(set, a.root);
    char* to = me == a.root ? g.slot(set, me) : recv + off * es;
    int pieces = 0;
    for (size_t at = 0; at < bytes; at += piece) {
      ++pieces;
      if (me != a.root) g.waitPieces(a.root, pieces, "broadcast (shm)");
      copyBytes(to + at, from + at, std::min(piece, bytes - at));
      if (me == a.root) g.postPieces(pieces);
    }
    // Out of place, the root's own copy after the chunk is posted: the readers copy it out
    // meanwhile.
    if (me == a.root && send != recv) copyBytes(recv + off * es, from, bytes);
    g.finishChunk();
  }
  deferCheck(a, g);
}

}  // namespace mtxcomm
