// broadcast / scatter_allgather: the root scatters n blocks down a binomial tree, then a ring
// allgather assembles them everywhere (van de Geijn's broadcast).
//
// Accepts: any rank count n >= 2, any root, any count (blocks may be empty when count < n).
// Steps: with vrank = (rank - root) mod n and block b = the b-th of n near-equal blocks,
//   (scatter) a rank receives from its binomial parent the blocks of its subtree
//   [vrank, vrank + lowbit) and sends each child c its subtree's blocks; (allgather) n-1 ring
//   steps over vranks, vrank v starting with block v.
// Bytes on the wire per rank: about count * elemSize * (1 + (n-1)/n) received in
//   log2(n) + n - 1 rounds, instead of log2(n) whole vectors: best for large messages.
// Example, n = 4, root 0, blocks A B C D: scatter: r0 -> r2 [C D], then r0 -> r1 [B],
//   r2 -> r3 [D]; ring allgather: each rank forwards blocks until all hold A B C D.
// Source: Barnett, Gupta, Payne, Shuler, van de Geijn & Watts, "Interprocessor collective
//   communication library (InterCom)", SHPCC 1994; MPICH MPIR_Bcast_intra_scatter_ring_allgather.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/ring_phases.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildBroadcastScatterAllgather(const CollArgs& args, int rank, int n, const AlgoParams& params,
                                    Schedule& s) {
  const size_t count = args.count, es = args.elemSize;
  const int root = args.root;
  const int vrank = patterns::mod(rank - root, n);
  char* buf = static_cast<char*>(args.recvbuf);
  BlockLayout blocks{[count, n](int b) { return patterns::blockOffset(count, n, b); },
                     [count, n](int b) { return patterns::blockCount(count, n, b); }};
  // Elements of blocks [lo, min(hi, n)).
  auto range = [&](int lo, int hi) {
    hi = std::min(hi, n);
    return std::make_pair(blocks.offset(lo), blocks.offset(hi) - blocks.offset(lo));
  };
  const int low = patterns::binomialLowBit(vrank, n);
  if (vrank == 0) {
    s.copy(buf, args.sendbuf, count * es);
  } else {
    auto [o, c] = range(vrank, vrank + low);
    s.recvData(patterns::mod(patterns::binomialParent(vrank) + root, n), buf + o * es, c * es);
  }
  s.endStep();
  for (int m = low / 2; m >= 1; m /= 2) {
    if (vrank + m < n) {
      auto [o, c] = range(vrank + m, vrank + 2 * m);
      s.sendData(patterns::mod(vrank + m + root, n), buf + o * es, c * es);
    }
  }
  s.endStep();
  appendRingAllgather(s, vrank, n, /*rotate=*/root, buf, /*shift=*/0, blocks, es,
                      params.segmentBytes);
}

}  // namespace mtxcomm
