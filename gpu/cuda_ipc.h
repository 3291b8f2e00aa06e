// CUDA IPC between the processes of one node: every rank's device scratch buffer, mapped by
// every peer (cudaIpcGetMemHandle / cudaIpcOpenMemHandle), and one interprocess event per rank
// that orders the phases of a collective across the ranks' streams without blocking on the
// GPU. Works when several ranks share one GPU and when each has its own (peer access is
// enabled lazily by the open). Handles are exchanged once, by an allgather over the
// communicator's host transport.
#ifndef MTXCOMM_GPU_CUDA_IPC_H_
#define MTXCOMM_GPU_CUDA_IPC_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "gpu/device.h"

namespace mtxcomm {

class CudaIpcGroup {
 public:
  // Collective over host (every rank in its own process on this node): allocates
  // scratchBytes on the current device and maps every peer's. Throws MTXCOMM_CUDA_ERROR
  // naming the call and the peer.
  CudaIpcGroup(gpu::HostCollectives& host, size_t scratchBytes);
  ~CudaIpcGroup();
  CudaIpcGroup(const CudaIpcGroup&) = delete;
  CudaIpcGroup& operator=(const CudaIpcGroup&) = delete;

  // Rank r's scratch as this process addresses it (its own, or a peer's mapping).
  char* scratch(int r) const { return scratch_[r]; }
  size_t scratchBytes() const { return bytes_; }

  // Every rank's view of a device buffer each rank passes (bufs[r] for rank r, this rank's
  // own pointer for itself): collective, an allgather of (IPC handle of the allocation,
  // offset) over the host transport; peers' allocations are opened once and cached by handle.
  // ptr may be NULL (then NULL for that rank).
  std::vector<char*> exchangeBuffer(const void* ptr);

  // Starts a call on stream: it waits for every rank's last recorded phase (earlier calls,
  // maybe on other streams, may still read or write the scratch buffers).
  void beginCall(cudaStream_t stream);
  // Ends a phase: records this rank's event on stream, waits on the host until every rank has
  // recorded its own (a host barrier: enqueueing only, the GPU work runs on), then makes
  // stream wait for every peer's event. After it, what any rank's stream did before the phase
  // end is visible to this rank's later work on stream.
  void endPhase(cudaStream_t stream);

 private:
  void release();

  gpu::HostCollectives& host_;
  size_t bytes_;
  std::vector<char*> scratch_;
  std::vector<cudaEvent_t> event_;       // [rank]: own one created, peers' opened
  std::map<std::string, char*> opened_;  // peers' user allocations, by IPC handle bytes
};

}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_CUDA_IPC_H_
