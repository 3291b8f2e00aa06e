// The device paths behind DeviceComm (gpu/device.h), as the CUDA build compiles them. Each
// runs one call on device buffers, stream-ordered on the call's stream: it waits for earlier
// work on that stream (by enqueueing after it, or through events) and never synchronises the
// device; only host_staging waits on the host, for its own copies on that stream.
#ifndef MTXCOMM_GPU_DEVICE_PATHS_H_
#define MTXCOMM_GPU_DEVICE_PATHS_H_

#include <cuda_runtime.h>

#include <memory>

#include "algos/registry.h"

namespace mtxcomm {

class Comm;

namespace gpu {

class PathRunner {
 public:
  virtual ~PathRunner() = default;
  // args: user-level (AVG, 16-bit types as given), device buffers, count > 0, more than 1 rank.
  virtual void run(const CollArgs& args, cudaStream_t stream) = 0;
};

// The host collectives a path may use (bootstrap of NCCL and IPC, barriers between stream
// phases, the staged collectives): comm's own, over its host transport.
void hostCollective(Comm& comm, const CollArgs& args);
// all[r * bytes ..] = rank r's mine (bytes each): identities and handles between ranks.
void hostAllgatherBytes(Comm& comm, const void* mine, void* all, size_t bytes);
void hostBarrier(Comm& comm);

// NCCL (algos/device_nccl.cc, or gpu/nccl_none.cc without NCCL). Collective over comm: rank 0
// makes the unique id and broadcasts it over comm.
bool ncclBuilt();
std::unique_ptr<PathRunner> makeNcclPath(Comm& comm, int device);
// CUDA IPC (algos/device_cuda_ipc.cc over transports/cuda/cuda_ipc.h). Collective over comm.
std::unique_ptr<PathRunner> makeCudaIpcPath(Comm& comm, int device, size_t scratchBytes);
// Pinned host staging (gpu/staging.cc). Local.
std::unique_ptr<PathRunner> makeHostStagingPath(Comm& comm, size_t chunkBytes);

}  // namespace gpu
}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_DEVICE_PATHS_H_
