// broadcast / shm: through a shared-memory slot, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count.
// Steps, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: the root copies the chunk into its slot
//   16 KiB at a time, publishing each piece as it is written (a counter, no barrier); every
//   other rank waits for each piece and copies it out, so the readers' copy of a chunk runs
//   beside the root's (a 64 KiB broadcast costs about one copy, not two in a row). Slots alternate
//   between two sets: the root waits for the readers only before rewriting a set two chunks later,
//   so it runs ahead and a small broadcast costs the root one copy and one store.
// Bytes moved: the root reads and writes each byte once (out of place: twice, the second copy
//   into its receive buffer made after the chunk is posted, while the readers copy it out),
//   every other rank reads and writes it once — a pipelined two-copy broadcast.
// Messages of at most 4 KiB go through a ring of 16 small slots per rank instead, so the root
//   can run up to 16 broadcasts ahead of the slowest reader (more ranks than cores).
// Before it returns, every rank waits until every other rank has entered the call (not until
//   it has read it) and checks that each names the same root, count and datatype: a broadcast
//   in which the ranks disagree on the root fails on every rank with MTXCOMM_INVALID_USAGE (a
//   reader that checked only its root would return success beside a root that failed: ranks
//   naming roots 0, 1, 1).
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

// Every rank's call checked before this rank returns. A reader of 2 ranks checked its only
// peer, the root, with the root's first post: no second look at a shared line.
void awaitEveryCall(const CollArgs& a, ShmGroup& g) {
  if (g.rank() == a.root || g.size() > 2) g.awaitArrivals("broadcast (shm)");
}

void runBroadcastShm(const CollArgs& a, ShmGroup& g) {
  const int me = g.rank();
  const size_t es = a.elemSize, chunk = g.slotBytes() / es;
  char* recv = static_cast<char*>(a.recvbuf);
  const char* send = static_cast<const char*>(a.sendbuf);
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
    awaitEveryCall(a, g);
    g.finishSmall();
    return;
  }
  const size_t piece = pieceBytes(g.slotBytes(), es);
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t bytes = std::min(chunk, a.count - off) * es;
    const int set = g.nextSet();
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
  awaitEveryCall(a, g);
}

}  // namespace mtxcomm
