// allgather / recursive_doubling: partners at distance 1, 2, 4, ... swap everything they hold.
//
// Accepts: rank counts that are powers of two (declines others: use ring), any sendcount.
// Steps: rank r copies its block into recvbuf[r]; at distance d = 1, 2, ..., n/2 it sends its
//   d blocks starting at r & ~(d-1) to r ^ d and receives the partner's d blocks.
// Bytes on the wire per rank: (n-1) * sendcount * elemSize each way in log2(n) rounds:
//   latency-optimal, best for small messages.
// Example, n = 4: d=1: r0<->r1 swap A,B; r2<->r3 swap C,D. d=2: r0<->r2 swap [A B],[C D].
// Source: Thakur, Rabenseifner & Gropp, IJHPCA 2005; Open MPI
//   ompi_coll_base_allgather_intra_recursivedoubling.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildAllgatherRecursiveDoubling(const CollArgs& args, int rank, int n, const AlgoParams&,
                                     Schedule& s) {
  const size_t bytes = args.count * args.elemSize;
  char* buf = static_cast<char*>(args.recvbuf);
  s.copy(buf + rank * bytes, args.sendbuf, bytes);
  s.endStep();
  for (int d = 1; d < n; d *= 2) {
    const int partner = rank ^ d;
    s.sendData(partner, buf + (rank & ~(d - 1)) * bytes, d * bytes);
    s.recvData(partner, buf + (partner & ~(d - 1)) * bytes, d * bytes);
    s.endStep();
  }
}

}  // namespace mtxcomm
