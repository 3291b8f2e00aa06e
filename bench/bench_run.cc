#include "bench/bench_run.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <vector>

#include "bench/bench_device.h"
#include "lib/base/dtype.h"
#include "lib/comm/c_api.h"

namespace mtxcomm {
namespace bench {

namespace {

constexpr int kBlocksVsMpi = 10;  // --vs-mpi: each library's iterations run in about this many
                                  // blocks, alternating

class SizeRun {
 public:
  // Collective: allocates the buffers, and when any rank cannot, that rank reports it and every
  // rank throws ReportedFailure (no rank is left waiting in a collective).
  SizeRun(const CollDescriptor& desc, const BenchContext& ctx, const Layout& layout, bool check)
      : desc_(desc), ctx_(ctx), layout_(layout), check_(check) {
    const size_t sendBytes = layout.sendElems * ctx.elemSize;
    const size_t recvBytes = layout.recvElems * ctx.elemSize;
    int ok = 1;
    try {
      bufs_.send.resize(sendBytes);
      bufs_.recv.resize(recvBytes);
    } catch (const std::bad_alloc&) {
      ok = 0;
    } catch (const std::length_error&) {
      ok = 0;
    }
    if (!ok) {
      bufs_ = Buffers{};  // give back what was allocated
      std::fprintf(stderr,
                   "mtxcomm_bench: rank %d: cannot allocate %zu bytes for %zu-byte buffers\n",
                   ctx.rank, sendBytes + recvBytes, layout.bytes);
    }
    int allOk = 0;
    MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!allOk) throw ReportedFailure("buffer allocation failed");
    desc_.fillInput(ctx_, layout_, bufs_);
    if (ctx_.stream) {
      if (!bufs_.send.empty()) bufs_.dsend = static_cast<unsigned char*>(deviceAlloc(sendBytes));
      bufs_.drecv = static_cast<unsigned char*>(deviceAlloc(recvBytes));
      toDevice();
    }
  }
  ~SizeRun() {
    if (bufs_.dsend) deviceFree(bufs_.dsend);
    if (bufs_.drecv) deviceFree(bufs_.drecv);
  }
  SizeRun(const SizeRun&) = delete;
  SizeRun& operator=(const SizeRun&) = delete;

  // Runs iters calls of one library after a barrier. Returns the seconds this rank spent in the
  // calls; with check, adds the wrong elements of every call to *wrong.
  double block(bool mpi, int iters, unsigned long long* wrong) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (!check_) {
      const double t0 = MPI_Wtime();
      for (int k = 0; k < iters; ++k) call(mpi);
      if (ctx_.stream) streamSync(ctx_.stream);  // device calls return before they finish
      return MPI_Wtime() - t0;
    }
    double seconds = 0;
    for (int k = 0; k < iters; ++k) {
      // Poison the outputs so that a call that writes nothing is caught; restore the inputs an
      // in-place call overwrote.
      std::memset(bufs_.recv.data(), 0xA5, bufs_.recv.size());
      if (ctx_.inPlace) desc_.fillInput(ctx_, layout_, bufs_);
      if (ctx_.stream) toDevice();
      const double t0 = MPI_Wtime();
      call(mpi);
      if (ctx_.stream) streamSync(ctx_.stream);
      seconds += MPI_Wtime() - t0;
      if (ctx_.stream) toHost();
      *wrong += desc_.countWrong(ctx_, layout_, bufs_, mpi);
    }
    return seconds;
  }

  // The best over reps calls, each started together after a barrier, of the slowest rank's
  // seconds (valid on every rank). Not checked: the timed calls already were, with check.
  double bestCall(int reps) {
    return bestOfSlowest(
        MPI_COMM_WORLD, reps,
        [this] {
          call(false);
          if (ctx_.stream) streamSync(ctx_.stream);
        },
        [this] {
          if (ctx_.inPlace) desc_.fillInput(ctx_, layout_, bufs_);
          if (ctx_.stream) toDevice();
        });
  }

 private:
  // -d cuda: the host buffers' contents to their device copies and back.
  void toDevice() {
    if (bufs_.dsend) copyToDevice(bufs_.dsend, bufs_.send.data(), bufs_.send.size());
    copyToDevice(bufs_.drecv, bufs_.recv.data(), bufs_.recv.size());
  }
  void toHost() {
    if (bufs_.dsend) copyToHost(bufs_.send.data(), bufs_.dsend, bufs_.send.size());
    copyToHost(bufs_.recv.data(), bufs_.drecv, bufs_.recv.size());
  }

