// What each device path accepts (devicePathDeclines, read by the selector in lib/comm/select.cc),
// chunk arithmetic and the host-collective helpers: pure functions over agreed values, the same
// in every build (unit-tested in tests/gpu/test_device_path.cc without a GPU).
#include <algorithm>

#include "gpu/device.h"
#include "lib/base/dtype.h"
#include "lib/base/error.h"

namespace mtxcomm {
namespace gpu {

void HostCollectives::allgatherBytes(const void* mine, void* all, size_t bytes) {
  CollArgs ag;
  ag.coll = Collective::kAllgather;
  ag.sendbuf = mine;
  ag.recvbuf = all;
  ag.count = bytes;
  ag.dtype = MTXCOMM_UINT8;
  run(ag);
}

void HostCollectives::barrier() {
  CollArgs b;
  b.coll = Collective::kBarrier;
  run(b);
}

const char* devicePathName(DevicePath p) {
  switch (p) {
    case DevicePath::kNccl:
      return "nccl";
    case DevicePath::kCudaIpc:
      return "cuda_ipc";
    case DevicePath::kUcxCuda:
      return "ucx_cuda";
    case DevicePath::kHostStaging:
      return "host_staging";
  }
  return "?";
}

bool ncclReducesDatatype(mtxcomm_datatype_t dt) {
  return dt != MTXCOMM_INT16 && dt != MTXCOMM_UINT16 && dt != MTXCOMM_BOOL;
}

const char* devicePathDeclines(DevicePath path, const CollArgs& args, const DeviceTopology& t) {
  if (args.coll == Collective::kAlltoall) return "alltoall runs on host buffers only";
  if (collectiveReduces(args.coll) && args.op == MTXCOMM_ADASUM) {
    return "op adasum runs on host buffers only";
  }
  switch (path) {
    case DevicePath::kNccl:
      if (!t.ncclBuilt) return "this mtxcomm was built without NCCL";
      if (!t.ncclLoaded) {
        return "NCCL cannot be loaded on every rank (`mtxcomm_info` says why; "
               "MTXCOMM_NCCL_LIBRARY names the library)";
      }
      if (!t.distinctGpus && !t.ncclSharedGpu) {
        return "ranks share a GPU (NCCL needs one GPU per rank, or NCCL 2.30+ with "
               "NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank)";
      }
      // NCCL has no 16-bit integer or bool type (and its uint8 max is not a logical OR for
      // bytes other than 0 and 1); the data-movement collectives carry them as bytes.
      if (collectiveReduces(args.coll) && !ncclReducesDatatype(args.dtype)) {
        return "NCCL has no int16, uint16 or bool reduction";
      }
      // mtxcomm rounds 16-bit floats once per element; NCCL's ring rounds at every hop.
      if (collectiveReduces(args.coll) && isHalfType(args.dtype) && t.nranks > 2 &&
          args.op != MTXCOMM_MIN && args.op != MTXCOMM_MAX) {
        return "NCCL rounds float16/bfloat16 at every hop on more than 2 ranks (mtxcomm "
               "rounds once)";
      }
      // NCCL's floating min/max are not documented to propagate NaN, which mtxcomm promises.
      if (collectiveReduces(args.coll) && isFloatingType(args.dtype) &&
          (args.op == MTXCOMM_MIN || args.op == MTXCOMM_MAX)) {
        return "NCCL's floating-point min/max do not promise to propagate NaN";
      }
      return nullptr;
    case DevicePath::kCudaIpc:
      if (!t.oneNode) return "ranks span nodes (CUDA IPC works within one node)";
      if (!t.oneProcessPerRank) {
        return "ranks share a process (CUDA IPC maps other processes' memory only)";
      }
      if (t.nranks > kMaxIpcRanks) return "more than 16 ranks";
      return nullptr;
    case DevicePath::kUcxCuda:
      return "not built: the UCX transport with CUDA memory is not part of this mtxcomm yet "
             "(use host_staging across nodes)";
    case DevicePath::kHostStaging:
      return nullptr;
  }
  return "unknown path";
}

ChunkPlan planChunks(Collective c, size_t count, size_t elemSize, int nranks, size_t bufferBytes) {
  ChunkPlan plan;
  if (c == Collective::kReduceScatter) plan.inRows = nranks;
  if (c == Collective::kAllgather) plan.outRows = nranks;
  if (count == 0) return plan;
  const size_t rows = static_cast<size_t>(std::max(plan.inRows, plan.outRows));
  size_t elems = std::max<size_t>(1, bufferBytes / (rows * elemSize));
  // Keep chunk boundaries 16-byte aligned when a chunk is larger than 16 bytes.
  const size_t align = elemSize < 16 ? 16 / elemSize : 1;
  if (elems > align) elems -= elems % align;
  plan.chunkElems = std::min(elems, count);
  plan.chunks = (count + plan.chunkElems - 1) / plan.chunkElems;
  return plan;
}

Slice rankSlice(size_t count, int nranks, int rank, size_t elemSize) {
  const size_t align = elemSize < 16 ? 16 / elemSize : 1;
  size_t per = (count + nranks - 1) / nranks;
  per = (per + align - 1) / align * align;
  Slice s;
  s.offset = std::min(count, per * static_cast<size_t>(rank));
  s.count = std::min(count - s.offset, per);
  return s;
}

}  // namespace gpu
}  // namespace mtxcomm
