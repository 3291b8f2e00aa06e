// mtxcomm_gpu_bench: collectives on device buffers, without MPI (ranks meet through
// MTXCOMM_RANK/MTXCOMM_SIZE/MTXCOMM_STORE, or run as one rank), plus the two baselines the
// GPU figures are ratios to, measured in the same run on rank 0's GPU:
//   copy    cudaMemcpyAsync device to device of --baseline-bytes (algbw = bytes / time; the
//           DRAM traffic is twice that);
//   kernel  mtxcomm's reduction kernel, dst = a + b, of the benchmark's datatype (-T; 16-bit
//           floats accumulate in float32): DRAM traffic = 3 x bytes, reported against the
//           device's peak (memory clock x bus width) and the copy's.
// Then, for each size (nccl-tests conventions: Size is the whole array, busbw = algbw x
// factor), the collective timed with CUDA events on one stream over the iterations, the
// slowest rank reported, busbw as a fraction of the copy bandwidth, #wrong with -c, and the
// device path taken. Every rank runs on GPU (rank % visible devices).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/gpu_case.h"
#include "gpu/reduce_kernels.h"
#include "lib/base/dtype.h"
#include "lib/base/reduce.h"
#include "lib/comm/c_api.h"
#include "mtxcomm/mtxcomm.h"

namespace {

namespace td = mtxcomm::testdata;

struct Failure {
  std::string what;
};

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Failure{std::string(what) + ": " + cudaGetErrorString(e)};
}
void check(mtxcomm_result_t r, mtxcomm_comm_t comm, const char* what) {
  if (r != MTXCOMM_SUCCESS) {
    throw Failure{std::string(what) + ": " + mtxcomm_get_error_string(r) + ": " +
                  mtxcomm_get_last_error(comm)};
  }
}

size_t parseSize(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string suffix = s.substr(pos);
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1 << 10;
  if (suffix == "M" || suffix == "m") mult = 1 << 20;
  if (suffix == "G" || suffix == "g") mult = 1 << 30;
  return static_cast<size_t>(v * mult);
}

struct Options {
  std::string collective = "allreduce";
  std::string sizes = "4K:256M";
  int iters = 20;
  int warmup = 5;
  bool check = false;
  std::string dtype = "float32";
  std::string op = "sum";
  std::string baselineBytes = "256M";
  int root = 0;
};

