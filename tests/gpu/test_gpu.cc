// GPU tests (need a visible CUDA device; otherwise main prints why and exits 77, reported as
// skipped): the reduction kernels against the host kernels for every datatype and op, every
// collective on device buffers with ranks as threads (the host_staging path, in several
// chunks), stream ordering, and the errors of device calls.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_case.h"
#include "gpu/device.h"
#include "gpu/reduce_kernels.h"
#include "harness.h"
#include "lib/base/dtype.h"
#include "lib/base/reduce.h"

namespace mtxcomm {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

const mtxcomm_datatype_t kTypes[] = {
    MTXCOMM_INT8,   MTXCOMM_UINT8,   MTXCOMM_INT32,    MTXCOMM_UINT32,  MTXCOMM_INT64,
    MTXCOMM_UINT64, MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16, MTXCOMM_FLOAT32, MTXCOMM_FLOAT64,
    MTXCOMM_INT16,  MTXCOMM_UINT16,  MTXCOMM_BOOL};
static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == MTXCOMM_NUM_DATATYPES, "every datatype");
const mtxcomm_op_t kOps[] = {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX, MTXCOMM_AVG};

// The host's answer for dst = s0 op s1 op s2 [/ 3]: 16-bit types widened, combined and
// divided in float32, rounded once (the contract the device kernel keeps).
std::vector<unsigned char> hostReference(mtxcomm_datatype_t dt, mtxcomm_op_t op,
                                         const std::vector<std::vector<unsigned char>>& src,
                                         size_t count) {
  const bool avg = op == MTXCOMM_AVG;
  const mtxcomm_op_t base = avg ? MTXCOMM_SUM : op;
  std::vector<unsigned char> out(count * datatypeSize(dt));
  if (isHalfType(dt)) {
    std::vector<float> acc(count), w(count);
    widenToFloat(dt, reinterpret_cast<const uint16_t*>(src[0].data()), acc.data(), count);
    for (size_t k = 1; k < src.size(); ++k) {
      widenToFloat(dt, reinterpret_cast<const uint16_t*>(src[k].data()), w.data(), count);
      reduceBuffers(MTXCOMM_FLOAT32, base, acc.data(), acc.data(), w.data(), count);
    }
    if (avg) divideBuffer(MTXCOMM_FLOAT32, acc.data(), count, static_cast<int>(src.size()));
    narrowFromFloat(dt, acc.data(), reinterpret_cast<uint16_t*>(out.data()), count);
    return out;
  }
  std::memcpy(out.data(), src[0].data(), out.size());
  for (size_t k = 1; k < src.size(); ++k) {
    reduceBuffers(dt, base, out.data(), out.data(), src[k].data(), count);
  }
  if (avg) divideBuffer(dt, out.data(), count, static_cast<int>(src.size()));
  return out;
}

bool isNan(mtxcomm_datatype_t dt, const unsigned char* p) {
  return std::isnan(loadElement(dt, p, 0));
}

// Element i of a floating buffer set to a quiet NaN.
void storeNan(mtxcomm_datatype_t dt, unsigned char* buf, size_t i) {
  const size_t es = datatypeSize(dt);
  const float f = NAN;
  const double d = NAN;
  const uint16_t h = dt == MTXCOMM_FLOAT16 ? 0x7e00 : 0x7fc0;
  std::memcpy(buf + i * es,
              es == 8   ? static_cast<const void*>(&d)
              : es == 4 ? static_cast<const void*>(&f)
                        : static_cast<const void*>(&h),
              es);
}

bool sameElement(mtxcomm_datatype_t dt, const unsigned char* a, const unsigned char* b) {
  return std::memcmp(a, b, datatypeSize(dt)) == 0 || (isNan(dt, a) && isNan(dt, b));
}

