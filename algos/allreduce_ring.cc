// allreduce / ring: ring reduce-scatter followed by ring allgather.
//
// Accepts: any rank count n >= 2, any count (blocks may be empty when count < n), every op.
// Steps: n-1 reduce-scatter steps (each cut into segments of MTXCOMM_SEGMENT_BYTES, the next
//   segment's transfer overlapping the current one's reduction), then n-1 allgather steps (cut
//   into segments too, so that no message is larger than a segment).
// Bytes on the wire per rank: sent 2(n-1)/n * count * elemSize, received the same — the
//   bandwidth optimum. Latency: 2(n-1) message rounds (more with segments): best for large
//   messages.
// Scratch: two segments.
// Example, n = 3, count = 3, rank r holds x_r = [a_r, b_r, c_r] (blocks of one element):
//   RS step 0: r0 sends a0 -> r1, r1 sends b1 -> r2, r2 sends c2 -> r0;
//              r1: a = a0+a1, r2: b = b1+b2, r0: c = c2+c0
//   RS step 1: r0 sends c -> r1 (c = c2+c0+c1 on r1), r1 sends a -> r2 (a0+a1+a2 on r2),
//              r2 sends b -> r0 (b1+b2+b0 on r0). Now r0 owns b, r1 owns c, r2 owns a.
//   AG steps 0, 1: the owned blocks travel around the ring: every rank ends with [a, b, c].
// Source: Patarasuk & Yuan, JPDC 2009; Gloo allreduce_ring; Open MPI coll_base_allreduce.c
//   (ompi_coll_base_allreduce_intra_ring).
#include "algos/patterns.h"
#include "algos/registry.h"
#include "algos/ring_phases.h"
#include "algos/schedule.h"

namespace mtxcomm {

namespace {
// The segments of one ring step that sends sendCount and receives recvCount elements, at most
// segElems each: fn(j, nseg, first, sendSeg, recvSeg) for segment j of nseg, starting at element
// first (a side with fewer elements has empty trailing segments).
template <typename Fn>
void forEachSegment(size_t sendCount, size_t recvCount, size_t segElems, Fn&& fn) {
  const size_t nseg = (std::max(sendCount, recvCount) + segElems - 1) / segElems;
  for (size_t j = 0; j < nseg; ++j) {
    const size_t first = j * segElems;
    fn(j, nseg, first, first < sendCount ? std::min(segElems, sendCount - first) : 0,
       first < recvCount ? std::min(segElems, recvCount - first) : 0);
  }
}
}  // namespace

void appendRingReduceScatter(Schedule& s, int rank, int n, const char* src, int shift,
                             const BlockLayout& blocks, const std::function<char*(int, int)>& accum,
                             size_t segmentBytes) {
  using patterns::mod;
  const size_t es = s.elemSize();
  size_t segElems = segmentBytes / es;
  if (segElems == 0) segElems = 1;
  size_t maxBlock = 0;
  for (int b = 0; b < n; ++b) maxBlock = std::max(maxBlock, blocks.count(b));
  size_t tmpElems = std::min(segElems, maxBlock);
  if (tmpElems == 0) return;  // every block empty: nothing to do
  char* tmp[2] = {s.scratch(tmpElems * es), s.scratch(tmpElems * es)};
  int parity = 0;
  const int right = patterns::ringRight(rank, n), left = patterns::ringLeft(rank, n);
  for (int step = 0; step < n - 1; ++step) {
    const int sendBlk = mod(rank - step + shift, n);
    const int recvBlk = mod(rank - step - 1 + shift, n);
    const size_t sendCount = blocks.count(sendBlk), recvCount = blocks.count(recvBlk);
    const char* sendBase = step == 0 ? src + blocks.offset(sendBlk) * es : accum(step - 1, sendBlk);
    char* dstBase = accum(step, recvBlk);
    const char* own = src + blocks.offset(recvBlk) * es;
    forEachSegment(sendCount, recvCount, segElems,
                   [&](size_t j, size_t nseg, size_t first, size_t sendSeg, size_t recvSeg) {
                     s.sendData(right, sendBase + first * es, sendSeg * es);
                     s.recvData(left, tmp[parity], recvSeg * es);
                     s.reduce(dstBase + first * es, tmp[parity], own + first * es, recvSeg);
                     // The next segment may be in flight while this one is reduced unless it is the
                     // first segment of the next step and this step had a single segment (it then
                     // sends what this reduction writes), or this is the last reduction (whatever
                     // follows may read it).
                     const bool last = step == n - 2 && j + 1 == nseg;
                     s.endStep(/*overlapNext=*/!last && (j + 1 < nseg || nseg >= 2));
                     parity ^= 1;
                   });
  }
}

void appendRingAllgather(Schedule& s, int vrank, int n, int rotate, char* buf, int shift,
                         const BlockLayout& blocks, size_t elemSize, size_t segmentBytes) {
  using patterns::mod;
  const int right = mod(vrank + 1 + rotate, n), left = mod(vrank - 1 + rotate, n);
  const size_t segElems = std::max<size_t>(segmentBytes / elemSize, 1);
  for (int step = 0; step < n - 1; ++step) {
    const int sendBlk = mod(vrank + shift - step, n);
    const int recvBlk = mod(vrank + shift - step - 1, n);
    const size_t sendCount = blocks.count(sendBlk), recvCount = blocks.count(recvBlk);
    char* sendBase = buf + blocks.offset(sendBlk) * elemSize;
    char* recvBase = buf + blocks.offset(recvBlk) * elemSize;
    forEachSegment(sendCount, recvCount, segElems,
                   [&](size_t, size_t, size_t first, size_t sendSeg, size_t recvSeg) {
                     s.sendData(right, sendBase + first * elemSize, sendSeg * elemSize);
                     s.recvData(left, recvBase + first * elemSize, recvSeg * elemSize);
                     s.endStep();
                   });
  }
}

void buildAllreduceRing(const CollArgs& args, int rank, int n, const AlgoParams& params,
                        Schedule& s) {
  const size_t count = args.count, es = args.elemSize;
  BlockLayout blocks{[count, n](int b) { return patterns::blockOffset(count, n, b); },
                     [count, n](int b) { return patterns::blockCount(count, n, b); }};
  char* recv = static_cast<char*>(args.recvbuf);
  appendRingReduceScatter(
      s, rank, n, static_cast<const char*>(args.sendbuf), /*shift=*/0, blocks,
      [&](int, int block) { return recv + blocks.offset(block) * es; }, params.segmentBytes);
  appendRingAllgather(s, rank, n, /*rotate=*/0, recv, /*shift=*/1, blocks, es, params.segmentBytes);
}

}  // namespace mtxcomm
