// mtxcomm_bench: latency and bandwidth of one mtxcomm collective over a range of message sizes.
// OSU micro-benchmarks' columns first (Size, Avg/Min/Max latency, Iterations), then nccl-tests'
// algbw, busbw and #wrong, the algorithm mtxcomm chose, and with --vs-mpi the same MPI
// collective measured in the same run. Run under mpirun:
//
//   mpirun -np 4 mtxcomm_bench allreduce -m 4:64M -c --vs-mpi
//
// One driver (this file) and one small descriptor per collective (bench_descriptors.cc), as in
// nccl-tests. What Size means per collective is printed in the header (see the descriptors).
//
// Timing: a barrier before each timed block; each rank averages its call time over the
// iterations with MPI_Wtime; rank 0 prints the mean, min and max of the ranks' averages (OSU).
// Without -c the calls of a block run back to back; with -c every call is checked, so each call
// is timed alone and the refill of inputs, the poisoning of outputs and the check stay outside
// the timing. --vs-mpi warms both libraries up, then alternates blocks of iterations of mtxcomm
// and MPI, so that machine noise hits both alike.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench/bench_data.h"
#include "bench/bench_descriptors.h"
#include "bench/bench_device.h"
#include "bench/bench_floor.h"
#include "bench/bench_options.h"
#include "bench/bench_report.h"
#include "bench/bench_run.h"
#include "bench/bench_sweep.h"
#include "bench/bench_tune.h"
#include "lib/base/dtype.h"
#include "lib/comm/c_api.h"

