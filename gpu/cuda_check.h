// CUDA error checks for the library's CUDA code: a failed call becomes
// mtxcomm::Error(MTXCOMM_CUDA_ERROR) naming the call and CUDA's message.
#ifndef MTXCOMM_GPU_CUDA_CHECK_H_
#define MTXCOMM_GPU_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "lib/base/error.h"

namespace mtxcomm {
namespace gpu {

inline void checkCuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  fail(MTXCOMM_CUDA_ERROR, call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
       ")");
}

// Sets the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    checkCuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) checkCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace gpu
}  // namespace mtxcomm

// MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(...)): throws naming the call's text.
#define MTXCOMM_CUDA_CHECK(call) ::mtxcomm::gpu::checkCuda((call), #call)

#endif  // MTXCOMM_GPU_CUDA_CHECK_H_
