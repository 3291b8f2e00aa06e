#include "transports/cuda/cuda_ipc.h"

#include <cstring>

#include "gpu/cuda_check.h"
#include "gpu/device_paths.h"
#include "lib/comm.h"

namespace mtxcomm {

namespace {
struct IpcHandles {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t event;
};
}  // namespace

CudaIpcGroup::CudaIpcGroup(Comm& comm, size_t scratchBytes) : comm_(comm), bytes_(scratchBytes) {
  const int n = comm.size(), me = comm.rank();
  scratch_.assign(n, nullptr);
  event_.assign(n, nullptr);
  try {
    MTXCOMM_CUDA_CHECK(cudaMalloc(&scratch_[me], bytes_));
    MTXCOMM_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_[me], cudaEventDisableTiming | cudaEventInterprocess));
    IpcHandles mine{};
    MTXCOMM_CUDA_CHECK(cudaIpcGetMemHandle(&mine.mem, scratch_[me]));
    MTXCOMM_CUDA_CHECK(cudaIpcGetEventHandle(&mine.event, event_[me]));
    std::vector<IpcHandles> all(n);
    CollArgs ag;
    ag.coll = Collective::kAllgather;
    ag.sendbuf = &mine;
    ag.recvbuf = all.data();
    ag.count = sizeof(IpcHandles);
    ag.dtype = MTXCOMM_UINT8;
    gpu::hostCollective(comm, ag);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      void* p = nullptr;
      try {
        MTXCOMM_CUDA_CHECK(cudaIpcOpenMemHandle(&p, all[r].mem, cudaIpcMemLazyEnablePeerAccess));
        scratch_[r] = static_cast<char*>(p);
        MTXCOMM_CUDA_CHECK(cudaIpcOpenEventHandle(&event_[r], all[r].event));
      } catch (const Error& e) {
        fail(e.code(), "mapping the scratch buffer of peer rank ", r, ": ", e.what());
      }
    }
  } catch (...) {
    release();
    throw;
  }
}

CudaIpcGroup::~CudaIpcGroup() { release(); }

// Local and best effort (destroy is not collective): every rank destroys its communicator
// after the last collective, so no peer reads this scratch any more.
void CudaIpcGroup::release() {
  const int me = comm_.rank();
  for (size_t r = 0; r < scratch_.size(); ++r) {
    if (event_[r]) cudaEventDestroy(event_[r]);
    event_[r] = nullptr;
    if (!scratch_[r]) continue;
    if (static_cast<int>(r) == me) {
      cudaFree(scratch_[r]);
    } else {
      cudaIpcCloseMemHandle(scratch_[r]);
    }
    scratch_[r] = nullptr;
  }
}

void CudaIpcGroup::beginCall(cudaStream_t stream) {
  for (cudaEvent_t e : event_) MTXCOMM_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
}

void CudaIpcGroup::endPhase(cudaStream_t stream) {
  const int me = comm_.rank();
  MTXCOMM_CUDA_CHECK(cudaEventRecord(event_[me], stream));
  gpu::hostBarrier(comm_);
  for (size_t r = 0; r < event_.size(); ++r) {
    if (static_cast<int>(r) != me) MTXCOMM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_[r], 0));
  }
}

}  // namespace mtxcomm
