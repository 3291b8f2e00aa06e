// mtxcomm_bench's timing: the buffers of one message size, blocks of timed calls of mtxcomm or
// of the MPI baseline (bench/bench_descriptors.h says what each collective calls), and the
// reduction of the ranks' times to OSU's Avg/Min/Max.
#ifndef MTXCOMM_BENCH_BENCH_RUN_H_
#define MTXCOMM_BENCH_BENCH_RUN_H_

#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>

#include "bench/bench_descriptors.h"

namespace mtxcomm {
namespace bench {

// A failure every rank learned of together (collectively) and the ranks concerned already
// reported on stderr: every rank exits with status 1, cleanly.
struct ReportedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// MPI's datatype and op for ours; MPI_DATATYPE_NULL / MPI_OP_NULL where MPI has none. bool is
// MPI_UINT8_T (MPI's logical ops take any C integer type, and read every nonzero byte as true)
// with SUM/MAX as MPI_LOR and PROD/MIN as MPI_LAND: mtxcomm's bool semantics.
MPI_Datatype mpiDatatype(mtxcomm_datatype_t dt);
MPI_Op mpiOp(mtxcomm_op_t op, mtxcomm_datatype_t dt);

// Mean, min and max over ranks of each rank's average call time (valid on rank 0).
struct Latency {
  double avgUs = 0;
  double minUs = 0;
  double maxUs = 0;
  int slowestRank = 0;
};

// How one message size is timed.
struct Timing {
  int iters = 1;
  int warmup = 0;
  bool check = false;  // every call checked (and timed alone)
  bool vsMpi = false;  // MPI's collective timed in blocks alternating with mtxcomm's
  // > 0: also time bestReps calls one at a time, each after a barrier, and keep the best of the
  // slowest rank's times (Measurement::bestUs): the statistic of the floor (bench_floor.h).
  int bestReps = 0;
};

// One message size, measured (on rank 0: the reduced values; wrong counts summed over ranks).
struct Measurement {
  Latency lat;
  Latency mpiLat;
  // --vs-mpi: the median over the interleaved block pairs of mtxcomm's time / MPI's (each
  // block's time summed over the ranks); -1 when not measured. The latencies above stay
  // averages over every call (OSU); this ratio is what a preempted block cannot skew.
  double ratio = -1;
  unsigned long long wrong = 0;
  unsigned long long mpiWrong = 0;
  std::string algorithm;   // what mtxcomm used for the last call
  double predictedUs = 0;  // the cost model's prediction for it
  double floorUs = -1;     // --floor: the floor's time (bench_floor.h); -1 when not measured
  // Timing::bestReps: the best over calls made one at a time of the slowest rank's time, as
  // the floor is measured (so "best / floor" compares like with like); -1 when not measured.
  double bestUs = -1;
};

// reps times: prepare (untimed), a barrier of comm, then timed; returns the best over reps of
// the slowest rank's seconds in timed (the same on every rank of comm). Collective over comm.
double bestOfSlowest(MPI_Comm comm, int reps, const std::function<void()>& timed,
                     const std::function<void()>& prepare = {});

// Collective over MPI_COMM_WORLD: allocates the buffers of layout (when a rank cannot, every
// rank throws ReportedFailure), warms up, times and checks. A failing call aborts the job.
Measurement measureSize(const CollDescriptor& desc, const BenchContext& ctx, const Layout& layout,
                        const Timing& timing);

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_RUN_H_