// Every datatype and op, 3 sources, aligned (vector loads) and misaligned by one element
// (scalar path), with a tail that is not a whole 16-byte pack, NaNs among floating inputs.
TEST(GpuKernels, EveryDatatypeAndOpMatchesTheHostKernels) {
  constexpr size_t kCount = 4099;
  constexpr int kSources = 3;
  std::mt19937 rng(7);
  for (mtxcomm_datatype_t dt : kTypes) {
    const size_t es = datatypeSize(dt);
    for (mtxcomm_op_t op : kOps) {
      if (opDeclinesDatatype(op, dt)) continue;  // AVG on bool
      for (size_t shift : {size_t{0}, size_t{1}}) {
        SCOPED_TRACE(::testing::Message()
                     << datatypeName(dt) << " " << opName(op) << " shift " << shift);
        std::vector<std::vector<unsigned char>> src(kSources,
                                                    std::vector<unsigned char>(kCount * es));
        for (auto& s : src) {
          for (size_t i = 0; i < kCount; ++i) {
            double v = isFloatingType(dt) ? std::uniform_real_distribution<>(-4, 4)(rng)
                                          : std::uniform_int_distribution<>(0, 90)(rng);
            if (op == MTXCOMM_PROD && !isFloatingType(dt)) v = 1 + static_cast<int>(v) % 3;
            // bool: a third false, the trues often non-canonical (2, 3, ... 90).
            if (isBoolType(dt)) v = static_cast<int>(v) % 3 == 0 ? 0 : v;
            testdata::storeValue(dt, s.data(), i, v);
            if (isFloatingType(dt) && i % 997 == 5) storeNan(dt, s.data(), i);
          }
        }
        const auto want = hostReference(dt, op, src, kCount);
        void* dev = nullptr;
        const size_t stride = (kCount + 16) * es;  // each buffer, shifted by `shift` elements
        CUDA_OK(cudaMalloc(&dev, stride * (kSources + 1)));
        gpu::ReduceSources rs;
        rs.n = kSources;
        for (int k = 0; k < kSources; ++k) {
          char* p = static_cast<char*>(dev) + k * stride + shift * es;
          CUDA_OK(cudaMemcpy(p, src[k].data(), kCount * es, cudaMemcpyHostToDevice));
          rs.p[k] = p;
        }
        char* dst = static_cast<char*>(dev) + kSources * stride + shift * es;
        const bool avg = op == MTXCOMM_AVG;
        gpu::launchReduce(dt, avg ? MTXCOMM_SUM : op, dst, rs, kCount, avg ? kSources : 1, nullptr);
        std::vector<unsigned char> got(kCount * es);
        CUDA_OK(cudaMemcpy(got.data(), dst, got.size(), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaFree(dev));
        size_t wrong = 0, first = kCount;
        for (size_t i = 0; i < kCount; ++i) {
          if (!sameElement(dt, &got[i * es], &want[i * es])) {
            ++wrong;
            if (first == kCount) first = i;
          }
        }
        EXPECT_EQ(wrong, 0u) << "first wrong element " << first;
      }
    }
  }
}

// One case on device buffers (common/gpu_case.h: inputs, call and result all on one stream),
// checked against the closed-form output, and the path it took.
void runAndCheck(mtxcomm_comm_t comm, int rank, int n, Collective coll, mtxcomm_datatype_t dt,
                 mtxcomm_op_t op, size_t count, bool inPlace, const char* wantPath) {
  const testdata::Case c{coll, "", dt, op, count, inPlace, n - 1};
  SCOPED_TRACE(c.describe(n));
  testdata::CaseBuffers b(c, rank, n, true);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::string why;
  const mtxcomm_result_t r = testdata::runCaseOnDevice(c, b, comm, rank, stream, &why);
  cudaStreamDestroy(stream);
  ASSERT_EQ(r, MTXCOMM_SUCCESS) << why << mtxcomm_get_last_error(comm);
  EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), count == 0 ? "local" : wantPath);
  const testdata::OutputCheck check = testdata::checkOutput(b, c, rank, n);
  EXPECT_TRUE(check.ok()) << "first wrong element " << check.firstWrong << " of "
                          << check.checkCount;
}

TEST(GpuCollectives, EveryCollectiveOnDeviceBuffersThroughHostStaging) {
  Config cfg;
  cfg.cudaStagingBytes = 64 << 10;  // several chunks for the larger counts
  for (int n : {2, 3}) {
    testing::runRanks(
        n,
        [n](mtxcomm_comm_t comm, int rank) {
          ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
          for (Collective c : {Collective::kAllreduce, Collective::kBroadcast, Collective::kReduce,
                               Collective::kAllgather, Collective::kReduceScatter}) {
            for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{50001}}) {
              runAndCheck(comm, rank, n, c, MTXCOMM_FLOAT32, MTXCOMM_SUM, count, false,
                          "host_staging");
            }
          }
          runAndCheck(comm, rank, n, Collective::kAllreduce, MTXCOMM_BFLOAT16, MTXCOMM_AVG, 30000,
                      false, "host_staging");
          runAndCheck(comm, rank, n, Collective::kAllreduce, MTXCOMM_INT32, MTXCOMM_MAX, 30000,
                      true, "host_staging");
          runAndCheck(comm, rank, n, Collective::kAllgather, MTXCOMM_FLOAT16, MTXCOMM_SUM, 20000,
                      true, "host_staging");
        },
        cfg);
  }
}

