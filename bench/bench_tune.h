// mtxcomm_bench --tune: measures the cost model's alpha, beta and gamma per level on the running
// job and writes the file MTXCOMM_TUNING_FILE loads (lib/comm/cost_model.h).
//
// Intra-node: broadcasts and allreduces of 8 B .. 4 MiB over the shm segment of the node-local
// sub-communicator of rank 0's node, while the other nodes wait (skipped when rank 0's node
// holds one rank).
// Inter-node: binomial broadcasts (one message per round: a ping-pong's one-way time) and
// recursive-doubling allreduces over the cross-node sub-communicator of the node leaders; on a
// single node (no network to measure) the same over the point-to-point transport between the
// node's ranks, reported as such. Each point is the median over blocks of iterations of the
// slowest rank's time per call. The fit is a least-squares fit of the cost model's own
// formula for each measured algorithm (linear in alpha and beta), weighted by 1/time, with
// alpha, beta >= 0. On the shared segment every point is fitted at once; across nodes beta is
// fitted on the points of 512 KiB and more, then alpha on the smaller ones with that beta
// (small messages on a shaped or busy link follow no alpha-beta line, and fitted together they
// pulled beta far from the link's). Gamma is not fitted (the reduction term is
// too small a part of each point to be told apart from beta): it is the library's float32 sum
// on this CPU, timed on 1 MiB buffers in cache, the same on both levels.
#ifndef MTXCOMM_BENCH_BENCH_TUNE_H_
#define MTXCOMM_BENCH_BENCH_TUNE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace bench {

// Collective over comm's ranks. Rank 0 prints each level's points (measured and fitted) and
// writes the tuning file to outPath. Returns 0, or 1 when the file cannot be written.
int runTune(mtxcomm_comm_t comm, const std::string& outPath, size_t minBytes, size_t maxBytes);

// The least-squares solution x >= 0 of rows * x ~= y (rows: k columns), each row weighted by
// 1/y: an unknown that would be negative is held at zero and the rest fitted again.
std::vector<double> fitLeastSquares(const std::vector<std::vector<double>>& rows,
                                    const std::vector<double>& y);

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_TUNE_H_
