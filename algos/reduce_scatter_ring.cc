// reduce_scatter / ring: the reduce-scatter phase of ring allreduce, with rank r ending on
// block r.
//
// Accepts: any rank count n >= 2, any recvcount, every op.
// Steps: n-1 steps; at step s rank r sends block (r - s - 1) mod n (its running partial sum,
//   or its own input at step 0) to r+1 and receives block (r - s - 2) mod n from r-1, reducing
//   it with its own input block: partial = op(received, own). Steps are cut into segments of
//   MTXCOMM_SEGMENT_BYTES, the next transfer overlapping the current reduction.
// Bytes on the wire per rank: (n-1) * recvcount * elemSize each way: bandwidth optimal.
// Scratch: two blocks (the running partial sums) and two segments.
// Example, n = 3, blocks A B C: step 0: r0 sends C0 -> r1, r1 sends A1 -> r2, r2 sends B2 -> r0;
//   step 1: r0 sends B2+B0 -> r1 (B done on r1), r1 sends C0+C1 -> r2 (C done on r2),
//   r2 sends A1+A2 -> r0 (A done on r0).
// Source: Patarasuk & Yuan, JPDC 2009; NCCL's ring reduce-scatter.
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/ring_phases.h"
#include "algos/schedule.h"

namespace mtxcomm {

void buildReduceScatterRing(const CollArgs& args, int rank, int n, const AlgoParams& params,
                            Schedule& s) {
  const size_t count = args.count, es = args.elemSize;
  BlockLayout blocks{[count](int b) { return static_cast<size_t>(b) * count; },
                     [count](int) { return count; }};
  char* recv = static_cast<char*>(args.recvbuf);
  char* acc[2] = {nullptr, nullptr};
  if (n > 2 && count > 0) {
    acc[0] = s.scratch(count * es);
    acc[1] = s.scratch(count * es);
  }
  appendRingReduceScatter(
      s, rank, n, static_cast<const char*>(args.sendbuf), /*shift=*/-1, blocks,
      [&](int step, int) { return step == n - 2 ? recv : acc[step % 2]; }, params.segmentBytes);
}

}  // namespace mtxcomm