namespace mtxcomm {
namespace bench {
namespace {

// The world communicator from the environment; a failure aborts the MPI job (only some ranks
// may have failed, the others would wait forever).
mtxcomm_comm_t initCommOrAbort(int worldRank) {
  mtxcomm_comm_t comm = nullptr;
  const mtxcomm_result_t r = mtxcomm_comm_init_from_env(&comm);
  if (r != MTXCOMM_SUCCESS) {
    std::fprintf(stderr, "mtxcomm_bench: rank %d: mtxcomm_comm_init_from_env failed: %s: %s\n",
                 worldRank, mtxcomm_get_error_string(r), mtxcomm_get_last_error(nullptr));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return comm;
}

// Checks the command line against the collective and fills ctx's call parameters; the sizes
// and the unit they are rounded to go to *info and *range. Throws UsageError.
void validate(const Options& opt, int worldSize, BenchContext& ctx, RunInfo& info,
              std::pair<size_t, size_t>& range) {
  const CollDescriptor& desc = *info.desc;
  const bool reduces = info.reduces = collectiveReduces(desc.coll);
  const bool rooted = info.rooted = collectiveRooted(desc.coll);
  const bool hasData = info.hasData = desc.coll != Collective::kBarrier;

  std::vector<std::string> rootedNames;
  std::vector<std::string> reducingNames;
  for (const CollDescriptor& d : descriptors()) {
    if (collectiveRooted(d.coll)) rootedNames.emplace_back(d.name);
    if (collectiveReduces(d.coll)) reducingNames.emplace_back(d.name);
  }
  if (opt.rootGiven && !rooted) {
    throw UsageError("-r " + std::to_string(opt.root) + ": " + desc.name +
                     " has no root (-r applies to " + joined(rootedNames) + ")");
  }
  if (opt.opGiven && !reduces) {
    throw UsageError("-o " + opt.op + ": " + desc.name + " does not reduce (-o applies to " +
                     joined(reducingNames) + ")");
  }

  ctx.dtype = parseDatatypeOrThrow(opt.dtype);
  ctx.op = reduces ? parseOpOrThrow(opt.op) : MTXCOMM_SUM;
  if (ctx.op == MTXCOMM_ADASUM && desc.coll != Collective::kAllreduce) {
    throw UsageError("-o adasum: " + std::string(desc.name) +
                     " does not take op adasum (only allreduce does)");
  }
  if (const char* why = reduces ? opDeclinesDatatype(ctx.op, ctx.dtype) : nullptr) {
    throw UsageError("-o " + opt.op + " -T " + opt.dtype + ": " + why);
  }
  ctx.elemSize = datatypeSize(ctx.dtype);
  ctx.inPlace = opt.inPlace;
  ctx.root = opt.root;
  range = parseSizeRange(opt.sizes);
  const auto [minBytes, maxBytes] = range;
  // Sizes are rounded down to a multiple of unitBytes: some size must hold at least one unit.
  const size_t unitElems = desc.unitElems(worldSize);
  const size_t unitBytes = info.unitBytes = unitElems * ctx.elemSize;
  if (hasData && minBytes > 0 && maxBytes < unitBytes) {
    const std::string dt = datatypeName(ctx.dtype);
    throw UsageError("-m " + opt.sizes + ": no message size in the range holds a whole number of " +
                     dt + " elements" +
                     (unitElems == 1 ? " (" + std::to_string(unitBytes) + " bytes at least)"
                                     : " per rank (" + std::to_string(worldSize) + " ranks x " +
                                           std::to_string(ctx.elemSize) + " bytes = " +
                                           std::to_string(unitBytes) + " bytes at least)"));
  }
  if (!opt.algo.empty()) checkAlgorithm(desc, opt.algo);
  if (opt.device != "host" && opt.device != "cuda") {
    throw UsageError("-d " + opt.device + ": expected host or cuda");
  }
  if (opt.device == "cuda" && opt.vsMpi) {
    throw UsageError("--vs-mpi is unsupported with -d cuda: the MPI baseline runs on host buffers");
  }
  if (opt.vsMpi && hasData) {
    ctx.mpiType = mpiDatatype(ctx.dtype);
    if (ctx.mpiType == MPI_DATATYPE_NULL) {
      throw UsageError(std::string("--vs-mpi is unsupported for ") + datatypeName(ctx.dtype) +
                       ": MPI has no such datatype (use -T float32 or drop --vs-mpi)");
    }
    if (reduces) {
      ctx.mpiOp = mpiOp(ctx.op, ctx.dtype);
      if (ctx.mpiOp == MPI_OP_NULL) {
        throw UsageError(std::string("--vs-mpi is unsupported for -o ") + opName(ctx.op) +
                         ": MPI has no such reduction op");
      }
    }
  }
  if (rooted && (opt.root < 0 || opt.root >= worldSize)) {
    throw UsageError("-r " + std::to_string(opt.root) + ": root must be in [0, " +
                     std::to_string(worldSize) + ")");
  }
}

// The communicator of the run (the algorithm forced through the configuration, which
// init_from_env reads), checked against MPI_COMM_WORLD.
mtxcomm_comm_t initComm(const Options& opt, const CollDescriptor& desc, int worldRank,
                        int worldSize, BenchContext& ctx) {
  const char* algoVar = collectiveAlgoVar(desc.coll);
  if (!opt.algo.empty()) setenv(algoVar, opt.algo.c_str(), 1);
  mtxcomm_comm_t comm = initCommOrAbort(worldRank);
  mtxcomm_comm_rank(comm, &ctx.rank);
  mtxcomm_comm_size(comm, &ctx.nranks);
  if (ctx.rank != worldRank || ctx.nranks != worldSize) {
    std::fprintf(stderr,
                 "mtxcomm_bench: rank %d: the mtxcomm communicator (rank %d of %d) does not match "
                 "MPI_COMM_WORLD (rank %d of %d)\n",
                 worldRank, ctx.rank, ctx.nranks, worldRank, worldSize);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ctx.comm = comm;
  return comm;
}

std::string algorithmText(const Options& opt, const CollDescriptor& desc) {
  const char* algoVar = collectiveAlgoVar(desc.coll);
  const char* algoEnv = std::getenv(algoVar);
  return opt.algo == "auto"  ? std::string("auto (-a auto)")
         : !opt.algo.empty() ? "forced by -a " + opt.algo
         : algoEnv           ? std::string(algoVar) + "=" + algoEnv
                             : std::string("auto");
}

int runBenchmark(const Options& opt, int worldRank, int worldSize) {
  RunInfo info;
  info.desc = findDescriptor(opt.collective);
  const CollDescriptor& desc = *info.desc;
  BenchContext ctx;
  std::pair<size_t, size_t> range;
  validate(opt, worldSize, ctx, info, range);
  const auto [minBytes, maxBytes] = range;
  const bool hasData = info.hasData;
  const size_t unitBytes = info.unitBytes;

  mtxcomm_comm_t comm = initComm(opt, desc, worldRank, worldSize, ctx);
  // Destroyed on every exit, also when every rank throws ReportedFailure together.
  const std::unique_ptr<mtxcomm_comm, decltype(&mtxcomm_comm_destroy)> commGuard(
      comm, &mtxcomm_comm_destroy);
  const TestData data(ctx.dtype, ctx.op, ctx.nranks);
  ctx.data = &data;
  // -d cuda: device buffers on GPU rank % devices, one stream for every call. Every rank
  // learns together whether every rank could set its device up.
  std::unique_ptr<void, decltype(&destroyDeviceStream)> streamGuard(nullptr, &destroyDeviceStream);
  if (opt.device == "cuda" && hasData) {
    int ok = 1, allOk = 0;
    try {
      streamGuard.reset(deviceStream(ctx.rank));
      ctx.stream = streamGuard.get();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mtxcomm_bench: rank %d: %s\n", ctx.rank, e.what());
      ok = 0;
    }
    MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!allOk) throw ReportedFailure("device setup failed");
  }

  info.algoText = algorithmText(opt, desc);
  info.transport = unwrapComm(comm)->transportName();
  Report report(opt, ctx, info);
  report.printHeader();

  unsigned long long totalWrong = 0;
  int sizesRun = 0;
  const std::vector<size_t> sizes =
      hasData ? messageSizes(minBytes, maxBytes) : std::vector<size_t>{0};
  std::unique_ptr<FloorProbe> floor;
  if (opt.floor && hasData) {
    size_t source = 0, recv = 0;
    for (const size_t s : sizes) {
      const size_t b = s / unitBytes * unitBytes;
      source = std::max(source, b);
      for (int r = 0; r < ctx.nranks; ++r) {
        recv = std::max(recv, floorBytes(desc, b, r, ctx.nranks, ctx.root));
      }
    }
    floor = std::make_unique<FloorProbe>(source, recv);
  }
  for (const size_t requested : sizes) {
    const size_t bytes = requested / unitBytes * unitBytes;
    if (bytes == 0 && requested > 0) {
      if (ctx.rank == 0) {
        std::printf("# Size %zu skipped: below one unit of %zu bytes\n", requested, unitBytes);
      }
      continue;
    }
    const Layout layout = desc.layout(ctx, bytes);
    if (opt.vsMpi && layout.count > static_cast<size_t>(INT_MAX)) {
      if (ctx.rank == 0) {
        std::printf("# Size %zu and above skipped: too many elements for MPI's int counts\n",
                    bytes);
      }
      break;
    }
    const int iters = opt.iters > 0 ? opt.iters : defaultIters(bytes);
    const int warmup = opt.warmup >= 0 ? opt.warmup : defaultWarmup(bytes);

    Timing timing;
    timing.iters = iters;
    timing.warmup = warmup;
    timing.check = opt.check;
    timing.vsMpi = opt.vsMpi;
    // --floor: the floor and the collective's best call, over the same number of repetitions.
    const int floorReps = std::max(5, std::min(iters, 500));
    if (floor) timing.bestReps = floorReps;
    Measurement m = measureSize(desc, ctx, layout, timing);
    if (floor) m.floorUs = floor->floorUs(desc, ctx, bytes, floorReps);
    ++sizesRun;
    totalWrong += m.wrong + m.mpiWrong;
    report.addRow(layout, timing, m);
    if (opt.progress && ctx.rank == 0) opt.progress(sizesRun, sizes.size(), m.algorithm);
    // report: a forced algorithm that declines this layout fell back to another; its other
    // sizes would time that other one again (every rank agrees on the algorithm).
    if (opt.quiet && !opt.algo.empty() && opt.algo != "auto" && m.algorithm != opt.algo) break;
  }

  if (sizesRun == 0) {  // every rank got here alike
    throw UsageError("-m " + opt.sizes + ": no message size in the range could be run");
  }
  report.finish(totalWrong);
  return totalWrong == 0 ? 0 : 1;
}

// --tune: measures the cost model's parameters on this job and writes them to opt.op's file.
int runTuneCommand(const Options& opt, int worldRank) {
  const auto [minBytes, maxBytes] = parseSizeRange(opt.sizes);
  mtxcomm_comm_t comm = initCommOrAbort(worldRank);
  const int rc = runTune(comm, opt.op, minBytes, maxBytes);
  mtxcomm_comm_destroy(comm);
  return rc;
}

}  // namespace
}  // namespace bench
}  // namespace mtxcomm

int main(int argc, char** argv) {
  using mtxcomm::bench::Options;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Options opt;
  int rc = mtxcomm::bench::parseCommandLine(argc, argv, rank, opt);
  if (rc >= 0) {
    MPI_Finalize();
    return rc;
  }
  rc = 0;
  try {
    if (opt.collective == "tune") {
      opt.tune = true;
      opt.collective.clear();
    }
    if (opt.collective == "report") {
      if (!opt.opGiven) throw mtxcomm::bench::UsageError("report needs -o DIR");
      opt.outDir = opt.op;
      rc = mtxcomm::bench::runReport(opt, rank, size, [&](const Options& o) {
        return mtxcomm::bench::runBenchmark(o, rank, size);
      });
    } else if (opt.tune) {
      if (!opt.collective.empty()) {
        throw mtxcomm::bench::UsageError("--tune measures its own collectives: drop " +
                                         opt.collective);
      }
      if (!opt.opGiven) opt.op = "mtxcomm_tuning.json";
      if (!opt.sizesGiven) opt.sizes = "8:4M";
      rc = mtxcomm::bench::runTuneCommand(opt, rank);
    } else if (opt.collective.empty()) {
      std::vector<std::string> collectives;
      for (const auto& d : mtxcomm::bench::descriptors()) collectives.emplace_back(d.name);
      throw mtxcomm::bench::UsageError("name a collective (" + mtxcomm::bench::joined(collectives) +
                                       "), or --tune");
    } else {
      rc = mtxcomm::bench::runBenchmark(opt, rank, size);
    }
  } catch (const mtxcomm::bench::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "mtxcomm_bench: %s\n", e.what());
    rc = 2;
  } catch (const mtxcomm::bench::ReportedFailure&) {
    rc = 1;  // the failing ranks printed why; every rank is here
  } catch (const std::bad_alloc&) {
    // Only this rank may be here: abort the job rather than leave other ranks waiting.
    std::fprintf(stderr, "mtxcomm_bench: rank %d: out of memory (std::bad_alloc)\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mtxcomm_bench: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