  void call(bool mpi) {
    if (mpi) {
      const int rc = desc_.runMpi(ctx_, layout_, bufs_);
      if (rc != MPI_SUCCESS) {
        std::fprintf(stderr, "mtxcomm_bench: rank %d: %s failed with MPI error %d\n", ctx_.rank,
                     desc_.mpiName, rc);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      return;
    }
    const mtxcomm_result_t r = desc_.runMtxcomm(ctx_, layout_, bufs_);
    if (r != MTXCOMM_SUCCESS) {
      std::fprintf(stderr, "mtxcomm_bench: rank %d: mtxcomm %s (%zu bytes) failed: %s: %s\n",
                   ctx_.rank, desc_.name, layout_.bytes, mtxcomm_get_error_string(r),
                   mtxcomm_get_last_error(ctx_.comm));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  const CollDescriptor& desc_;
  const BenchContext& ctx_;
  Layout layout_;
  Buffers bufs_;
  bool check_;
};

Latency reduceLatency(double seconds, int iters, int nranks) {
  const double perCall = iters > 0 ? seconds / iters * 1e6 : 0;
  Latency l;
  double sum = 0;
  MPI_Reduce(&perCall, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&perCall, &l.minUs, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
  struct {
    double value;
    int rank;
  } mine{perCall, 0}, slowest{0, 0};
  MPI_Comm_rank(MPI_COMM_WORLD, &mine.rank);
  MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, 0, MPI_COMM_WORLD);
  l.avgUs = sum / nranks;
  l.maxUs = slowest.value;
  l.slowestRank = slowest.rank;
  return l;
}

// The median over the block pairs of (mtxcomm's seconds / MPI's), each summed over the ranks
// (valid on rank 0; every rank has the same number of pairs). Each pair ran back to back under
// the same conditions, so a preemption of one block moves one pair, not the ratio.
double medianPairRatio(const std::vector<double>& pairs) {
  std::vector<double> summed(pairs.size());
  MPI_Reduce(pairs.data(), summed.data(), static_cast<int>(pairs.size()), MPI_DOUBLE, MPI_SUM, 0,
             MPI_COMM_WORLD);
  std::vector<double> ratios;
  for (size_t i = 0; i + 1 < summed.size(); i += 2) {
    if (summed[i + 1] > 0) ratios.push_back(summed[i] / summed[i + 1]);
  }
  if (ratios.empty()) return -1;
  std::sort(ratios.begin(), ratios.end());
  const size_t h = ratios.size() / 2;
  return ratios.size() % 2 ? ratios[h] : (ratios[h - 1] + ratios[h]) / 2;
}

unsigned long long sumOverRanks(unsigned long long v) {
  unsigned long long total = 0;
  MPI_Reduce(&v, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  return total;
}

}  // namespace

double bestOfSlowest(MPI_Comm comm, int reps, const std::function<void()>& timed,
                     const std::function<void()>& prepare) {
  double best = std::numeric_limits<double>::infinity();
  for (int k = 0; k < reps; ++k) {
    if (prepare) prepare();
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    timed();
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    best = std::min(best, slowest);
  }
  return best;
}

MPI_Datatype mpiDatatype(mtxcomm_datatype_t dt) {
  switch (dt) {
    case MTXCOMM_INT8:
      return MPI_INT8_T;
    case MTXCOMM_UINT8:
      return MPI_UINT8_T;
    case MTXCOMM_INT32:
      return MPI_INT32_T;
    case MTXCOMM_UINT32:
      return MPI_UINT32_T;
    case MTXCOMM_INT64:
      return MPI_INT64_T;
    case MTXCOMM_UINT64:
      return MPI_UINT64_T;
    case MTXCOMM_FLOAT32:
      return MPI_FLOAT;
    case MTXCOMM_FLOAT64:
      return MPI_DOUBLE;
    case MTXCOMM_INT16:
      return MPI_INT16_T;
    case MTXCOMM_UINT16:
      return MPI_UINT16_T;
    case MTXCOMM_BOOL:
      return MPI_UINT8_T;  // with MPI_LOR/MPI_LAND (mpiOp)
    default:
      return MPI_DATATYPE_NULL;  // float16, bfloat16: MPI has no such type
  }
}

MPI_Op mpiOp(mtxcomm_op_t op, mtxcomm_datatype_t dt) {
  if (isBoolType(dt)) {
    switch (op) {
      case MTXCOMM_SUM:
      case MTXCOMM_MAX:
        return MPI_LOR;
      case MTXCOMM_PROD:
      case MTXCOMM_MIN:
        return MPI_LAND;
      default:
        return MPI_OP_NULL;  // avg: not defined on bool
    }
  }
  switch (op) {
    case MTXCOMM_SUM:
      return MPI_SUM;
    case MTXCOMM_PROD:
      return MPI_PROD;
    case MTXCOMM_MIN:
      return MPI_MIN;
    case MTXCOMM_MAX:
      return MPI_MAX;
    default:
      return MPI_OP_NULL;  // avg, adasum
  }
}

Measurement measureSize(const CollDescriptor& desc, const BenchContext& ctx, const Layout& layout,
                        const Timing& timing) {
  Measurement m;
  SizeRun run(desc, ctx, layout, timing.check);
  const int iters = timing.iters;
  run.block(false, timing.warmup, &m.wrong);
  if (timing.vsMpi) run.block(true, timing.warmup, &m.mpiWrong);
  double seconds = 0;
  double mpiSeconds = 0;
  if (timing.vsMpi) {
    const int blockLen = std::max(1, iters / kBlocksVsMpi);
    std::vector<double> pairs;  // per block pair: this rank's mtxcomm and MPI seconds
    for (int done = 0; done < iters; done += blockLen) {
      const int k = std::min(blockLen, iters - done);
      const double ours = run.block(false, k, &m.wrong);
      const double theirs = run.block(true, k, &m.mpiWrong);
      seconds += ours;
      mpiSeconds += theirs;
      pairs.push_back(ours);
      pairs.push_back(theirs);
    }
    m.ratio = medianPairRatio(pairs);
  } else {
    seconds = run.block(false, iters, &m.wrong);
  }
  m.algorithm = unwrapComm(ctx.comm)->lastAlgorithm();
  m.predictedUs = unwrapComm(ctx.comm)->lastPredictedSeconds() * 1e6;
  m.lat = reduceLatency(seconds, iters, ctx.nranks);
  if (timing.bestReps > 0) m.bestUs = run.bestCall(timing.bestReps) * 1e6;
  if (timing.vsMpi) m.mpiLat = reduceLatency(mpiSeconds, iters, ctx.nranks);
  m.wrong = sumOverRanks(m.wrong);
  m.mpiWrong = sumOverRanks(m.mpiWrong);
  return m;
}

}  // namespace bench
}  // namespace mtxcomm
