// broadcast / shm: through a shared-memory slot, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any root, any count.
// Steps, per chunk of at most MTXCOMM_SHM_SLOT_BYTES: the root copies the chunk into its slot
//   and publishes it (a counter, no barrier); every other rank waits for that counter and copies
//   the chunk out. Slots alternate between two sets: the root waits for the readers only before
//   rewriting a set two chunks later, so it runs ahead and a small broadcast costs the root one
//   copy and one store.
// Bytes moved: the root reads and writes each byte once, every other rank reads and writes it
//   once — a pipelined two-copy broadcast.
// Messages of at most 4 KiB go through a ring of 16 small slots per rank instead, so the root
//   can run up to 16 broadcasts ahead of the slowest reader (more ranks than cores).
// Before it returns, the root waits until every rank has entered the call (not until it has
//   read it) and checks that each names the same root, count and datatype: a broadcast in which
//   the ranks disagree on the root fails on every rank with MTXCOMM_INVALID_USAGE.
// Example, n = 3, root 2: r2 writes the chunk into slot 2 and posts; r0 and r1 see the post and
//   copy slot 2 out.
// Source: Open MPI coll/sm broadcast (root writes shared segments, the others read them).

#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

void runBroadcastShm(const CollArgs& a, ShmGroup& g) {
  const int me = g.rank();
  const size_t es = a.elemSize, chunk = g.slotBytes() / es;
  char* recv = static_cast<char*>(a.recvbuf);
  const char* send = static_cast<const char*>(a.sendbuf);
  if (me == a.root && send != recv) copyBytes(recv, send, a.count * es);
  if (a.count * es <= ShmGroup::kSmallBytes) {
    // Small: through the ring of small slots, so the root can run ahead of slow readers.
    char* mine = g.beginSmall(/*writer=*/me == a.root);
    if (me == a.root) {
      copyBytes(mine, recv, a.count * es);
      g.postSmall();
      g.awaitArrivals("broadcast (shm)");
    } else {
      g.waitSmall(a.root, "broadcast (shm)");
      copyBytes(recv, g.smallSlot(a.root), a.count * es);
    }
    g.finishSmall();
    return;
  }
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet();
    if (me == a.root) {
      copyBytes(g.slot(set, me), recv + off * es, len * es);
      g.post();
    } else {
      g.waitPosted(a.root, "broadcast (shm)");
      copyBytes(recv + off * es, g.slot(set, a.root), len * es);
    }
    g.finishChunk();
  }
  if (me == a.root) g.awaitArrivals("broadcast (shm)");
}

}  // namespace mtxcomm
