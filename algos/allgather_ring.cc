// allgather / ring: each rank's block travels n-1 hops around the ring.
//
// Accepts: any rank count n >= 2, any sendcount.
// Steps: rank r copies its block into recvbuf[r] (skipped in place) and, at step s = 0..n-2,
//   sends block (r - s) mod n to r+1 and receives block (r - s - 1) mod n from r-1.
// Bytes on the wire per rank: (n-1) * sendcount * elemSize each way in n-1 rounds: bandwidth
//   optimal, best for large messages or rank counts that are not powers of two.
// Example, n = 3: step 0: r0 sends A -> r1, r1 sends B -> r2, r2 sends C -> r0;
//   step 1: r0 sends C -> r1, r1 sends A -> r2, r2 sends B -> r0.
// Source: Thakur, Rabenseifner & Gropp, IJHPCA 2005; Open MPI ompi_coll_base_allgather_intra_ring.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/ring_phases.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildAllgatherRing(const CollArgs& args, int rank, int n, const AlgoParams& params,
                        Schedule& s) {
  const size_t count = args.count, es = args.elemSize;
  char* buf = static_cast<char*>(args.recvbuf);
  s.copy(buf + rank * count * es, args.sendbuf, count * es);
  s.endStep();
  BlockLayout blocks{[count](int b) { return static_cast<size_t>(b) * count; },
                     [count](int) { return count; }};
  appendRingAllgather(s, rank, n, /*rotate=*/0, buf, /*shift=*/0, blocks, es, params.segmentBytes);
}

}  // namespace mtxcomm
