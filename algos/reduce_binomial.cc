// reduce / binomial: partial results flow up a binomial tree to the root.
//
// Accepts: any rank count n >= 2, any root, any count, every op.
// Steps: with vrank = (rank - root) mod n, at mask = 1, 2, 4, ...: a rank whose vrank has that
//   bit clear receives the partial result of vrank | mask (if it exists) and reduces it after its
//   own (acc = op(acc, child)); a rank with the bit set sends its partial result to
//   vrank & ~mask and stops. The order of operands is fixed by the tree: run-to-run identical.
// Bytes on the wire: every non-root rank sends one vector; a rank receives one per child
//   (the root ceil(log2 n)). ceil(log2 n) rounds: best for small and mid-sized messages.
// Scratch: one vector for the received partial, one for the running result off the root.
// Example, n = 4, root 0: mask 1: r1 -> r0 (x0+x1), r3 -> r2 (x2+x3); mask 2: r2 -> r0.
// Source: MPICH MPIR_Reduce_intra_binomial; Thakur, Rabenseifner & Gropp, IJHPCA 2005.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildReduceBinomial(const CollArgs& args, int rank, int n, const AlgoParams&, Schedule& s) {
  const size_t count = args.count, bytes = count * args.elemSize;
  const int vrank = patterns::mod(rank - args.root, n);
  const void* cur = args.sendbuf;
  char* tmp = nullptr;
  char* acc = vrank == 0 ? static_cast<char*>(args.recvbuf) : nullptr;
  for (int mask = 1; mask < n; mask *= 2) {
    if ((vrank & mask) == 0) {
      const int child = vrank | mask;
      if (child >= n) continue;
      if (!tmp) tmp = s.scratch(bytes);
      if (!acc) acc = s.scratch(bytes);
      s.recvData(patterns::mod(child + args.root, n), tmp, bytes);
      s.reduce(acc, cur, tmp, count);
      s.endStep();
      cur = acc;
    } else {
      s.sendData(patterns::mod((vrank & ~mask) + args.root, n), cur, bytes);
      s.endStep();
      break;
    }
  }
  if (vrank == 0) {
    s.copy(args.recvbuf, cur, bytes);  // only when the root had no child (cannot happen, n >= 2)
    s.endStep();
  }
}

}  // namespace mtxcomm