TEST(GpuCollectives, OneRankCopiesOnTheStream) {
  testing::runRanks(1, [](mtxcomm_comm_t comm, int rank) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    runAndCheck(comm, rank, 1, Collective::kAllreduce, MTXCOMM_FLOAT32, MTXCOMM_SUM, 1000, false,
                "local");
  });
}

TEST(GpuErrors, MixedBuffersForcedPathsAndTheCommStaysUsable) {
  for (const char* forced : {"nccl", "cuda_ipc", "ucx_cuda"}) {
    Config cfg;
    cfg.cudaPath = forced;
    testing::runRanks(
        2,
        [forced](mtxcomm_comm_t comm, int rank) {
          ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
          float* dev = nullptr;
          ASSERT_EQ(cudaMalloc(&dev, 64 * sizeof(float)), cudaSuccess);
          std::vector<float> host(64, 1.0f);
          // Host sendbuf, device recvbuf.
          EXPECT_EQ(
              mtxcomm_allreduce(host.data(), dev, 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_INVALID_ARGUMENT);
          EXPECT_NE(std::string(mtxcomm_get_last_error(comm)).find("host memory"),
                    std::string::npos)
              << mtxcomm_get_last_error(comm);
          // Both ranks share a process and a GPU: nccl, cuda_ipc and ucx_cuda cannot apply.
          EXPECT_EQ(mtxcomm_allreduce(dev, dev, 64, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
                    MTXCOMM_UNSUPPORTED);
          const std::string msg = mtxcomm_get_last_error(comm);
          EXPECT_NE(msg.find(std::string("device path ") + forced), std::string::npos) << msg;
          EXPECT_NE(msg.find("rank " + std::to_string(rank)), std::string::npos) << msg;
          // Still usable on host buffers.
          ASSERT_EQ(mtxcomm_allreduce(host.data(), host.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_SUM,
                                      comm, nullptr),
                    MTXCOMM_SUCCESS)
              << mtxcomm_get_last_error(comm);
          EXPECT_EQ(host[0], 2.0f);
          cudaFree(dev);
        },
        cfg);
  }
}

// Op adasum on device buffers: MTXCOMM_UNSUPPORTED before any byte moves (auto or a forced
// path), the buffer untouched, and the communicator usable for adasum on host buffers.
TEST(GpuErrors, AdasumOnDeviceBuffersIsUnsupported) {
  for (const char* path : {"auto", "host_staging"}) {
    Config cfg;
    cfg.cudaPath = path;
    testing::runRanks(
        2,
        [](mtxcomm_comm_t comm, int rank) {
          ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
          float* dev = nullptr;
          ASSERT_EQ(cudaMalloc(&dev, 64 * sizeof(float)), cudaSuccess);
          std::vector<float> host(64, 1.0f + rank);
          ASSERT_EQ(cudaMemcpy(dev, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice),
                    cudaSuccess);
          EXPECT_EQ(mtxcomm_allreduce(dev, dev, 64, MTXCOMM_FLOAT32, MTXCOMM_ADASUM, comm, nullptr),
                    MTXCOMM_UNSUPPORTED);
          const std::string msg = mtxcomm_get_last_error(comm);
          EXPECT_NE(msg.find("adasum"), std::string::npos) << msg;
          std::vector<float> back(64, 0.0f);
          ASSERT_EQ(cudaMemcpy(back.data(), dev, 64 * sizeof(float), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          EXPECT_EQ(back, host);
          ASSERT_EQ(mtxcomm_allreduce(host.data(), host.data(), 64, MTXCOMM_FLOAT32, MTXCOMM_ADASUM,
                                      comm, nullptr),
                    MTXCOMM_SUCCESS)
              << mtxcomm_get_last_error(comm);
          cudaFree(dev);
        },
        cfg);
  }
}

}  // namespace
}  // namespace mtxcomm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (mtxcomm::gpu::visibleDeviceCount() == 0) {
    std::printf("SKIPPED: no CUDA device: %s\n", mtxcomm::gpu::deviceSummary().c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
