// allreduce / rabenseifner: recursive-halving reduce-scatter, then recursive-doubling
// allgather, with the non-power-of-two ranks folded in first.
//
// Accepts: any rank count n >= 2, any count (blocks may be empty when count < p2), every op.
// Steps: with p2 = the largest power of two <= n and r = n - p2: (fold) as in
//   recursive_doubling, ranks 2i (i < r) hand their vector to 2i+1; (reduce-scatter) the vector
//   is cut into p2 blocks; at distance d = p2/2, ..., 2, 1 each rank keeps the half of its
//   current block range that contains its own block, sends the other half to newrank ^ d and
//   reduces the half it receives (lower newrank's operand first); newrank i ends owning block i;
//   (allgather) at d = 1, 2, ..., p2/2 partners swap their owned ranges, doubling them;
//   (unfold) ranks 2i+1 send the result to 2i.
// Bytes on the wire per rank: about 2(p2-1)/p2 * count * elemSize each way (+ the fold), in
//   2 log2(p2) rounds: bandwidth-optimal with logarithmic latency — best for mid-sized and
//   large messages at moderate n.
// Scratch: half a vector.
// Example, n = 4, count = 4, x_r = [a_r, b_r, c_r, d_r]:
//   RS d=2: r0<->r2, r1<->r3: r0 keeps [a,b] = x0+x2 there, r2 keeps [c,d] = x0+x2, ...
//   RS d=1: r0<->r1: r0 keeps a = (a0+a2)+(a1+a3); r1 keeps b; r2 keeps c; r3 keeps d.
//   AG d=1: r0<->r1 swap a and b, r2<->r3 swap c and d; AG d=2: r0<->r2 swap [a,b] and [c,d].
// Source: R. Rabenseifner, "Optimization of Collective Reduction Operations", ICCS 2004;
//   Thakur, Rabenseifner & Gropp, IJHPCA 2005; Open MPI
//   ompi_coll_base_allreduce_intra_redscat_allgather.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildAllreduceRabenseifner(const CollArgs& args, int rank, int n, const AlgoParams&,
                                Schedule& s) {
  const size_t count = args.count, es = args.elemSize;
  const char* send = static_cast<const char*>(args.sendbuf);
  char* recv = static_cast<char*>(args.recvbuf);
  const int p2 = patterns::powerOfTwoFloor(n), extra = n - p2;
  const int newrank = patterns::foldNewRank(rank, n);
  auto off = [&](int b) { return patterns::blockOffset(count, p2, b); };
  // Elements of blocks [lo, hi).
  auto span = [&](int lo, int hi) { return off(hi) - off(lo); };

  const char* cur = send;  // where this rank's running vector lives before it is in recv
  if (rank < 2 * extra) {
    if (newrank < 0) {
      s.sendData(rank + 1, send, count * es);
      s.endStep();
      s.recvData(rank + 1, recv, count * es);
      s.endStep();
      return;
    }
    char* tmp = s.scratch(count * es);
    s.recvData(rank - 1, tmp, count * es);
    s.reduce(recv, tmp, send, count);
    s.endStep();
    cur = recv;
  }

  // Recursive halving reduce-scatter.
  char* tmp = s.scratch(span(0, p2 - p2 / 2) * es + es);
  for (int d = p2 / 2; d >= 1; d /= 2) {
    const int base = newrank & ~(2 * d - 1);
    const int partnerNew = newrank ^ d;
    const int partner = patterns::foldOldRank(partnerNew, n);
    const bool keepLow = (newrank & d) == 0;
    const int keepLo = keepLow ? base : base + d, sendLo = keepLow ? base + d : base;
    const size_t keepOff = off(keepLo), keepLen = span(keepLo, keepLo + d);
    s.sendData(partner, cur + off(sendLo) * es, span(sendLo, sendLo + d) * es);
    s.recvData(partner, tmp, keepLen * es);
    if (partnerNew < newrank) {
      s.reduce(recv + keepOff * es, tmp, cur + keepOff * es, keepLen);
    } else {
      s.reduce(recv + keepOff * es, cur + keepOff * es, tmp, keepLen);
    }
    s.endStep();
    cur = recv;
  }
  if (p2 == 1) s.copy(recv, cur, count * es);  // n == 1 (not reached through the registry)

  // Recursive doubling allgather.
  for (int d = 1; d < p2; d *= 2) {
    const int partnerNew = newrank ^ d;
    const int partner = patterns::foldOldRank(partnerNew, n);
    const int myLo = newrank & ~(d - 1), theirLo = partnerNew & ~(d - 1);
    s.sendData(partner, recv + off(myLo) * es, span(myLo, myLo + d) * es);
    s.recvData(partner, recv + off(theirLo) * es, span(theirLo, theirLo + d) * es);
    s.endStep();
  }

  // Unfold.
  if (rank < 2 * extra) {
    s.sendData(rank - 1, recv, count * es);
    s.endStep();
  }
}

}  // namespace mtxcomm
