// broadcast / binomial: the root's vector travels down a binomial tree.
//
// Accepts: any rank count n >= 2, any root, any count.
// Steps: with vrank = (rank - root) mod n, a rank receives the whole vector from its parent
//   (vrank with its lowest set bit cleared), then sends it to its children vrank + m for the
//   powers of two m below its lowest set bit (the root: all m < n), largest subtree first.
// Bytes on the wire: the root sends ceil(log2 n) vectors; every other rank receives one.
//   ceil(log2 n) rounds: latency-optimal, best for small messages.
// Example, n = 4, root 0: round 1: r0 -> r2; round 2: r0 -> r1, r2 -> r3.
// Source: MPICH MPIR_Bcast_intra_binomial; Thakur, Rabenseifner & Gropp, IJHPCA 2005.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildBroadcastBinomial(const CollArgs& args, int rank, int n, const AlgoParams&, Schedule& s) {
  const size_t bytes = args.count * args.elemSize;
  const int vrank = patterns::mod(rank - args.root, n);
  const char* data;
  if (vrank == 0) {
    data = static_cast<const char*>(args.sendbuf);
    s.copy(args.recvbuf, data, bytes);  // out of place: the root's own copy
  } else {
    s.recvData(patterns::mod(patterns::binomialParent(vrank) + args.root, n), args.recvbuf, bytes);
    data = static_cast<const char*>(args.recvbuf);
  }
  s.endStep();
  for (int m = patterns::binomialLowBit(vrank, n) / 2; m >= 1; m /= 2) {
    if (vrank + m < n) s.sendData(patterns::mod(vrank + m + args.root, n), data, bytes);
  }
  s.endStep();
}

}  // namespace mtxcomm
