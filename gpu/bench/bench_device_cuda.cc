#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "bench/bench_device.h"

namespace mtxcomm {
namespace bench {

namespace {
void ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(e));
  }
}
}  // namespace

void* deviceStream(int rank) {
  int n = 0;
  ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  if (n == 0) throw std::runtime_error("-d cuda: no CUDA device visible");
  ok(cudaSetDevice(rank % n), "cudaSetDevice");
  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void destroyDeviceStream(void* stream) { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }
void* deviceAlloc(size_t bytes) {
  void* p = nullptr;
  ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
void deviceFree(void* p) { cudaFree(p); }
void copyToDevice(void* dst, const void* src, size_t bytes) {
  ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
void copyToHost(void* dst, const void* src, size_t bytes) {
  ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}
void streamSync(void* stream) {
  ok(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

}  // namespace bench
}  // namespace mtxcomm
