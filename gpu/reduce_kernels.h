// CUDA reduction kernels for every datatype and op (type-erased entry point; the templates
// live in reduce_kernels.cu only).
#ifndef MTXCOMM_GPU_REDUCE_KERNELS_H_
#define MTXCOMM_GPU_REDUCE_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace gpu {

constexpr int kMaxReduceSources = 16;

// Device pointers the kernel reads, in order (the result is ((s0 op s1) op s2) ...).
struct ReduceSources {
  const void* p[kMaxReduceSources] = {};
  int n = 0;
};

// Where the result goes: every p[k] receives the same values (the cuda_ipc allreduce writes
// each reduced slice straight into every rank's recvbuf).
struct ReduceTargets {
  void* p[kMaxReduceSources] = {};
  int n = 0;
};

// Enqueues on stream: dst[i] = op over k of src.p[k][i] for i in [0, count), then, when
// divisor > 1, dst[i] /= divisor (AVG). op is SUM, PROD, MIN or MAX. The numbers are the
// host kernels' (lib/base/reduce.h; the same codecs and ops, lib/base/reduce_ops.h): integer
// SUM/PROD wrap, MIN/MAX propagate NaN, float16 and bfloat16 accumulate every source and the
// division in float32 and round once; integer division truncates toward zero. dst may be one of the
// sources (same pointer). When every pointer is 16-byte aligned the kernel loads and stores 16
// bytes at a time. Throws MTXCOMM_CUDA_ERROR when the launch fails, MTXCOMM_INVALID_ARGUMENT for a
// bad dtype or op, MTXCOMM_UNSUPPORTED for op ADASUM (host buffers only).
void launchReduce(mtxcomm_datatype_t dt, mtxcomm_op_t op, void* dst, const ReduceSources& src,
                  size_t count, int divisor, cudaStream_t stream);
// The same, writing the result to every target (each may also be one of the sources, as long
// as no source is read after a target that aliases it is written: element i is read from
// every source before it is written anywhere).
void launchReduce(mtxcomm_datatype_t dt, mtxcomm_op_t op, const ReduceTargets& dst,
                  const ReduceSources& src, size_t count, int divisor, cudaStream_t stream);

}  // namespace gpu
}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_REDUCE_KERNELS_H_
