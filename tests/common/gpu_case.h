// One closed-form test case (common/test_data.h) on device buffers: the host CaseBuffers are
// mirrored in device memory, and the copies in, the call and the copy back are all enqueued
// on one stream, synchronised once at the end, so a call that is not stream-ordered shows as
// wrong data. The output lands in the host buffers, for checkOutput. CUDA builds only.
#ifndef MTXCOMM_TESTS_COMMON_GPU_CASE_H_
#define MTXCOMM_TESTS_COMMON_GPU_CASE_H_

#include <cuda_runtime.h>

#include <string>

#include "common/test_data.h"

namespace mtxcomm {
namespace testdata {

// The device copies of a CaseBuffers, at the same offsets.
struct DeviceCaseBuffers {
  char* send = nullptr;
  char* recv = nullptr;
  const char* sendArg = nullptr;
  char* recvArg = nullptr;
  cudaError_t error = cudaSuccess;  // of the allocations

  explicit DeviceCaseBuffers(const CaseBuffers& b) {
    error = cudaMalloc(&send, b.sendStore.size());
    if (error == cudaSuccess) error = cudaMalloc(&recv, b.recvStore.size());
    sendArg = translate(b, b.sendArg);
    recvArg = const_cast<char*>(translate(b, b.recvArg));
  }
  ~DeviceCaseBuffers() {
    cudaFree(send);
    cudaFree(recv);
  }
  DeviceCaseBuffers(const DeviceCaseBuffers&) = delete;
  DeviceCaseBuffers& operator=(const DeviceCaseBuffers&) = delete;

  const char* translate(const CaseBuffers& b, const char* p) const {
    const char* s = b.sendStore.data();
    if (p >= s && p < s + b.sendStore.size()) return send + (p - s);
    return recv + (p - b.recvStore.data());
  }
};

// Runs c on device buffers on stream; returns the call's result, or MTXCOMM_CUDA_ERROR with
// *why set when a CUDA call of the test itself failed.
inline mtxcomm_result_t runCaseOnDevice(const Case& c, CaseBuffers& b, mtxcomm_comm_t comm,
                                        int rank, cudaStream_t stream, std::string* why) {
  DeviceCaseBuffers d(b);
  auto ok = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess && why->empty()) *why = std::string(what) + ": " + cudaGetErrorString(e);
    return e == cudaSuccess;
  };
  if (!ok(d.error, "cudaMalloc") ||
      !ok(cudaMemcpyAsync(d.send, b.sendStore.data(), b.sendStore.size(), cudaMemcpyHostToDevice,
                          stream),
          "copy in") ||
      !ok(cudaMemcpyAsync(d.recv, b.recvStore.data(), b.recvStore.size(), cudaMemcpyHostToDevice,
                          stream),
          "copy in")) {
    return MTXCOMM_CUDA_ERROR;
  }
  const mtxcomm_result_t rc = callCollective(c, comm, rank, d.sendArg, d.recvArg, stream);
  if (rc != MTXCOMM_SUCCESS) return rc;
  if (!ok(cudaMemcpyAsync(b.recvStore.data(), d.recv, b.recvStore.size(), cudaMemcpyDeviceToHost,
                          stream),
          "copy out") ||
      !ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) {
    return MTXCOMM_CUDA_ERROR;
  }
  return MTXCOMM_SUCCESS;
}

}  // namespace testdata
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_GPU_CASE_H_
