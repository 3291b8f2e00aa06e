#include "gpu/cuda_ipc.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>

#include "gpu/cuda_check.h"
#include "gpu/device_paths.h"

namespace mtxcomm {

namespace {
struct IpcHandles {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t event;
};
}  // namespace

CudaIpcGroup::CudaIpcGroup(gpu::HostCollectives& host, size_t scratchBytes)
    : host_(host), bytes_(scratchBytes) {
  const int n = host.size(), me = host.rank();
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
    host.allgatherBytes(&mine, all.data(), sizeof(IpcHandles));
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

namespace {

// The start of the allocation holding p (cudaIpcGetMemHandle takes allocation bases only),
// through the driver's cuMemGetAddressRange, found at run time (no link to libcuda).
char* allocationBase(const void* p) {
  static PFN_cuMemGetAddressRange_v3020 getRange = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    gpu::checkCuda(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                    cudaEnableDefault, &found),
                   "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)");
    if (found != cudaDriverEntryPointSuccess || !fn) {
      fail(MTXCOMM_CUDA_ERROR, "cuMemGetAddressRange is not available from the driver");
    }
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
  }();
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult r = getRange(&base, &size, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) fail(MTXCOMM_CUDA_ERROR, "cuMemGetAddressRange failed (CUresult ", r, ")");
  return reinterpret_cast<char*>(base);
}

struct BufferHandle {
  cudaIpcMemHandle_t handle;
  uint64_t offset;
  uint64_t present;
};

}  // namespace

std::vector<char*> CudaIpcGroup::exchangeBuffer(const void* ptr) {
  const int n = host_.size(), me = host_.rank();
  BufferHandle mine{};
  if (ptr) {
    char* base = allocationBase(ptr);
    MTXCOMM_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, base));
    mine.offset = static_cast<uint64_t>(static_cast<const char*>(ptr) - base);
    mine.present = 1;
  }
  std::vector<BufferHandle> all(n);
  host_.allgatherBytes(&mine, all.data(), sizeof(BufferHandle));
  // Peers' allocations come and go (a framework's caching allocator reuses them): bound the
  // cache, closing every mapping when it is full.
  constexpr size_t kMaxOpened = 256;
  std::vector<char*> out(n, nullptr);
  for (int r = 0; r < n; ++r) {
    if (!all[r].present) continue;
    if (r == me) {
      out[r] = const_cast<char*>(static_cast<const char*>(ptr));
      continue;
    }
    std::string key(reinterpret_cast<const char*>(&all[r].handle), sizeof(cudaIpcMemHandle_t));
    char* base = nullptr;
    if (auto it = opened_.find(key); it != opened_.end()) {
      base = it->second;
    } else {
      if (opened_.size() >= kMaxOpened) {
        for (auto& [k, p] : opened_) cudaIpcCloseMemHandle(p);
        opened_.clear();
      }
      void* p = nullptr;
      try {
        MTXCOMM_CUDA_CHECK(cudaIpcOpenMemHandle(&p, all[r].handle, cudaIpcMemLazyEnablePeerAccess));
      } catch (const Error& e) {
        fail(e.code(), "mapping a buffer of peer rank ", r, ": ", e.what());
      }
      base = static_cast<char*>(p);
      opened_.emplace(key, base);
    }
    out[r] = base + all[r].offset;
  }
  return out;
}

// Local and best effort (destroy is not collective): every rank destroys its communicator
// after the last collective, so no peer reads this scratch any more.
void CudaIpcGroup::release() {
  const int me = host_.rank();
  for (auto& [key, p] : opened_) cudaIpcCloseMemHandle(p);
  opened_.clear();
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
  const int me = host_.rank();
  MTXCOMM_CUDA_CHECK(cudaEventRecord(event_[me], stream));
  host_.barrier();
  for (size_t r = 0; r < event_.size(); ++r) {
    if (static_cast<int>(r) != me) MTXCOMM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_[r], 0));
  }
}

}  // namespace mtxcomm
