// The reduction operations, one definition for the CPU kernels (lib/base/reduce.cc) and the CUDA
// kernels (gpu/reduce_kernels.cu): how a stored element becomes the compute type and back (the
// codecs: float16 and bfloat16 widened to float32 and rounded once, bool as 0/1) and the ops
// (integer SUM and PROD wrap, MIN and MAX propagate NaN, bool's SUM/MAX as OR and PROD/MIN as
// AND). The numbers are the library's contract (lib/base/reduce.h).
//
// Everything a kernel calls per element is MTXCOMM_HOST_DEVICE (lib/base/host_device.h) and
// written as branch-free selects, so that GCC -O3 vectorises the host loops (reduce.cc) and the
// device compiles the same definitions. The 16-bit conversions below are the host's (bit
// arithmetic that vectorises for SSE2 and AVX2); the device converts with its own instructions.
#ifndef MTXCOMM_LIB_BASE_REDUCE_OPS_H_
#define MTXCOMM_LIB_BASE_REDUCE_OPS_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lib/base/dtype.h"
#include "lib/base/host_device.h"
#include "mtxcomm/mtxcomm.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace mtxcomm::reduce_ops {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- 16-bit float conversions of the host (branch-free so the bulk loops vectorise) ---------

// All-ones if c, else zero. The half conversions combine their cases with these masks rather
// than ?: because GCC (-ftrapping-math) otherwise sinks the floating-point step of the
// subnormal case into a branch and then refuses to if-convert, and the loop stays scalar.
inline uint32_t maskIf(bool c) { return 0u - static_cast<uint32_t>(c); }

inline float halfToFloatInline(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int32_t em = h & 0x7fff;  // exponent and mantissa
  // Normal: shift into place and rebias the exponent (15 -> 127).
  const uint32_t normal =
      (static_cast<uint32_t>(em) << 13) + (static_cast<uint32_t>(127 - 15) << 23);
  // Inf or NaN: all-ones exponent; NaN keeps its payload and becomes quiet.
  const uint32_t infNan =
      (static_cast<uint32_t>(em) << 13) | 0x7f800000u | (maskIf(em > 0x7c00) & 0x00400000u);
  // Zero or subnormal: mantissa * 2^-24, exact in float32 and never a float subnormal (so
  // FTZ/DAZ modes do not matter).
  const uint32_t sub = floatBits(static_cast<float>(em) * 0x1p-24f);
  const uint32_t isSub = maskIf(em < 0x0400);
  const uint32_t isSpecial = maskIf(em >= 0x7c00);
  const uint32_t bits = (sub & isSub) | (infNan & isSpecial) | (normal & ~(isSub | isSpecial));
  return bitsFloat(bits | sign);
}

inline uint16_t floatToHalfInline(float f) {
  const uint32_t u = floatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t a = static_cast<int32_t>(u & 0x7fffffffu);  // |f| as bits
  // NaN: quiet NaN keeping the top 9 payload bits.
  const uint32_t nan = 0x7e00u | ((static_cast<uint32_t>(a) >> 13) & 0x3ffu);
  // Normal half range [2^-14, 65536): rebias the exponent and round the 13 dropped bits to
  // nearest even; a carry out of the mantissa correctly bumps the exponent (up to Inf).
  const uint32_t normal = (static_cast<uint32_t>(a) - (static_cast<uint32_t>(127 - 15) << 23) +
                           0xfffu + ((static_cast<uint32_t>(a) >> 13) & 1u)) >>
                          13;
  // Below 2^-14 (half subnormals and zero): adding 0.5f aligns the half subnormal ulp (2^-24)
  // with float's ulp at 0.5, so the float adder rounds to nearest even for us. (Under DAZ a
  // float subnormal input reads as 0, which is also its correctly rounded half.)
  const float kMagic = 0.5f;
  const uint32_t sub = floatBits(bitsFloat(static_cast<uint32_t>(a)) + kMagic) - floatBits(kMagic);
  const uint32_t isSub = maskIf(a < 0x38800000);  // < 2^-14
  const uint32_t isNan = maskIf(a > 0x7f800000);
  const uint32_t isInf = maskIf(a >= 0x47800000) & ~isNan;  // >= 65536, and Inf itself
  const uint32_t r =
      (sub & isSub) | (nan & isNan) | (0x7c00u & isInf) | (normal & ~(isSub | isNan | isInf));
  return static_cast<uint16_t>(r | sign);
}

inline float bfloat16ToFloatInline(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  const int32_t a = static_cast<int32_t>(u & 0x7fffffffu);
  return bitsFloat(a > 0x7f800000 ? (u | 0x00400000u) : u);  // NaN -> quiet NaN
}