// Median of `reps` timings of fn (enqueued on stream), in seconds.
template <class Fn>
double timeOnStream(cudaStream_t stream, int reps, Fn&& fn) {
  cudaEvent_t a, b;
  cuda(cudaEventCreate(&a), "cudaEventCreate");
  cuda(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> t;
  for (int k = 0; k < reps; ++k) {
    cuda(cudaEventRecord(a, stream), "cudaEventRecord");
    fn();
    cuda(cudaEventRecord(b, stream), "cudaEventRecord");
    cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int run(const Options& o) {
  const auto dt = mtxcomm::parseDatatype(o.dtype);
  const auto op = mtxcomm::parseOp(o.op);
  if (!dt || !op) throw Failure{"unknown datatype or op"};
  const size_t es = mtxcomm::datatypeSize(*dt);
  const size_t colon = o.sizes.find(':');
  const size_t minBytes = parseSize(o.sizes.substr(0, colon));
  const size_t maxBytes =
      colon == std::string::npos ? minBytes : parseSize(o.sizes.substr(colon + 1));
  const mtxcomm::Collective colls[] = {
      mtxcomm::Collective::kAllreduce, mtxcomm::Collective::kBroadcast,
      mtxcomm::Collective::kReduce, mtxcomm::Collective::kAllgather,
      mtxcomm::Collective::kReduceScatter};
  mtxcomm::Collective coll = mtxcomm::Collective::kBarrier;
  for (auto c : colls) {
    if (o.collective == mtxcomm::collectiveName(c)) coll = c;
  }
  if (coll == mtxcomm::Collective::kBarrier) throw Failure{"unknown collective " + o.collective};

  int devices = 0;
  cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  mtxcomm_comm_t comm = nullptr;
  check(mtxcomm_comm_init_from_env(&comm), nullptr, "mtxcomm_comm_init_from_env");
  int rank = 0, n = 1;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &n);
  cuda(cudaSetDevice(rank % devices), "cudaSetDevice");
  cudaStream_t stream;
  cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // Baselines on rank 0's GPU while the others wait.
  double copyBw = 0;
  if (rank == 0) {
    const size_t bytes = parseSize(o.baselineBytes);
    void *x, *y, *z;
    cuda(cudaMalloc(&x, bytes), "cudaMalloc");
    cuda(cudaMalloc(&y, bytes), "cudaMalloc");
    cuda(cudaMalloc(&z, bytes), "cudaMalloc");
    cuda(cudaMemset(x, 0, bytes), "cudaMemset");
    cuda(cudaMemset(y, 0, bytes), "cudaMemset");
    const double tCopy = timeOnStream(stream, 20, [&] {
      cuda(cudaMemcpyAsync(z, x, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    });
    mtxcomm::gpu::ReduceSources src;
    src.n = 2;
    src.p[0] = x;
    src.p[1] = y;
    const double tKernel = timeOnStream(stream, 20, [&] {
      mtxcomm::gpu::launchReduce(*dt, MTXCOMM_SUM, z, src, bytes / es, 1, stream);
    });
    cudaDeviceProp prop{};
    cuda(cudaGetDeviceProperties(&prop, rank % devices), "cudaGetDeviceProperties");
    int clockKhz = 0, busBits = 0;
    cudaDeviceGetAttribute(&clockKhz, cudaDevAttrMemoryClockRate, rank % devices);
    cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, rank % devices);
    cudaGetLastError();
    const double peak = 2.0 * clockKhz * 1e3 * busBits / 8;  // DDR: two transfers per clock
    copyBw = bytes / tCopy;
    const double kernelTraffic = 3.0 * bytes / tKernel;
    std::printf("# device: %s, %d ranks, peak DRAM %.0f GB/s (memory clock x bus width)\n",
                prop.name, n, peak / 1e9);
    std::printf(
        "# copy   %zu bytes device to device: %.1f us, %.0f GB/s (DRAM traffic %.0f GB/s)\n", bytes,
        tCopy * 1e6, copyBw / 1e9, 2 * copyBw / 1e9);
    std::printf(
        "# kernel %zu bytes %s sum of 2 inputs: %.1f us, DRAM traffic %.0f GB/s = "
        "%.2f of peak, %.2f of the copy's traffic\n",
        bytes, o.dtype.c_str(), tKernel * 1e6, kernelTraffic / 1e9,
        peak > 0 ? kernelTraffic / peak : 0.0, kernelTraffic / (2 * copyBw));
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
  }
  check(mtxcomm_allreduce(&copyBw, &copyBw, 1, MTXCOMM_FLOAT64, MTXCOMM_MAX, comm, nullptr), comm,
        "allreduce");
  const double factor =
      coll == mtxcomm::Collective::kAllreduce ? 2.0 * (n - 1) / n
      : coll == mtxcomm::Collective::kAllgather || coll == mtxcomm::Collective::kReduceScatter
          ? double(n - 1) / n
          : 1.0;
  if (rank == 0) {
    std::printf(
        "# %s on device buffers, %s %s, busbw = algbw x %.3f, vs copy = busbw / copy algbw\n",
        o.collective.c_str(), o.dtype.c_str(), o.op.c_str(), factor);
    std::printf("%12s %12s %12s %10s %10s %8s %7s %s\n", "size(B)", "count", "time(us)", "algbw",
                "busbw", "vs_copy", "#wrong", "path");
  }
  int failures = 0;
  for (size_t bytes = std::max(minBytes, es * n); bytes <= maxBytes; bytes *= 4) {
    // Size is the whole array (nccl-tests); count is the call's count argument. Inputs and
    // expected outputs: the closed-form test data (tests/common/test_data.h).
    const bool perRank =
        coll == mtxcomm::Collective::kAllgather || coll == mtxcomm::Collective::kReduceScatter;
    const size_t count = bytes / es / (perRank ? n : 1);
    const size_t total = count * (perRank ? n : 1);
    const td::Case c{coll, "", *dt, *op, count, false, o.root};
    td::CaseBuffers b(c, rank, n, true);
    td::DeviceCaseBuffers d(b);
    cuda(d.error, "cudaMalloc");
    cuda(cudaMemcpy(d.send, b.sendStore.data(), b.sendStore.size(), cudaMemcpyHostToDevice),
         "cudaMemcpy");
    auto call = [&] {
      check(td::callCollective(c, comm, rank, d.sendArg, d.recvArg, stream), comm,
            o.collective.c_str());
    };
    for (int k = 0; k < o.warmup; ++k) call();
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(mtxcomm_barrier(comm), comm, "barrier");
    double t = timeOnStream(stream, 1,
                            [&] {
                              for (int k = 0; k < o.iters; ++k) call();
                            }) /
               o.iters;
    // The device path of the timed calls, read before the host collectives below (an allreduce
    // of the time, of the wrong elements) make theirs the communicator's last algorithm.
    const std::string path = mtxcomm::unwrapComm(comm)->lastAlgorithm();
    check(mtxcomm_allreduce(&t, &t, 1, MTXCOMM_FLOAT64, MTXCOMM_MAX, comm, nullptr), comm,
          "allreduce");
    unsigned long long wrong = 0;
    if (o.check) {
      // The receive buffer poisoned again, one more call, every element compared.
      cuda(cudaMemcpy(d.recv, b.recvStore.data(), b.recvStore.size(), cudaMemcpyHostToDevice),
           "cudaMemcpy");
      call();
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      cuda(cudaMemcpy(b.recvStore.data(), d.recv, b.recvStore.size(), cudaMemcpyDeviceToHost),
           "cudaMemcpy");
      std::vector<char> expect(b.outCount * b.es + 1);
      const size_t checked =
          td::storeExpectedOutput(c, rank, n, b.inCount, b.outCount, expect.data());
      for (size_t i = 0; i < checked; ++i) {
        wrong += std::memcmp(expect.data() + i * b.es, b.recvArg + i * b.es, b.es) != 0;
      }
      check(mtxcomm_allreduce(&wrong, &wrong, 1, MTXCOMM_UINT64, MTXCOMM_SUM, comm, nullptr), comm,
            "allreduce");
    }
    if (rank == 0) {
      const double algbw = total * es / t;
      std::printf("%12zu %12zu %12.2f %10.2f %10.2f %8.3f %7s %s\n", total * es, count, t * 1e6,
                  algbw / 1e9, algbw * factor / 1e9, algbw * factor / copyBw,
                  o.check ? std::to_string(wrong).c_str() : "-", path.c_str());
      std::fflush(stdout);
    }
    failures += wrong > 0;
  }
  cudaStreamDestroy(stream);
  mtxcomm_comm_destroy(comm);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "mtxcomm_gpu_bench: collectives on device buffers (ranks meet through MTXCOMM_STORE)"};
  Options o;
  app.add_option("collective", o.collective,
                 "allreduce, broadcast, reduce, allgather or reduce_scatter (default allreduce)");
  app.add_option("-m,--message-size", o.sizes,
                 "MIN:MAX bytes, K/M/G suffixes, x4 steps (default 4K:256M)");
  app.add_option("-i,--iterations", o.iters, "timed calls per size (default 20)");
  app.add_option("-x,--warmup", o.warmup, "warmup calls per size (default 5)");
  app.add_flag("-c,--check", o.check, "check every result (#wrong column); exit 1 on any wrong");
  app.add_option("-T,--datatype", o.dtype, "datatype (default float32)");
  app.add_option("-o,--op", o.op, "sum, prod, min, max, avg (default sum)");
  app.add_option("-r,--root", o.root, "root of broadcast and reduce (default 0)");
  app.add_option("--baseline-bytes", o.baselineBytes,
                 "bytes of the copy and kernel baselines (default 256M)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const Failure& f) {
    std::fprintf(stderr, "mtxcomm_gpu_bench: %s\n", f.what.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mtxcomm_gpu_bench: %s\n", e.what());
    return 2;
  }
}
