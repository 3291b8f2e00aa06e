// allreduce / recursive_doubling: pairwise exchange of the whole vector at distances
// 1, 2, 4, ... with the non-power-of-two ranks folded in first.
//
// Accepts: any rank count n >= 2, any count, every op.
// Steps: with p2 = the largest power of two <= n and r = n - p2: (fold) ranks 2i (i < r) send
//   their vector to rank 2i+1, which reduces it; (exchange) the p2 remaining ranks do log2(p2)
//   rounds: at distance d = 1, 2, 4, ... swap the current vector with the partner newrank ^ d and
//   reduce (the lower newrank's operand first, so both partners compute the same bits);
//   (unfold) ranks 2i+1 send the result back to 2i.
// Bytes on the wire per rank: log2(p2) * count * elemSize each way (+ one vector for the fold):
//   latency-optimal (log2(p2) + 2 rounds), bandwidth-poor: best for small messages.
// Scratch: one vector.
// Example, n = 3 (p2 = 2, r = 1), x_r on rank r:
//   fold: r0 sends x0 -> r1, r1 holds x0+x1 (newrank 0); r2 is newrank 1.
//   exchange d=1: r1 and r2 swap; both hold (x0+x1)+x2.   unfold: r1 sends it to r0.
// Source: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
//   MPICH", IJHPCA 2005; Open MPI ompi_coll_base_allreduce_intra_recursivedoubling.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildAllreduceRecursiveDoubling(const CollArgs& args, int rank, int n, const AlgoParams&,
                                     Schedule& s) {
  const size_t count = args.count, bytes = count * args.elemSize;
  const char* send = static_cast<const char*>(args.sendbuf);
  char* recv = static_cast<char*>(args.recvbuf);
  const int p2 = patterns::powerOfTwoFloor(n), extra = n - p2;
  const int newrank = patterns::foldNewRank(rank, n);
  char* tmp = s.scratch(bytes);

  // Fold.
  if (rank < 2 * extra) {
    if (newrank < 0) {
      s.sendData(rank + 1, send, bytes);
    } else {
      s.recvData(rank - 1, tmp, bytes);
      s.reduce(recv, tmp, send, count);
    }
  } else {
    s.copy(recv, send, bytes);
  }
  s.endStep();

  // Exchange among the power-of-two group.
  if (newrank >= 0) {
    for (int d = 1; d < p2; d *= 2) {
      const int partnerNew = newrank ^ d;
      const int partner = patterns::foldOldRank(partnerNew, n);
      s.sendData(partner, recv, bytes);
      s.recvData(partner, tmp, bytes);
      if (partnerNew < newrank) {
        s.reduce(recv, tmp, recv, count);
      } else {
        s.reduce(recv, recv, tmp, count);
      }
      s.endStep();
    }
  }

  // Unfold.
  if (rank < 2 * extra) {
    if (newrank < 0) {
      s.recvData(rank + 1, recv, bytes);
    } else {
      s.sendData(rank - 1, recv, bytes);
    }
    s.endStep();
  }
}

}  // namespace mtxcomm
