// allgather / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any sendcount.
// Steps: blocks of at most 256 bytes go through the line-tagged exchange
//   (ShmGroup::exchangeLines, NCCL's LL protocol: every rank writes its block into tagged
//   64-byte lines and reads every peer's as their tags arrive; no barrier). Otherwise, per
//   chunk of at most MTXCOMM_SHM_SLOT_BYTES of each rank's block: every rank copies its
//   chunk into its slot; barrier; every rank copies every other rank's chunk out (its own
//   straight from its send buffer, skipped in place).
// Bytes moved per rank: its block once in, all n blocks once out.
// Example, n = 3: r0, r1, r2 write A, B, C into slots 0, 1, 2; barrier; all copy A B C out.
// Source: Open MPI coll/sm-style copy-in/copy-out through shared slots.

#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

void runAllgatherShm(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize, chunk = g.slotBytes() / es;
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  if (a.count * es <= ShmGroup::kLineBytes) {  // tiny: the line-tagged exchange, no barrier
    g.exchangeLines(send, a.count * es, recv, "allgather (shm, lines)");
    return;
  }
  char* own = recv + static_cast<size_t>(me) * a.count * es;
  if (own != send) copyBytes(own, send, a.count * es);
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet(len * es, ShmGroup::kExchangePositions);
    copyBytes(g.slot(set, me), send + off * es, len * es);
    g.barrier("allgather (shm)");
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      copyBytes(recv + (static_cast<size_t>(q) * a.count + off) * es, g.slot(set, q), len * es);
    }
    g.finishChunk();
  }
}

}  // namespace mtxcomm
