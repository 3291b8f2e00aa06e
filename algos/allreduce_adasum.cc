// allreduce / adasum: the adaptive summation (op MTXCOMM_ADASUM) over a recursive-doubling
// tree, the non-power-of-two ranks folded in by the upper ranks first.
//
// Accepts: op MTXCOMM_ADASUM only (and that op goes to no other algorithm: registry.cc,
//   algorithmDeclines), float16, bfloat16, float32 and float64 (checked by the communicator:
//   lib/comm/call_args.cc), any rank count n >= 2, any count.
// The pair (lib/base/reduce.h, adasumBuffers): adasum(a, b) = (1 - a.b/(2|a|^2)) a +
//   (1 - a.b/(2|b|^2)) b over the whole vectors, a coefficient 1 for a zero vector; dot product
//   and norms accumulated in double, the result rounded once to the datatype at each level
//   (16-bit types travel as 16 bits and are widened for the arithmetic only).
// Steps: with q = the largest power of two <= n: (fold) each rank r >= q sends its vector to
//   r - q, which replaces its own v by adasum(v_{r-q}, v_r); (tree) the ranks r < q run log2(q)
//   levels: at distance d = 1, 2, 4, ... swap the current vector with r ^ d, and both replace it
//   by adasum(the lower rank's vector, the higher rank's vector) — the same operands in the
//   same order on both sides, so both get the same bits; (unfold) r - q sends the result back
//   to r >= q. This tree is part of the op's definition (include/mtxcomm/mtxcomm.h): the result
//   of adasum depends on the pairing, so it is never replaced by another pattern.
// Messages are whole vectors, as in recursive_doubling (the dot products need the partner's
//   whole vector before any element of the result is known); every transport takes messages
//   of any size (MPI cuts them into 1 GiB pieces).
// Bytes on the wire per rank: log2(q) * count * elemSize each way, + one vector for the fold on
//   the ranks it involves; log2(q) + 2 rounds. Compute per level: one pass for the dot product
//   and norms, one for the combination.
// Scratch: one vector (the partner's).
// Example, n = 3 (q = 2), v_r on rank r:
//   fold: r2 sends v2 -> r0; r0 holds w0 = adasum(v0, v2); r1 holds v1.
//   level d=1: r0 and r1 swap; both hold adasum(w0, v1).   unfold: r0 sends it to r2.
// Example, n = 4: level d=1: r0, r1 hold adasum(v0, v1) = w01; r2, r3 hold w23. Level d=2: r0
//   and r2 (and r1 and r3) swap; all hold adasum(w01, w23).
// Source: Maleki, Musuvathi, Mytkowicz, Saarikivi, Xu, Eksarevskiy, Ekanayake & Barsoum,
//   "Scaling Distributed Training with Adaptive Summation", MLSys 2021 (the pairwise operator
//   and its recursive application over a binary tree); Horovod's Adasum op (hvd.Adasum) for the
//   same semantics. The exchange pattern is recursive doubling (Thakur, Rabenseifner & Gropp,
//   IJHPCA 2005), with the fold of the upper ranks onto r - q instead of MPICH's pairing of
//   neighbours, so that the tree is the plain binary tree of the ranks.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"
#include "lib/base/dtype.h"
#include "lib/base/error.h"

namespace mtxcomm {

void buildAllreduceAdasum(const CollArgs& args, int rank, int n, const AlgoParams&, Schedule& s) {
  if (args.op != MTXCOMM_ADASUM || s.op() != MTXCOMM_ADASUM) {
    fail(MTXCOMM_INTERNAL_ERROR, "allreduce adasum: asked for op ", opName(args.op),
         " (this algorithm computes op adasum only)");
  }
  if (!isFloatingType(args.dtype)) {
    fail(MTXCOMM_INTERNAL_ERROR, "allreduce adasum: datatype ", datatypeName(args.dtype),
         " reached the algorithm (adasum takes float16, bfloat16, float32, float64)");
  }
  const size_t count = args.count, bytes = count * args.elemSize;
  const char* send = static_cast<const char*>(args.sendbuf);
  char* recv = static_cast<char*>(args.recvbuf);
  const int q = patterns::powerOfTwoFloor(n);
  const int foldPeer = patterns::upperFoldPeer(rank, n);
  char* partner = s.scratch(bytes);

  // Fold: the upper ranks hand their vector down (a = the lower rank's).
  if (rank >= q) {
    s.sendData(foldPeer, send, bytes);
  } else if (foldPeer >= 0) {
    s.recvData(foldPeer, partner, bytes);
    s.adasum(recv, send, partner, count);
  } else {
    s.copy(recv, send, bytes);
  }
  s.endStep();

  // The tree among ranks [0, q): the lower rank's vector is always a.
  if (rank < q) {
    for (int d = 1; d < q; d *= 2) {
      const int peer = rank ^ d;
      s.sendData(peer, recv, bytes);
      s.recvData(peer, partner, bytes);
      if (rank < peer) {
        s.adasum(recv, recv, partner, count);
      } else {
        s.adasum(recv, partner, recv, count);
      }
      s.endStep();
    }
  }

  // Unfold: the result goes back up.
  if (foldPeer >= 0) {
    if (rank >= q) {
      s.recvData(foldPeer, recv, bytes);
    } else {
      s.sendData(foldPeer, recv, bytes);
    }
    s.endStep();
  }
}

}  // namespace mtxcomm
