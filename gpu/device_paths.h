// The device paths behind DeviceComm (gpu/device.h), as the CUDA build compiles them. Each
// runs one call on device buffers, stream-ordered on the call's stream: it waits for earlier
// work on that stream (by enqueueing after it, or through events) and never synchronises the
// device; only host_staging waits on the host, for its own copies on that stream.
#ifndef MTXCOMM_GPU_DEVICE_PATHS_H_
#define MTXCOMM_GPU_DEVICE_PATHS_H_

#include <cuda_runtime.h>

#include <memory>

#include "gpu/device.h"
#include "lib/base/call.h"

namespace mtxcomm {
namespace gpu {

class PathRunner {
 public:
  virtual ~PathRunner() = default;
  // args: user-level (AVG, 16-bit types as given), device buffers, count > 0, more than 1 rank.
  virtual void run(const CollArgs& args, cudaStream_t stream) = 0;
};

// NCCL (gpu/path_nccl.cc, or gpu/nccl_none.cc without NCCL). Collective over host: rank 0
// makes the unique id and broadcasts it.
bool ncclBuilt();
// This process loaded NCCL (gpu/nccl_api.h; false without NCCL in the build).
bool ncclLoaded();
// This process's NCCL may run several ranks on one GPU: 2.30+ and NCCL_MULTI_RANK_GPU_ENABLE=1.
bool ncclSharesGpus();
std::unique_ptr<PathRunner> makeNcclPath(HostCollectives& host, int device);
// CUDA IPC (gpu/path_cuda_ipc.cc over gpu/cuda_ipc.h). Collective over host.
std::unique_ptr<PathRunner> makeCudaIpcPath(HostCollectives& host, int device, size_t scratchBytes);
// Pinned host staging (gpu/path_host_staging.cc). Local.
std::unique_ptr<PathRunner> makeHostStagingPath(HostCollectives& host, size_t chunkBytes);

}  // namespace gpu
}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_DEVICE_PATHS_H_