inline uint16_t floatToBfloat16Inline(float f) {
  const uint32_t u = floatBits(f);
  const int32_t a = static_cast<int32_t>(u & 0x7fffffffu);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest even, may hit Inf
  const uint32_t nan = (u >> 16) | 0x0040u;                         // quiet, keeps sign/payload
  return static_cast<uint16_t>(a > 0x7f800000 ? nan : rounded);
}

// ---- Element codecs: how a stored element becomes the compute type and back ----------------

template <class T>
struct Plain {
  using Storage = T;
  using Compute = T;
  MTXCOMM_HOST_DEVICE static Compute load(Storage x) { return x; }
  MTXCOMM_HOST_DEVICE static Storage store(Compute x) { return x; }
};

// float16 and bfloat16: widened to float32, rounded to nearest even once when stored. On the
// device the hardware's conversions (cvt) do it; they differ from the functions above only in
// the payload and sign of a NaN, which stays a NaN either way.
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  MTXCOMM_HOST_DEVICE static float load(uint16_t x) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(x));
#else
    return halfToFloatInline(x);
#endif
  }
  MTXCOMM_HOST_DEVICE static uint16_t store(float x) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(x));
#else
    return floatToHalfInline(x);
#endif
  }
};

struct Bfloat16 {
  using Storage = uint16_t;
  using Compute = float;
  MTXCOMM_HOST_DEVICE static float load(uint16_t x) {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__ushort_as_bfloat16(x));
#else
    return bfloat16ToFloatInline(x);
#endif
  }
  MTXCOMM_HOST_DEVICE static uint16_t store(float x) {
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
    return floatToBfloat16Inline(x);
#endif
  }
};

// bool: any nonzero byte is true; computed as 0/1, so MAX is OR and MIN is AND, and every result
// written is 0 or 1.
struct Logical {
  using Storage = uint8_t;
  using Compute = uint8_t;
  MTXCOMM_HOST_DEVICE static uint8_t load(uint8_t x) { return static_cast<uint8_t>(x != 0); }
  MTXCOMM_HOST_DEVICE static uint8_t store(uint8_t x) { return x; }
};

// The codec of each storage type of dispatchDatatype (lib/base/dtype.h).
template <class T>
struct CodecOfT {
  using type = Plain<T>;
};
template <>
struct CodecOfT<Float16Bits> {
  using type = Half;
};
template <>
struct CodecOfT<Bfloat16Bits> {
  using type = Bfloat16;
};
template <>
struct CodecOfT<BoolByte> {
  using type = Logical;
};
template <class T>
using CodecOf = typename CodecOfT<T>::type;

// ---- Operations ---------------------------------------------------------------------------

// Integer SUM/PROD compute in the unsigned type (wraps, no signed-overflow UB); the conversion
// back to a signed type is modular (defined in C++20, and by GCC/Clang before). Types narrower
// than unsigned int compute in unsigned int: they would otherwise promote to (signed) int.
template <class T>
using WrapType =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct SumOp {
  template <class T>
  MTXCOMM_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = WrapType<T>;
      return static_cast<T>(
          static_cast<std::make_unsigned_t<T>>(static_cast<W>(a) + static_cast<W>(b)));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <class T>
  MTXCOMM_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // 16-bit operands must not promote to int: 65535 * 65535 overflows it.
      using W = WrapType<T>;
      return static_cast<T>(
          static_cast<std::make_unsigned_t<T>>(static_cast<W>(a) * static_cast<W>(b)));
    } else {
      return a * b;
    }
  }
};

// Floats: NaN propagates (a's NaN if a is NaN, else b's if b is NaN: a < b is then false).
// Written as a select, not std::min, so it vectorises and keeps the NaN rule.
struct MinOp {
  template <class T>
  MTXCOMM_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? a : b;
    } else {
      return ((a != a) | (a < b)) ? a : b;
    }
  }
};

struct MaxOp {
  template <class T>
  MTXCOMM_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a > b ? a : b;
    } else {
      return ((a != a) | (a > b)) ? a : b;
    }
  }
};

// bool's ops, on the 0/1 values of Logical: SUM and MAX reduce as MaxOp (OR), PROD and MIN as
// MinOp (AND).
constexpr bool boolReducesAsMax(mtxcomm_op_t op) { return op == MTXCOMM_SUM || op == MTXCOMM_MAX; }

}  // namespace mtxcomm::reduce_ops

#endif  // MTXCOMM_LIB_BASE_REDUCE_OPS_H_
