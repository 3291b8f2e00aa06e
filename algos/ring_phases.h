// The two phases of ring algorithms, shared by allreduce ring and reduce_scatter ring (and, for
// the allgather phase, by allgather ring and broadcast scatter_allgather).
#ifndef MTXCOMM_ALGOS_RING_PHASES_H_
#define MTXCOMM_ALGOS_RING_PHASES_H_

#include <cstddef>
#include <functional>

#include "algos/schedule.h"

namespace mtxcomm {

// Block b of the n blocks covers elements [offset(b), offset(b) + count(b)).
struct BlockLayout {
  std::function<size_t(int)> offset;
  std::function<size_t(int)> count;
};

// Ring reduce-scatter over n ranks (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms
// for clusters of workstations", JPDC 2009). At step s (0..n-2) rank r sends block
// (r - s + shift) mod n to its right neighbour and receives block (r - s - 1 + shift) mod n from
// its left, reducing it with its own copy: partial = op(received, src[block]). Step 0 sends
// straight from src; step s > 0 sends what step s-1 wrote at accum(s-1, block). After n-1 steps
// rank r holds block (r + 1 + shift) mod n fully reduced at accum(n-2, that block). Each step is
// cut into segments of at most segmentBytes, received into two alternating scratch buffers so
// that the next segment's transfer overlaps this segment's reduction.
// Order of operands is fixed per block (block b is reduced along ranks b+shift+1, b+shift+2, ...),
// so the result is the same run after run.
void appendRingReduceScatter(Schedule& s, int rank, int n, const char* src, int shift,
                             const BlockLayout& blocks,
                             const std::function<char*(int step, int block)>& accum,
                             size_t segmentBytes);

// Ring allgather of blocks already placed in buf, over ranks numbered as vranks: vrank v is
// the real rank (v + rotate) mod n (rotate = root for broadcast, 0 otherwise). Vrank v starts
// owning block (v + shift) mod n; at step s it sends block (v + shift - s) mod n to vrank v+1
// and receives block (v + shift - s - 1) mod n from vrank v-1 into buf. n-1 steps, each cut
// into segments of at most segmentBytes (one schedule step per segment), so that no message is
// larger than a segment: over UCX/TCP every message then stays below the eager limit, and a
// rank runs at most one segment ahead of its neighbour.
void appendRingAllgather(Schedule& s, int vrank, int n, int rotate, char* buf, int shift,
                         const BlockLayout& blocks, size_t elemSize, size_t segmentBytes);

}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_RING_PHASES_H_
