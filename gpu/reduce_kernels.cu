// CUDA reduction kernels: dst = s0 op s1 op ... op s(n-1) [/ divisor], every dtype and op (bool:
// SUM/MAX as OR and PROD/MIN as AND on 0/1, no AVG; as the host kernels, lib/base/reduce.h). The
// per-element codecs and ops are the host kernels' own (lib/base/reduce_ops.h).
//
// One grid-stride kernel per (type, op). Each thread loads 16 bytes from every source per step
// (uint4, when all pointers are 16-byte aligned), accumulates in the accumulation type (float32
// for float16/bfloat16, the type itself otherwise), divides once for AVG and stores 16 bytes;
// the tail (count not a multiple of 16 bytes) runs one element per thread. The kernel is
// memory-bound: it reads n x bytes and writes bytes (bench: mtxcomm_gpu_bench kernel row).
// Same pattern as NCCL's reduceCopy packs (src/device/common_kernel.h), without its
// warp-level pipelining.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gpu/cuda_check.h"
#include "gpu/reduce_kernels.h"
#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/reduce_ops.h"

namespace mtxcomm {
namespace gpu {

namespace {

using reduce_ops::CodecOf;
using reduce_ops::MaxOp;
using reduce_ops::MinOp;
using reduce_ops::ProdOp;
using reduce_ops::SumOp;

template <typename A>
__device__ A divideBy(A a, int divisor) {
  return a / static_cast<A>(divisor);  // integers: truncates toward zero
}

// Element i of the result, in the codec's compute type, divided when divisor > 1, stored once.
template <class Codec, class Op>
__device__ typename Codec::Storage reduceOne(const ReduceSources& src, size_t i, int divisor) {
  using S = typename Codec::Storage;
  typename Codec::Compute acc = Codec::load(static_cast<const S*>(src.p[0])[i]);
  for (int k = 1; k < src.n; ++k) {
    acc = Op::apply(acc, Codec::load(static_cast<const S*>(src.p[k])[i]));
  }
  if (divisor > 1) acc = divideBy(acc, divisor);
  return Codec::store(acc);
}

template <class Codec, class Op>
__global__ void reduceKernel(ReduceTargets dst, ReduceSources src, size_t count, int divisor,
                             bool vector) {
  using S = typename Codec::Storage;
  using Compute = typename Codec::Compute;
  constexpr int kPack = 16 / sizeof(S);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (vector) {
    const size_t packs = count / kPack;
    for (size_t v = tid; v < packs; v += stride) {
      Compute acc[kPack];
      uint4 raw = static_cast<const uint4*>(src.p[0])[v];
      const S* x = reinterpret_cast<const S*>(&raw);
#pragma unroll
      for (int j = 0; j < kPack; ++j) acc[j] = Codec::load(x[j]);
      for (int k = 1; k < src.n; ++k) {
        raw = static_cast<const uint4*>(src.p[k])[v];
#pragma unroll
        for (int j = 0; j < kPack; ++j) acc[j] = Op::apply(acc[j], Codec::load(x[j]));
      }
      uint4 out;
      S* y = reinterpret_cast<S*>(&out);
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        y[j] = Codec::store(divisor > 1 ? divideBy(acc[j], divisor) : acc[j]);
      }
      for (int d = 0; d < dst.n; ++d) reinterpret_cast<uint4*>(dst.p[d])[v] = out;
    }
    done = packs * kPack;
  }
  for (size_t i = done + tid; i < count; i += stride) {
    const S y = reduceOne<Codec, Op>(src, i, divisor);
    for (int d = 0; d < dst.n; ++d) static_cast<S*>(dst.p[d])[i] = y;
  }
}

template <class Codec, class Op>
void launchTyped(const ReduceTargets& dst, const ReduceSources& src, size_t count, int divisor,
                 cudaStream_t stream) {
  using S = typename Codec::Storage;
  bool aligned = true;
  for (int d = 0; d < dst.n; ++d)
    aligned = aligned && reinterpret_cast<uintptr_t>(dst.p[d]) % 16 == 0;
  for (int k = 0; k < src.n; ++k)
    aligned = aligned && reinterpret_cast<uintptr_t>(src.p[k]) % 16 == 0;
  constexpr int kThreads = 256;
  constexpr size_t kMaxBlocks = 4096;  // grid-stride beyond (H200: 132 SMs x 8 blocks = 1056)
  const size_t work = aligned ? count / (16 / sizeof(S)) + 16 : count;
  const unsigned blocks = static_cast<unsigned>(
      std::min(kMaxBlocks, std::max<size_t>(1, (work + kThreads - 1) / kThreads)));
  reduceKernel<Codec, Op><<<blocks, kThreads, 0, stream>>>(dst, src, count, divisor, aligned);
  checkCuda(cudaGetLastError(), "reduceKernel launch");
}

// T: the storage type of dispatchDatatype (lib/base/dtype.h).
template <typename T>
void launchOp(mtxcomm_op_t op, const ReduceTargets& dst, const ReduceSources& src, size_t count,
              int divisor, cudaStream_t stream) {
  using Codec = CodecOf<T>;
  if (op == MTXCOMM_ADASUM) {  // no elementwise kernel; refused before any device path runs
    fail(MTXCOMM_UNSUPPORTED, "device reduction: op adasum is not supported on device buffers");
  }
  if constexpr (std::is_same_v<T, BoolByte>) {
    if (divisor > 1) {
      fail(MTXCOMM_INVALID_ARGUMENT,
           "device reduction: op avg is not defined for datatype bool (a divisor of ", divisor,
           ")");
    }
    switch (op) {
      case MTXCOMM_SUM:
      case MTXCOMM_MAX:
      case MTXCOMM_PROD:
      case MTXCOMM_MIN:
        if (reduce_ops::boolReducesAsMax(op)) {
          return launchTyped<Codec, MaxOp>(dst, src, count, divisor, stream);  // OR
        }
        return launchTyped<Codec, MinOp>(dst, src, count, divisor, stream);  // AND
      default:
        fail(MTXCOMM_INVALID_ARGUMENT, "device reduction: invalid op ", static_cast<int>(op),
             " for bool");
    }
  } else {
    switch (op) {
      case MTXCOMM_SUM:
        return launchTyped<Codec, SumOp>(dst, src, count, divisor, stream);
      case MTXCOMM_PROD:
        return launchTyped<Codec, ProdOp>(dst, src, count, divisor, stream);
      case MTXCOMM_MIN:
        return launchTyped<Codec, MinOp>(dst, src, count, divisor, stream);
      case MTXCOMM_MAX:
        return launchTyped<Codec, MaxOp>(dst, src, count, divisor, stream);
      default:
        fail(MTXCOMM_INVALID_ARGUMENT, "device reduction: invalid op ", static_cast<int>(op));
    }
  }
}

}  // namespace

void launchReduce(mtxcomm_datatype_t dt, mtxcomm_op_t op, void* dst, const ReduceSources& src,
                  size_t count, int divisor, cudaStream_t stream) {
  ReduceTargets one;
  one.n = 1;
  one.p[0] = dst;
  launchReduce(dt, op, one, src, count, divisor, stream);
}

void launchReduce(mtxcomm_datatype_t dt, mtxcomm_op_t op, const ReduceTargets& dst,
                  const ReduceSources& src, size_t count, int divisor, cudaStream_t stream) {
  if (count == 0) return;
  if (dst.n < 1 || dst.n > kMaxReduceSources) {
    fail(MTXCOMM_INVALID_ARGUMENT, "device reduction: ", dst.n, " targets (1..", kMaxReduceSources,
         ")");
  }
  if (src.n < 1 || src.n > kMaxReduceSources) {
    fail(MTXCOMM_INVALID_ARGUMENT, "device reduction: ", src.n, " sources (1..", kMaxReduceSources,
         ")");
  }
  dispatchDatatype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launchOp<T>(op, dst, src, count, divisor, stream);
  });
}

}  // namespace gpu
}  // namespace mtxcomm
