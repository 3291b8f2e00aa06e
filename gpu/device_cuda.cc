// Device buffers in a CUDA build: memory-type detection, the agreed device topology and the
// per-call choice of path (gpu/device.h).
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_paths.h"
#include "gpu/reduce_kernels.h"
#include "lib/base/dtype.h"
#include "lib/base/liveness.h"
#include "lib/base/log.h"

namespace mtxcomm {
namespace gpu {

namespace {

struct DeviceCount {
  int count = 0;
  std::string why;  // why there is none
};

const DeviceCount& deviceCount() {
  static const DeviceCount kCount = [] {
    DeviceCount c;
    const cudaError_t e = cudaGetDeviceCount(&c.count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      c.count = 0;
      c.why = strCat("cudaGetDeviceCount: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    } else if (c.count == 0) {
      c.why = "cudaGetDeviceCount reports 0 devices";
    }
    return c;
  }();
  return kCount;
}

// -1: host memory (or not known to CUDA); otherwise the device ordinal of the allocation.
int deviceOf(const void* p) {
  if (!p) return -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return attr.device;
  return -1;
}

// The buffers a call uses on this rank (broadcast's sendbuf on the root only, reduce's recvbuf
// on the root only).
void usedBuffers(const CollArgs& a, int rank, const void** send, const void** recv) {
  *send = a.sendbuf;
  *recv = a.recvbuf;
  if (a.coll == Collective::kBroadcast && rank != a.root) *send = nullptr;
  if (a.coll == Collective::kReduce && rank != a.root) *recv = nullptr;
  if (a.count == 0 && !a.isAlltoallv()) *send = *recv = nullptr;  // alltoallv: no common count
}

// The device of the call's device buffers, -1 when it has none.
int callDevice(const CollArgs& a, int rank) {
  const void *s, *r;
  usedBuffers(a, rank, &s, &r);
  const int ds = deviceOf(s);
  return ds >= 0 ? ds : deviceOf(r);
}

// One rank's identity, allgathered when a communicator makes its first device call.
struct RankDevice {
  char node[192];
  uint64_t pid;
  unsigned char uuid[16];
  int32_t device;
  int32_t flags;  // kRankNccl*
};
constexpr int32_t kRankNcclLoaded = 1;     // NCCL loaded in this process
constexpr int32_t kRankNcclSharedGpu = 2;  // its NCCL may share a GPU between ranks
static_assert(sizeof(RankDevice) == 224, "RankDevice is exchanged as raw bytes");

class CudaDeviceComm : public DeviceComm {
 public:
  CudaDeviceComm(HostCollectives& host, int device, const DeviceOptions& options)
      : host_(host), device_(device), options_(options) {
    const int n = host.size();
    RankDevice mine{};
    const std::string node = PeerLiveness::nodeIdentity();
    std::memcpy(mine.node, node.data(), std::min(node.size(), sizeof(mine.node) - 1));
    mine.pid = static_cast<uint64_t>(getpid());
    mine.device = device;
    if (ncclBuilt() && ncclLoaded()) mine.flags |= kRankNcclLoaded;
    if (ncclBuilt() && ncclSharesGpus()) mine.flags |= kRankNcclSharedGpu;
    cudaDeviceProp prop{};
    MTXCOMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
    std::vector<RankDevice> all(n);
    host.allgatherBytes(&mine, all.data(), sizeof(RankDevice));
    topo_.nranks = n;
    topo_.ncclBuilt = ncclBuilt();
    topo_.oneNode = topo_.distinctGpus = topo_.oneProcessPerRank = true;
    topo_.ncclLoaded = topo_.ncclSharedGpu = topo_.ncclBuilt;
    for (int a = 0; a < n; ++a) {
      if (!(all[a].flags & kRankNcclLoaded)) topo_.ncclLoaded = false;
      if (!(all[a].flags & kRankNcclSharedGpu)) topo_.ncclSharedGpu = false;
      if (std::strncmp(all[a].node, mine.node, sizeof(mine.node)) != 0) topo_.oneNode = false;
      for (int b = 0; b < a; ++b) {
        const bool sameNode = std::strncmp(all[a].node, all[b].node, sizeof(mine.node)) == 0;
        if (sameNode && std::memcmp(all[a].uuid, all[b].uuid, sizeof(mine.uuid)) == 0) {
          topo_.distinctGpus = false;
        }
        if (sameNode && all[a].pid == all[b].pid) topo_.oneProcessPerRank = false;
      }
    }
    MTXCOMM_LOG(kInfo, host.rank(), "device calls on GPU ", device, " (", prop.name,
                "); ranks: one node ", topo_.oneNode, ", distinct GPUs ", topo_.distinctGpus,
                ", one process per rank ", topo_.oneProcessPerRank, ", NCCL built ",
                topo_.ncclBuilt, ", loaded on every rank ", topo_.ncclLoaded, ", sharing GPUs ",
                topo_.ncclSharedGpu);
  }

  const DeviceTopology& topology() const override { return topo_; }

  bool runLocal(const CollArgs& a) override {
    const int dev = callDevice(a, host_.rank());
    if (dev >= 0 && dev != device_) {
      fail(MTXCOMM_INVALID_ARGUMENT, "the buffers are on device ", dev,
           " but this communicator's device calls run on device ", device_,
           " (the device of its first call on device buffers)");
    }
    if (host_.size() > 1 && a.count > 0) return false;
    DeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(a.stream);
    if (a.count > 0 && a.sendbuf && a.recvbuf && collectiveReduces(a.coll) && isBoolType(a.dtype)) {
      // A one-rank bool reduction still writes 0/1: recvbuf = sendbuf OR sendbuf.
      ReduceSources src;
      src.n = 1;
      src.p[0] = a.sendbuf;
      launchReduce(a.dtype, MTXCOMM_MAX, a.recvbuf, src, a.count, 1, stream);
    } else if (a.count > 0 && a.sendbuf && a.recvbuf && a.sendbuf != a.recvbuf) {
      MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(a.recvbuf, a.sendbuf, a.count * datatypeSize(a.dtype),
                                         cudaMemcpyDefault, stream));
    }
    return true;
  }

  void run(const CollArgs& a, DevicePath path) override {
    // Adasum is not elementwise: no device path (chunked or NCCL) computes it. The communicator
    // refuses it before here (lib/comm/comm.cc); this guard keeps every path from seeing it.
    if (collectiveReduces(a.coll) && a.op == MTXCOMM_ADASUM) {
      fail(MTXCOMM_UNSUPPORTED, "device path ", devicePathName(path),
           ": op adasum is not supported on device buffers (host buffers only)");
    }
    DeviceGuard guard(device_);
    try {
      runner(path).run(a, static_cast<cudaStream_t>(a.stream));
    } catch (const Error& e) {
      throw Error(e.code(), strCat("device path ", devicePathName(path), ": ", e.what()));
    }
  }

 private:
  PathRunner& runner(DevicePath p) {
    auto& slot = runners_[static_cast<int>(p)];
    if (slot) return *slot;
    switch (p) {
      case DevicePath::kNccl:
        slot = makeNcclPath(host_, device_);
        break;
      case DevicePath::kCudaIpc:
        slot = makeCudaIpcPath(host_, device_, options_.cudaIpcBytes);
        break;
      case DevicePath::kHostStaging:
        slot = makeHostStagingPath(host_, options_.cudaStagingBytes);
        break;
      case DevicePath::kUcxCuda:
        fail(MTXCOMM_UNSUPPORTED, devicePathDeclines(p, CollArgs{}, topo_));
    }
    return *slot;
  }

  HostCollectives& host_;
  int device_;
  DeviceOptions options_;
  DeviceTopology topo_;
  std::unique_ptr<PathRunner> runners_[kNumDevicePaths];
};

}  // namespace

bool isDeviceCall(const CollArgs& a, int rank) {
  if (a.coll == Collective::kBarrier) return false;
  if (deviceCount().count == 0) {
    if (a.stream) {
      fail(MTXCOMM_UNSUPPORTED, "stream is not NULL but no CUDA device is visible (",
           deviceCount().why, ")");
    }
    return false;
  }
  const void *s, *r;
  usedBuffers(a, rank, &s, &r);
  const int ds = deviceOf(s), dr = deviceOf(r);
  if (s && r && (ds >= 0) != (dr >= 0)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "sendbuf is ", ds >= 0 ? "device" : "host",
         " memory but recvbuf is ", dr >= 0 ? "device" : "host",
         " memory (both must be one or the other)");
  }
  if (ds >= 0 && dr >= 0 && ds != dr) {
    fail(MTXCOMM_INVALID_ARGUMENT, "sendbuf is on device ", ds, " but recvbuf on device ", dr);
  }
  const bool device = ds >= 0 || dr >= 0;
  if (!device && a.stream && (s || r)) {
    fail(MTXCOMM_INVALID_ARGUMENT,
         "stream is not NULL but the buffers are host memory (a stream goes with device "
         "buffers only)");
  }
  return device || a.stream;  // a stream with no buffers (count 0): a device call, nothing moves
}

std::string deviceSummary() {
  const DeviceCount& c = deviceCount();
  if (c.count == 0) return strCat("cuda (no device: ", c.why, ")");
  return strCat("cuda (", c.count, " device", c.count == 1 ? "" : "s", ")");
}

int visibleDeviceCount() { return deviceCount().count; }

std::unique_ptr<DeviceComm> DeviceComm::create(HostCollectives& host, const CollArgs& firstCall,
                                               const DeviceOptions& options) {
  int device = callDevice(firstCall, host.rank());
  if (device < 0) MTXCOMM_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_unique<CudaDeviceComm>(host, device, options);
}

}  // namespace gpu
}  // namespace mtxcomm
