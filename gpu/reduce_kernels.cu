// CUDA reduction kernels: dst = s0 op s1 op ... op s(n-1) [/ divisor], every dtype and op (bool:
// SUM/MAX as OR and PROD/MIN as AND on 0/1, no AVG; as the host kernels, lib/base/reduce.h).
//
// One grid-stride kernel per (type, op). Each thread loads 16 bytes from every source per step
// (uint4, when all pointers are 16-byte aligned), accumulates in the accumulation type (float32
// for float16/bfloat16, the type itself otherwise), divides once for AVG and stores 16 bytes;
// the tail (count not a multiple of 16 bytes) runs one element per thread. The kernel is
// memory-bound: it reads n x bytes and writes bytes (bench: mtxcomm_gpu_bench kernel row).
// Same pattern as NCCL's reduceCopy packs (src/device/common_kernel.h), without its
// warp-level pipelining.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "gpu/cuda_check.h"
#include "gpu/reduce_kernels.h"
#include "lib/base/dtype.h"

namespace mtxcomm {
namespace gpu {

namespace {

// The device type of each storage type of dispatchDatatype (lib/base/dtype.h).
template <typename T>
struct DeviceTypeT {
  using type = T;
};
template <>
struct DeviceTypeT<Float16Bits> {
  using type = __half;
};
template <>
struct DeviceTypeT<Bfloat16Bits> {
  using type = __nv_bfloat16;
};
template <typename T>
using DeviceType = typename DeviceTypeT<T>::type;

// Element access: load converts to the accumulation type, store rounds back once.
template <typename T>
struct Elem {
  using Acc = T;
  __device__ static Acc load(T v) { return v; }
  __device__ static T store(Acc a) { return a; }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float a) { return __float2half_rn(a); }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float a) { return __float2bfloat16_rn(a); }
};
// bool: any nonzero byte is true; accumulated as 0/1, where MAX is OR and MIN is AND (launchOp
// maps the ops), so every byte written is 0 or 1.
template <>
struct Elem<BoolByte> {
  using Acc = uint8_t;
  __device__ static uint8_t load(BoolByte v) { return v.byte != 0; }
  __device__ static BoolByte store(uint8_t a) { return BoolByte{a}; }
};

// Integers compute in the unsigned type, so SUM and PROD wrap (two's complement).
template <typename A>
__device__ A wrapAdd(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename A>
__device__ A wrapMul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<A>(static_cast<U>(static_cast<W>(a) * static_cast<W>(b)));
  } else {
    return a * b;
  }
}

struct OpSum {
  template <typename A>
  __device__ static A apply(A a, A b) {
    return wrapAdd(a, b);
  }
};
struct OpProd {
  template <typename A>
  __device__ static A apply(A a, A b) {
    return wrapMul(a, b);
  }
};
// NaN propagates: the first operand's NaN when both are.
struct OpMin {
  template <typename A>
  __device__ static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return b < a ? b : a;
  }
};
struct OpMax {
  template <typename A>
  __device__ static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? b : a;
  }
};

template <typename A>
__device__ A divideBy(A a, int divisor) {
  return a / static_cast<A>(divisor);  // integers: truncates toward zero
}

template <typename T, class Op>
__device__ T reduceOne(const ReduceSources& src, size_t i, int divisor) {
  using E = Elem<T>;
  typename E::Acc acc = E::load(static_cast<const T*>(src.p[0])[i]);
  for (int k = 1; k < src.n; ++k) acc = Op::apply(acc, E::load(static_cast<const T*>(src.p[k])[i]));
  if (divisor > 1) acc = divideBy(acc, divisor);
  return E::store(acc);
}

template <typename T, class Op>
__global__ void reduceKernel(ReduceTargets dst, ReduceSources src, size_t count, int divisor,
                             bool vector) {
  using E = Elem<T>;
  using Acc = typename E::Acc;
  constexpr int kPack = 16 / sizeof(T);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (vector) {
    const size_t packs = count / kPack;
    for (size_t v = tid; v < packs; v += stride) {
      Acc acc[kPack];
      uint4 raw = static_cast<const uint4*>(src.p[0])[v];
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPack; ++j) acc[j] = E::load(x[j]);
      for (int k = 1; k < src.n; ++k) {
        raw = static_cast<const uint4*>(src.p[k])[v];
#pragma unroll
        for (int j = 0; j < kPack; ++j) acc[j] = Op::apply(acc[j], E::load(x[j]));
      }
      uint4 out;
      T* y = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        y[j] = E::store(divisor > 1 ? divideBy(acc[j], divisor) : acc[j]);
      }
      for (int d = 0; d < dst.n; ++d) reinterpret_cast<uint4*>(dst.p[d])[v] = out;
    }
    done = packs * kPack;
  }
  for (size_t i = done + tid; i < count; i += stride) {
    const T y = reduceOne<T, Op>(src, i, divisor);
    for (int d = 0; d < dst.n; ++d) static_cast<T*>(dst.p[d])[i] = y;
  }
}

template <typename T, class Op>
void launchTyped(const ReduceTargets& dst, const ReduceSources& src, size_t count, int divisor,
                 cudaStream_t stream) {
  bool aligned = true;
  for (int d = 0; d < dst.n; ++d)
    aligned = aligned && reinterpret_cast<uintptr_t>(dst.p[d]) % 16 == 0;
  for (int k = 0; k < src.n; ++k)
    aligned = aligned && reinterpret_cast<uintptr_t>(src.p[k]) % 16 == 0;
  constexpr int kThreads = 256;
  constexpr size_t kMaxBlocks = 4096;  // grid-stride beyond (H200: 132 SMs x 8 blocks = 1056)
  const size_t work = aligned ? count / (16 / sizeof(T)) + 16 : count;
  const unsigned blocks = static_cast<unsigned>(
      std::min(kMaxBlocks, std::max<size_t>(1, (work + kThreads - 1) / kThreads)));
  reduceKernel<T, Op><<<blocks, kThreads, 0, stream>>>(dst, src, count, divisor, aligned);
  checkCuda(cudaGetLastError(), "reduceKernel launch");
}

template <typename T>
void launchOp(mtxcomm_op_t op, const ReduceTargets& dst, const ReduceSources& src, size_t count,
              int divisor, cudaStream_t stream) {
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
        return launchTyped<T, OpMax>(dst, src, count, divisor, stream);  // OR
      case MTXCOMM_PROD:
      case MTXCOMM_MIN:
        return launchTyped<T, OpMin>(dst, src, count, divisor, stream);  // AND
      default:
        fail(MTXCOMM_INVALID_ARGUMENT, "device reduction: invalid op ", static_cast<int>(op),
             " for bool");
    }
  } else {
    switch (op) {
      case MTXCOMM_SUM:
        return launchTyped<T, OpSum>(dst, src, count, divisor, stream);
      case MTXCOMM_PROD:
        return launchTyped<T, OpProd>(dst, src, count, divisor, stream);
      case MTXCOMM_MIN:
        return launchTyped<T, OpMin>(dst, src, count, divisor, stream);
      case MTXCOMM_MAX:
        return launchTyped<T, OpMax>(dst, src, count, divisor, stream);
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
    launchOp<DeviceType<T>>(op, dst, src, count, divisor, stream);
  });
}

}  // namespace gpu
}  // namespace mtxcomm
