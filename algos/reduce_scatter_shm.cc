// reduce_scatter / shm: through shared-memory slots, for ranks that all live on one node.
//
// Accepts: a communicator whose ranks share a segment; any recvcount, every op.
// Steps, per chunk of at most ShmGroup::reductionChunkBytes() / n of each block: every rank
//   copies that chunk of each of its n input blocks into its slot (block q at q * chunk);
//   barrier; rank r reduces block r's chunk from every slot, in rank order, into its receive
//   buffer.
// Bytes moved per rank and element of its result: n reads and writes in (its whole input),
//   n reads and one write out.
// Example, n = 2, blocks [A B]: r0 writes [A0 B0], r1 [A1 B1]; barrier; r0 computes A0+A1,
//   r1 computes B0+B1.
// Source: Open MPI coll/sm-style copy-in, reduce from shared slots.

#include "algos/registry.h"
#include "algos/shm_chunks.h"
#include "lib/base/error.h"

namespace mtxcomm {

void runReduceScatterShm(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize, chunk = g.reductionChunkBytes() / (es * n);
  if (chunk == 0) {
    fail(MTXCOMM_INTERNAL_ERROR, "reduce_scatter (shm): a chunk of ", g.reductionChunkBytes(),
         " bytes is too small for ", n, " ranks");
  }
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const int set = g.nextSet(n * len * es, ShmGroup::kExchangePositions);
    char* mine = g.slot(set, me);
    for (int q = 0; q < n; ++q) {
      copyBytes(mine + q * len * es, send + (static_cast<size_t>(q) * a.count + off) * es,
                len * es);
    }
    g.barrier("reduce_scatter (shm)");
    reduceSlots(a, g, set, me * len * es, recv + off * es, len);
    g.finishChunk();
  }
}

}  // namespace mtxcomm
