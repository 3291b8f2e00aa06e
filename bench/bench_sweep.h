// mtxcomm_bench report -o DIR [-m MIN:MAX]: a cluster bring-up report.
//
// Under mpirun, on the job's layout: every collective x every algorithm that applies ("auto"
// first, then each registered one; a forced algorithm that declines the layout is recorded as
// such after its first size) x the sizes (4 B .. 64 MiB by default), each with --vs-mpi, -c
// and --floor (bench_floor.h), then the tuner (--tune, into DIR/tuning.json; sizes 8 B up to the
// sweep's largest, at least 1 MiB and at most 4 MiB), then a projection of allreduce to 2..1024
// nodes with the tuned parameters. Writes DIR/runs/<collective>.<algo> .json (each run's rows),
// DIR/results.json (everything: machine, layout, runs, tuning, projection; rewritten after every
// run, so an interrupted report keeps what finished), and renders DIR/index.html with its PNG and
// SVG plots through the Python helper mtxcomm.bench_report (matplotlib; `python3 -m
// mtxcomm.bench_report DIR` re-renders; the interpreter is $MTXCOMM_PYTHON, default python3). Rank
// 0 shows a progress line with the ETA on stderr.
#ifndef MTXCOMM_BENCH_BENCH_SWEEP_H_
#define MTXCOMM_BENCH_BENCH_SWEEP_H_

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/bench_options.h"

namespace mtxcomm {
namespace bench {

// runOne runs one benchmark (mtxcomm_bench COLLECTIVE ...) with the options given; it returns
// its exit status. Collective over MPI_COMM_WORLD.
int runReport(const Options& opt, int worldRank, int worldSize,
              const std::function<int(const Options&)>& runOne);

// The projection (rank 0): predicted allreduce seconds of ring, recursive_doubling and
// hierarchical, and the selector's choice, for 1 MiB, 16 MiB and 256 MiB float32 at 2..1024
// nodes of ranksPerNode ranks each, from the cost parameters in tuningPath (the library's
// defaults when it is empty).
// networkMeasured: the job spans nodes, so the file's inter-node level is a network's; otherwise
// (one node: the tuner's inter-node level is the loopback between the node's ranks) the
// library's default inter-node parameters stand for the network, and the result says so.
nlohmann::json projection(const std::string& tuningPath, int ranksPerNode, bool networkMeasured);

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_SWEEP_H_
