// Device-path selection, chunk and slice arithmetic, and the stream checks that need no GPU:
// these run in every build and on every machine.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "harness.h"
#include "lib/base/error.h"
#include "lib/comm/select.h"

namespace mtxcomm {
namespace gpu {
namespace {

CollArgs call(Collective c, mtxcomm_datatype_t dt = MTXCOMM_FLOAT32,
              mtxcomm_op_t op = MTXCOMM_SUM) {
  CollArgs a;
  a.coll = c;
  a.dtype = dt;
  a.op = op;
  a.count = 1000;
  return a;
}

DeviceTopology topo(int n, bool nccl, bool distinct, bool oneNode, bool oneProcess) {
  DeviceTopology t;
  t.nranks = n;
  t.ncclBuilt = t.ncclLoaded = nccl;
  t.distinctGpus = distinct;
  t.oneNode = oneNode;
  t.oneProcessPerRank = oneProcess;
  return t;
}

TEST(DevicePath, AutoPrefersNcclThenIpcThenStaging) {
  const CollArgs a = call(Collective::kAllreduce);
  EXPECT_EQ(selectDevicePath(a, topo(4, true, true, true, true), "auto", 0).devicePath,
            DevicePath::kNccl);
  // Two ranks sharing one GPU on one node: CUDA IPC.
  auto c = selectDevicePath(a, topo(2, true, false, true, true), "auto", 0);
  EXPECT_EQ(c.devicePath, DevicePath::kCudaIpc);
  EXPECT_NE(c.why.find("not nccl: ranks share a GPU"), std::string::npos) << c.why;
  // Without NCCL, distinct GPUs on one node: CUDA IPC.
  EXPECT_EQ(selectDevicePath(a, topo(2, false, true, true, true), "auto", 0).devicePath,
            DevicePath::kCudaIpc);
  // Across nodes without NCCL, or ranks as threads of one process: host staging.
  EXPECT_EQ(selectDevicePath(a, topo(4, false, true, false, true), "auto", 0).devicePath,
            DevicePath::kHostStaging);
  c = selectDevicePath(a, topo(3, true, false, true, false), "auto", 0);
  EXPECT_EQ(c.devicePath, DevicePath::kHostStaging);
  EXPECT_NE(c.why.find("share a process"), std::string::npos) << c.why;
  EXPECT_EQ(
      selectDevicePath(a, topo(kMaxIpcRanks + 1, false, false, true, true), "auto", 0).devicePath,
      DevicePath::kHostStaging);
}

// NCCL built but not loadable on some rank (gpu/nccl_api.h): never chosen, and forcing it names
// why on every rank alike (the flag is agreed through the topology's allgather).
TEST(DevicePath, NcclThatSomeRankCannotLoadIsNeverTaken) {
  const CollArgs a = call(Collective::kAllreduce);
  DeviceTopology t = topo(2, true, true, true, true);
  t.ncclLoaded = false;
  auto c = selectDevicePath(a, t, "auto", 0);
  EXPECT_EQ(c.devicePath, DevicePath::kCudaIpc);
  EXPECT_NE(c.why.find("not nccl: NCCL cannot be loaded on every rank"), std::string::npos)
      << c.why;
  try {
    selectDevicePath(a, t, "nccl", 0);
    FAIL() << "a forced nccl without NCCL loaded was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), MTXCOMM_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("MTXCOMM_NCCL_LIBRARY"), std::string::npos) << e.what();
  }
}

// Ranks sharing a GPU: NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank takes them
// when forced; auto keeps choosing cuda_ipc (NCCL's sharing is experimental and slow).
TEST(DevicePath, NcclOnASharedGpuOnlyWhenForcedAndEnabledEverywhere) {
  const CollArgs a = call(Collective::kAllreduce);
  DeviceTopology t = topo(2, true, false, true, true);
  EXPECT_NE(devicePathDeclines(DevicePath::kNccl, a, t), nullptr);
  EXPECT_NE(
      std::string(devicePathDeclines(DevicePath::kNccl, a, t)).find("NCCL_MULTI_RANK_GPU_ENABLE=1"),
      std::string::npos);
  EXPECT_THROW(selectDevicePath(a, t, "nccl", 0), Error);
  t.ncclSharedGpu = true;
  EXPECT_EQ(devicePathDeclines(DevicePath::kNccl, a, t), nullptr);
  EXPECT_EQ(selectDevicePath(a, t, "nccl", 0).devicePath, DevicePath::kNccl);
  auto c = selectDevicePath(a, t, "auto", 0);
  EXPECT_EQ(c.devicePath, DevicePath::kCudaIpc);
  EXPECT_NE(c.why.find("only when forced"), std::string::npos) << c.why;
}

TEST(DevicePath, NcclKeepsAwayFromCallsWhoseNumbersDiffer) {
  const DeviceTopology four = topo(4, true, true, true, true);
  // 16-bit sums on more than 2 ranks are rounded per hop by NCCL.
  EXPECT_NE(
      devicePathDeclines(DevicePath::kNccl, call(Collective::kAllreduce, MTXCOMM_BFLOAT16), four),
      nullptr);
  EXPECT_EQ(devicePathDeclines(DevicePath::kNccl, call(Collective::kAllreduce, MTXCOMM_BFLOAT16),
                               topo(2, true, true, true, true)),
            nullptr);
  // A 16-bit allgather does not reduce: NCCL is fine.
  EXPECT_EQ(
      devicePathDeclines(DevicePath::kNccl, call(Collective::kAllgather, MTXCOMM_FLOAT16), four),
      nullptr);
  EXPECT_NE(devicePathDeclines(DevicePath::kNccl,
                               call(Collective::kAllreduce, MTXCOMM_FLOAT32, MTXCOMM_MAX), four),
            nullptr);
  EXPECT_EQ(devicePathDeclines(DevicePath::kNccl,
                               call(Collective::kAllreduce, MTXCOMM_INT32, MTXCOMM_MAX), four),
            nullptr);
  EXPECT_EQ(
      selectDevicePath(call(Collective::kAllreduce, MTXCOMM_FLOAT16), four, "auto", 0).devicePath,
      DevicePath::kCudaIpc);
}

// NCCL has no int16, uint16 or bool type: their reductions go to cuda_ipc (mtxcomm's kernels),
// their broadcast and allgather stay on NCCL (moved as bytes).
TEST(DevicePath, NcclDeclinesReductionsOfTypesItLacks) {
  const DeviceTopology two = topo(2, true, true, true, true);
  for (mtxcomm_datatype_t dt : {MTXCOMM_INT16, MTXCOMM_UINT16, MTXCOMM_BOOL}) {
    EXPECT_FALSE(ncclReducesDatatype(dt));
    for (Collective c : {Collective::kAllreduce, Collective::kReduce, Collective::kReduceScatter}) {
      for (mtxcomm_op_t op : {MTXCOMM_SUM, MTXCOMM_MAX, MTXCOMM_MIN, MTXCOMM_PROD}) {
        const char* why = devicePathDeclines(DevicePath::kNccl, call(c, dt, op), two);
        ASSERT_NE(why, nullptr) << collectiveName(c) << " " << op;
        EXPECT_NE(std::string(why).find("NCCL has no int16, uint16 or bool"), std::string::npos)
            << why;
        EXPECT_EQ(selectDevicePath(call(c, dt, op), two, "auto", 0).devicePath,
                  DevicePath::kCudaIpc);
      }
    }
    for (Collective c : {Collective::kBroadcast, Collective::kAllgather}) {
      EXPECT_EQ(devicePathDeclines(DevicePath::kNccl, call(c, dt), two), nullptr);
    }
  }
  for (mtxcomm_datatype_t dt : {MTXCOMM_INT8, MTXCOMM_UINT8, MTXCOMM_INT32, MTXCOMM_FLOAT64}) {
    EXPECT_TRUE(ncclReducesDatatype(dt));
  }
}

TEST(DevicePath, ForcedPathThatCannotApplyIsUnsupportedNamingIt) {
  const CollArgs a = call(Collective::kBroadcast);
  const DeviceTopology shared = topo(2, true, false, true, false);
  for (const char* forced : {"nccl", "cuda_ipc", "ucx_cuda"}) {
    try {
      selectDevicePath(a, shared, forced, 0);
      ADD_FAILURE() << forced << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_UNSUPPORTED);
      EXPECT_NE(std::string(e.what()).find(std::string("device path ") + forced), std::string::npos)
          << e.what();
    }
  }
  auto c = selectDevicePath(a, shared, "host_staging", 0);
  EXPECT_EQ(c.devicePath, DevicePath::kHostStaging);
  EXPECT_EQ(c.why, "forced by MTXCOMM_CUDA_PATH");
  try {
    selectDevicePath(a, shared, "ucx_cuda", 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not built"), std::string::npos) << e.what();
  }
}

// Op adasum is host-only: every device path declines it, so forcing one is MTXCOMM_UNSUPPORTED
// naming the path (the communicator refuses it before selection, tests/gpu/test_gpu.cc).
TEST(DevicePath, EveryPathDeclinesAdasum) {
  const CollArgs a = call(Collective::kAllreduce, MTXCOMM_FLOAT32, MTXCOMM_ADASUM);
  const DeviceTopology t = topo(4, true, true, true, true);
  for (int p = 0; p < kNumDevicePaths; ++p) {
    const char* why = devicePathDeclines(static_cast<DevicePath>(p), a, t);
    ASSERT_NE(why, nullptr) << devicePathName(static_cast<DevicePath>(p));
  }
  EXPECT_NE(std::string(devicePathDeclines(DevicePath::kNccl, a, t)).find("adasum"),
            std::string::npos);
  for (const char* forced : {"nccl", "cuda_ipc", "host_staging"}) {
    try {
      selectDevicePath(a, t, forced, 0);
      ADD_FAILURE() << forced << " was accepted for op adasum";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_UNSUPPORTED);
      EXPECT_NE(std::string(e.what()).find("adasum"), std::string::npos) << e.what();
    }
  }
}

TEST(DevicePath, ChunkPlans) {
  // 10 MiB of floats through 4 MiB buffers: 3 chunks, 16-byte aligned.
  ChunkPlan p = planChunks(Collective::kAllreduce, 10 << 18, 4, 4, 4 << 20);
  EXPECT_EQ(p.chunkElems, size_t{1} << 20);
  EXPECT_EQ(p.chunks, 3u);
  EXPECT_EQ(p.inRows, 1);
  EXPECT_EQ(p.outRows, 1);
  // reduce_scatter moves n blocks in: chunks per block are n times smaller.
  p = planChunks(Collective::kReduceScatter, 1 << 20, 4, 4, 4 << 20);
  EXPECT_EQ(p.inRows, 4);
  EXPECT_EQ(p.chunkElems, size_t{1} << 18);
  EXPECT_EQ(p.chunks, 4u);
  p = planChunks(Collective::kAllgather, 1000, 2, 3, 1000);
  EXPECT_EQ(p.outRows, 3);
  EXPECT_EQ(p.chunkElems, 160u);  // 1000 / (3 x 2) = 166, down to a multiple of 8 elements
  EXPECT_EQ(p.chunks, 7u);
  // Fits in one chunk; count 0; a buffer smaller than 16 bytes per row.
  p = planChunks(Collective::kBroadcast, 5, 8, 2, 1 << 20);
  EXPECT_EQ(p.chunkElems, 5u);
  EXPECT_EQ(p.chunks, 1u);
  EXPECT_EQ(planChunks(Collective::kAllreduce, 0, 4, 2, 1 << 20).chunks, 0u);
  p = planChunks(Collective::kAllreduce, 100, 8, 2, 8);
  EXPECT_EQ(p.chunkElems, 1u);
  EXPECT_EQ(p.chunks, 100u);
  // Every element is covered exactly once.
  for (size_t count : {1u, 7u, 4096u, 100003u}) {
    for (size_t buf : {64u, 4096u, 1u << 20}) {
      p = planChunks(Collective::kReduceScatter, count, 2, 3, buf);
      ASSERT_GE(p.chunkElems, 1u);
      EXPECT_GE(p.chunks * p.chunkElems, count);
      EXPECT_LT((p.chunks - 1) * p.chunkElems, count);
    }
  }
}

TEST(DevicePath, RankSlicesCoverTheChunkAligned) {
  for (int n : {1, 2, 3, 5, 8, 16}) {
    for (size_t count : {0u, 1u, 3u, 17u, 1000u, 1u << 20}) {
      for (size_t es : {1u, 2u, 4u, 8u}) {
        size_t next = 0;
        for (int r = 0; r < n; ++r) {
          const Slice s = rankSlice(count, n, r, es);
          EXPECT_EQ(s.offset, next) << "n " << n << " count " << count << " rank " << r;
          if (s.count > 0 && s.offset > 0) {
            EXPECT_EQ(s.offset * es % 16, 0u);
          }
          next = s.offset + s.count;
        }
        EXPECT_EQ(next, count) << "n " << n << " count " << count;
      }
    }
  }
  // 1000 floats on 3 ranks: slices of 336 (a multiple of 4 floats), the last one shorter.
  EXPECT_EQ(rankSlice(1000, 3, 0, 4).count, 336u);
  EXPECT_EQ(rankSlice(1000, 3, 2, 4).offset, 672u);
  EXPECT_EQ(rankSlice(1000, 3, 2, 4).count, 328u);
}

// A stream with host buffers: never taken silently. Without a GPU (this build has no CUDA, or
// no device is visible) it is MTXCOMM_UNSUPPORTED saying why; with one, the buffers do not fit
// the stream: MTXCOMM_INVALID_ARGUMENT. Either way the communicator stays usable.
TEST(DevicePath, StreamWithHostBuffersIsRefusedAndTheCommStaysUsable) {
  std::printf("device support: %s\n", deviceSummary().c_str());
  testing::runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    std::vector<float> buf(8, 1.0f);
    void* fakeStream = reinterpret_cast<void*>(0x1);  // cudaStreamLegacy's value
    mtxcomm_result_t r = mtxcomm_allreduce(buf.data(), buf.data(), 8, MTXCOMM_FLOAT32, MTXCOMM_SUM,
                                           comm, fakeStream);
    const std::string msg = mtxcomm_get_last_error(comm);
    if (visibleDeviceCount() == 0) {
      EXPECT_EQ(r, MTXCOMM_UNSUPPORTED) << msg;
      EXPECT_TRUE(msg.find("without CUDA") != std::string::npos ||
                  msg.find("no CUDA device is visible") != std::string::npos)
          << msg;
    } else {
      EXPECT_EQ(r, MTXCOMM_INVALID_ARGUMENT) << msg;
      EXPECT_NE(msg.find("host memory"), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find("rank " + std::to_string(rank)), std::string::npos) << msg;
    EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
    // Host buffers without a stream: today's path, unchanged.
    ASSERT_EQ(
        mtxcomm_allreduce(buf.data(), buf.data(), 8, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
        MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    EXPECT_EQ(buf[7], 2.0f);
  });
}

}  // namespace
}  // namespace gpu
}  // namespace mtxcomm
