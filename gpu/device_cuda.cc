// Device buffers in a CUDA build: memory-type detection, the agreed device topology and the
// per-call choice of path (gpu/device.h).
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_paths.h"
#include "lib/comm.h"
#include "lib/dtype.h"
#include "lib/liveness.h"
#include "lib/log.h"

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
  if (a.count == 0) *send = *recv = nullptr;
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
  int32_t pad;
};
static_assert(sizeof(RankDevice) == 224, "RankDevice is exchanged as raw bytes");

class CudaDeviceComm : public DeviceComm {
 public:
  CudaDeviceComm(Comm& comm, int device) : comm_(comm), device_(device) {
    const int n = comm.size();
    RankDevice mine{};
    const std::string node = PeerLiveness::nodeIdentity();
    std::memcpy(mine.node, node.data(), std::min(node.size(), sizeof(mine.node) - 1));
    mine.pid = static_cast<uint64_t>(getpid());
    mine.device = device;
    cudaDeviceProp prop{};
    MTXCOMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
    std::vector<RankDevice> all(n);
    hostAllgatherBytes(comm, &mine, all.data(), sizeof(RankDevice));
    topo_.nranks = n;
    topo_.ncclBuilt = ncclBuilt();
    topo_.oneNode = topo_.distinctGpus = topo_.oneProcessPerRank = true;
    for (int a = 0; a < n; ++a) {
      if (std::strncmp(all[a].node, mine.node, sizeof(mine.node)) != 0) topo_.oneNode = false;
      for (int b = 0; b < a; ++b) {
        const bool sameNode = std::strncmp(all[a].node, all[b].node, sizeof(mine.node)) == 0;
        if (sameNode && std::memcmp(all[a].uuid, all[b].uuid, sizeof(mine.uuid)) == 0) {
          topo_.distinctGpus = false;
        }
        if (sameNode && all[a].pid == all[b].pid) topo_.oneProcessPerRank = false;
      }
    }
    MTXCOMM_LOG(kInfo, comm.rank(), "device calls on GPU ", device, " (", prop.name,
                "); ranks: one node ", topo_.oneNode, ", distinct GPUs ", topo_.distinctGpus,
                ", one process per rank ", topo_.oneProcessPerRank, ", NCCL built ",
                topo_.ncclBuilt);
  }

  const char* run(const CollArgs& a) override {
    const int me = comm_.rank(), n = comm_.size();
    const int dev = callDevice(a, me);
    if (dev >= 0 && dev != device_) {
      fail(MTXCOMM_INVALID_ARGUMENT, "the buffers are on device ", dev,
           " but this communicator's device calls run on device ", device_,
           " (the device of its first call on device buffers)");
    }
    DeviceGuard guard(device_);
    auto stream = static_cast<cudaStream_t>(a.stream);
    if (n == 1 || a.count == 0) {
      if (a.count > 0 && a.sendbuf && a.recvbuf && a.sendbuf != a.recvbuf) {
        MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(a.recvbuf, a.sendbuf, a.count * datatypeSize(a.dtype),
                                           cudaMemcpyDefault, stream));
      }
      return "local";
    }
    const DevicePathChoice choice = chooseDevicePath(a, topo_, comm_.config().cudaPath);
    const char* name = devicePathName(choice.path);
    MTXCOMM_LOG(kDebug, me, collectiveName(a.coll), " ", a.count, " x ", datatypeName(a.dtype),
                " on device buffers: path ", name, " (", choice.why, ")");
    try {
      runner(choice.path).run(a, stream);
    } catch (const Error& e) {
      throw Error(e.code(), strCat("device path ", name, ": ", e.what()));
    }
    return name;
  }

 private:
  PathRunner& runner(DevicePath p) {
    auto& slot = runners_[static_cast<int>(p)];
    if (slot) return *slot;
    switch (p) {
      case DevicePath::kNccl:
        slot = makeNcclPath(comm_, device_);
        break;
      case DevicePath::kCudaIpc:
        slot = makeCudaIpcPath(comm_, device_, comm_.config().cudaIpcBytes);
        break;
      case DevicePath::kHostStaging:
        slot = makeHostStagingPath(comm_, comm_.config().cudaStagingBytes);
        break;
      case DevicePath::kUcxCuda:
        fail(MTXCOMM_UNSUPPORTED, devicePathDeclines(p, CollArgs{}, topo_));
    }
    return *slot;
  }

  Comm& comm_;
  int device_;
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

std::unique_ptr<DeviceComm> DeviceComm::create(Comm& comm, const CollArgs& firstCall) {
  int device = callDevice(firstCall, comm.rank());
  if (device < 0) MTXCOMM_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_unique<CudaDeviceComm>(comm, device);
}

void hostCollective(Comm& comm, const CollArgs& args) { comm.run(args); }

void hostAllgatherBytes(Comm& comm, const void* mine, void* all, size_t bytes) {
  CollArgs ag;
  ag.coll = Collective::kAllgather;
  ag.sendbuf = mine;
  ag.recvbuf = all;
  ag.count = bytes;
  ag.dtype = MTXCOMM_UINT8;
  comm.run(ag);
}

void hostBarrier(Comm& comm) {
  CollArgs b;
  b.coll = Collective::kBarrier;
  comm.run(b);
}

}  // namespace gpu
}  // namespace mtxcomm
