// CPU reduction kernels (see reduce.h); the codecs and ops they apply per element are
// lib/base/reduce_ops.h, shared with the CUDA kernels (gpu/reduce_kernels.cu).
//
// Layout: each type-erased entry point validates its arguments, switches once on the datatype
// (and op), and runs one templated loop over the whole buffer. The loops are plain counted loops
// over __restrict pointers with branch-free bodies (selects, not branches), so GCC 12 -O3
// vectorises them for the baseline x86-64 target (SSE2) without -march flags.
//
// Vectorisation (GCC 12.2, -O3, checked with -fdump-tree-vect-details / -fopt-info-vec):
// - reduceBuffers: every dtype x {SUM, PROD, MIN, MAX} loop, in all three aliasing variants
//   (distinct, dst == a, dst == b), including float16/bfloat16 (widen, combine in float32,
//   round once, all in one loop). Exceptions in the SSE2 (default) clone only: int64/uint64
//   MIN/MAX need 64-bit compares (SSE4.2 pcmpgtq) and PROD a 64-bit multiply (the cost model
//   declines the pmuludq emulation); they run scalar there and vectorise in the AVX2 clone.
//   The dst == a == b loops (x op x) vectorise except int64 SUM/PROD in the SSE2 clone.
// - widenToFloat / narrowFromFloat: both 16-bit formats, both directions.
// - divideBuffer: float32/float64/float16/bfloat16, and int8/uint8/int16/uint16/int32 (exact
//   division through float/double, see divideBuffer). uint32/int64/uint64 use scalar integer
//   division: SIMD has no integer divide and the double trick is not exact for 64-bit values.
// - bool: reduced as bytes normalised to 0/1 (Logical, reduce_ops.h) with SUM/MAX as MAX (= OR) and
//   PROD/MIN as MIN (= AND), so it shares the vectorised uint8 MIN/MAX loops' shape.
//
// Aliasing: dst may equal a or b exactly. Each operation has separate loops for dst == a,
// dst == b and distinct buffers, so __restrict is only ever put on pointers that do not alias.
#include "lib/base/reduce.h"

#include <cstring>
#include <type_traits>

#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/reduce_ops.h"

namespace mtxcomm {
namespace {

using reduce_ops::Bfloat16;
using reduce_ops::bfloat16ToFloatInline;
using reduce_ops::CodecOf;
using reduce_ops::floatToBfloat16Inline;
using reduce_ops::floatToHalfInline;
using reduce_ops::Half;
using reduce_ops::halfToFloatInline;
using reduce_ops::Logical;
using reduce_ops::MaxOp;
using reduce_ops::MinOp;
using reduce_ops::ProdOp;
using reduce_ops::SumOp;

// ---- Loops --------------------------------------------------------------------------------

// Loops are kept out of line: one call per buffer, and -fopt-info/-fdump-tree-vect then report
// each instantiation by name. On x86-64 glibc each loop is also compiled a second time for AVX2
// and picked at load time by CPU detection (GCC target_clones, an ifunc): the portable build
// targets SSE2, where the 16-bit conversions and the int64 ops are 2-3x slower. The code is
// the same portable C++ in both clones; no intrinsics.
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && \
    !defined(__clang__)  // ifunc needs glibc; clang cannot combine clones with noinline
#define MTXCOMM_LOOP __attribute__((noinline, target_clones("avx2", "default")))
#else
#define MTXCOMM_LOOP __attribute__((noinline))
#endif

// 128 bytes per iteration as four 32-byte vectors of alignment 1 (unaligned loads and stores:
// AVX2 moves in the avx2 clone, pairs of SSE2 moves in the default one). The empty asm keeps
// GCC from turning the loop back into a call of memcpy.
typedef unsigned char Bytes32 __attribute__((vector_size(32), aligned(1), may_alias));

MTXCOMM_LOOP void copyBlocks(unsigned char* __restrict dst, const unsigned char* __restrict src,
                             size_t blocks) {
  for (size_t i = 0; i < blocks; ++i) {
    const Bytes32* s = reinterpret_cast<const Bytes32*>(src + i * 128);
    Bytes32* d = reinterpret_cast<Bytes32*>(dst + i * 128);
    const Bytes32 v0 = s[0], v1 = s[1], v2 = s[2], v3 = s[3];
    d[0] = v0;
    d[1] = v1;
    d[2] = v2;
    d[3] = v3;
    __asm__ volatile("" ::: "memory");
  }
}

template <class Codec, class Op>
MTXCOMM_LOOP void reduceDistinct(typename Codec::Storage* __restrict dst,
                                 const typename Codec::Storage* __restrict a,
                                 const typename Codec::Storage* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] = Codec::store(Op::apply(Codec::load(a[i]), Codec::load(b[i])));
  }
}

// x[i] = x[i] op b[i]  (dst == a)
template <class Codec, class Op>
MTXCOMM_LOOP void reduceIntoA(typename Codec::Storage* __restrict x,
                              const typename Codec::Storage* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    x[i] = Codec::store(Op::apply(Codec::load(x[i]), Codec::load(b[i])));
  }
}

// x[i] = a[i] op x[i]  (dst == b; operand order matters for the NaN rule)
template <class Codec, class Op>
MTXCOMM_LOOP void reduceIntoB(typename Codec::Storage* __restrict x,
                              const typename Codec::Storage* __restrict a, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    x[i] = Codec::store(Op::apply(Codec::load(a[i]), Codec::load(x[i])));
  }
}

// x[i] = x[i] op x[i]  (dst == a == b)
template <class Codec, class Op>
MTXCOMM_LOOP void reduceSelf(typename Codec::Storage* x, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const auto v = Codec::load(x[i]);
    x[i] = Codec::store(Op::apply(v, v));
  }
}

template <class Codec, class Op>
void reduceTyped(void* dstv, const void* av, const void* bv, size_t count) {
  using S = typename Codec::Storage;
  S* dst = static_cast<S*>(dstv);
  const S* a = static_cast<const S*>(av);
  const S* b = static_cast<const S*>(bv);
  if (dst == a && dst == b) {
    reduceSelf<Codec, Op>(dst, count);
  } else if (dst == a) {
    reduceIntoA<Codec, Op>(dst, b, count);
  } else if (dst == b) {
    reduceIntoB<Codec, Op>(dst, a, count);
  } else {
    reduceDistinct<Codec, Op>(dst, a, b, count);
  }
}

template <class Codec>
void reduceOp(mtxcomm_op_t op, void* dst, const void* a, const void* b, size_t count) {
  if constexpr (std::is_same_v<Codec, Logical>) {
    // On 0/1 values MAX is OR and MIN is AND: SUM/MAX = OR, PROD/MIN = AND.
    if (reduce_ops::boolReducesAsMax(op)) {
      reduceTyped<Codec, MaxOp>(dst, a, b, count);
    } else {
      reduceTyped<Codec, MinOp>(dst, a, b, count);
    }
  } else {
    switch (op) {
      case MTXCOMM_SUM:
        return reduceTyped<Codec, SumOp>(dst, a, b, count);
      case MTXCOMM_PROD:
        return reduceTyped<Codec, ProdOp>(dst, a, b, count);
      case MTXCOMM_MIN:
        return reduceTyped<Codec, MinOp>(dst, a, b, count);
      case MTXCOMM_MAX:
        return reduceTyped<Codec, MaxOp>(dst, a, b, count);
      default:
        break;  // validated by the caller
    }
  }
}

// ---- Adasum (adasumBuffers) ----------------------------------------------------------------

// Dot product and squared norms of two whole vectors, in double. Eight interleaved partial sums
// (element i goes to lane i % 8, lanes added pairwise in a fixed order): a fixed order, so the
// same inputs give the same bits on every rank, and independent lanes the compiler can put in
// SIMD registers without reassociating anything.
struct AdasumDots {
  double ab = 0, aa = 0, bb = 0;
};

template <class Codec>
AdasumDots adasumDots(const typename Codec::Storage* a, const typename Codec::Storage* b,
                      size_t count) {
  constexpr size_t kLanes = 8;
  double ab[kLanes] = {}, aa[kLanes] = {}, bb[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double x = static_cast<double>(Codec::load(a[i + j]));
      const double y = static_cast<double>(Codec::load(b[i + j]));
      ab[j] += x * y;
      aa[j] += x * x;
      bb[j] += y * y;
    }
  }
  for (size_t j = 0; i < count; ++i, ++j) {
    const double x = static_cast<double>(Codec::load(a[i]));
    const double y = static_cast<double>(Codec::load(b[i]));
    ab[j] += x * y;
    aa[j] += x * x;
    bb[j] += y * y;
  }
  auto total = [](const double* s) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  };
  return {total(ab), total(aa), total(bb)};
}

// dst[i] = ca * a[i] + cb * b[i] in double, rounded once to the storage type (16-bit ones
// through float32). dst may equal a or b: each element is read before it is written.
template <class Codec>
void adasumCombine(typename Codec::Storage* dst, const typename Codec::Storage* a,
                   const typename Codec::Storage* b, size_t count, double ca, double cb) {
  using C = typename Codec::Compute;
  for (size_t i = 0; i < count; ++i) {
    const double v =
        ca * static_cast<double>(Codec::load(a[i])) + cb * static_cast<double>(Codec::load(b[i]));
    dst[i] = Codec::store(static_cast<C>(v));
  }
}

template <class Codec>
void adasumTyped(void* dst, const void* av, const void* bv, size_t count) {
  using S = typename Codec::Storage;
  const S* a = static_cast<const S*>(av);
  const S* b = static_cast<const S*>(bv);
  const AdasumDots d = adasumDots<Codec>(a, b, count);
  // A zero vector's coefficient is 1 (its term is zero anyway, and the other vector is kept).
  const double ca = d.aa == 0 ? 1.0 : 1.0 - d.ab / (2.0 * d.aa);
  const double cb = d.bb == 0 ? 1.0 : 1.0 - d.ab / (2.0 * d.bb);
  adasumCombine<Codec>(static_cast<S*>(dst), a, b, count, ca, cb);
}

// Integer division by a positive divisor through floating point: exact (truncating toward zero)
// whenever |x| < 2^(mantissa bits + 1) of F. F's quotient is the correctly rounded x/d; its
// distance to the next integer is >= 1/d, more than half an ulp of it when |x| < 2^24 (float) or
// 2^53 (double), so the rounding cannot reach that integer and truncation gives trunc(x/d).
template <class T, class F>
MTXCOMM_LOOP void divideViaFloat(T* __restrict x, size_t count, F d) {
  for (size_t i = 0; i < count; ++i) {
    x[i] = static_cast<T>(static_cast<int32_t>(static_cast<F>(x[i]) / d));
  }
}

template <class T>
MTXCOMM_LOOP void divideInt(T* __restrict x, size_t count, T d) {
  for (size_t i = 0; i < count; ++i) x[i] = x[i] / d;
}

// A divisor that is a power of two divides as a multiplication by its reciprocal, which is
// exact (2^-k is representable), so x * 2^-k and x / 2^k are the same real number rounded once:
// the same bits, subnormals, infinities and NaNs included. A vector multiply costs a fraction
// of a vector divide (AVX-512: about 1 cycle against 5-10 per 16 floats); the averages of 2, 4
// and 8 ranks take this path.
inline bool isPowerOfTwo(int d) { return d > 0 && (d & (d - 1)) == 0; }

template <class T>
MTXCOMM_LOOP void scaleFloat(T* __restrict x, size_t count, T s) {
  for (size_t i = 0; i < count; ++i) x[i] = x[i] * s;
}

template <class T>
MTXCOMM_LOOP void divideFloat(T* __restrict x, size_t count, T d) {
  for (size_t i = 0; i < count; ++i) x[i] = x[i] / d;
}

template <class Codec>
MTXCOMM_LOOP void scaleHalf(uint16_t* __restrict x, size_t count, float s) {
  for (size_t i = 0; i < count; ++i) x[i] = Codec::store(Codec::load(x[i]) * s);
}

template <class Codec>
MTXCOMM_LOOP void divideHalf(uint16_t* __restrict x, size_t count, float d) {
  for (size_t i = 0; i < count; ++i) x[i] = Codec::store(Codec::load(x[i]) / d);
}

template <class Codec>
MTXCOMM_LOOP void widen(const uint16_t* __restrict in, float* __restrict out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = Codec::load(in[i]);
}

template <class Codec>
MTXCOMM_LOOP void narrow(const float* __restrict in, uint16_t* __restrict out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = Codec::store(in[i]);
}

[[noreturn]] void failDatatype(const char* fn, mtxcomm_datatype_t dt) {
  fail(MTXCOMM_INVALID_ARGUMENT, fn, ": invalid datatype ", static_cast<int>(dt));
}

void checkHalfType(const char* fn, mtxcomm_datatype_t dt) {
  if (!isHalfType(dt)) {
    fail(MTXCOMM_INVALID_ARGUMENT, fn, ": datatype ", static_cast<int>(dt), " (", datatypeName(dt),
         ") is not float16 or bfloat16");
  }
}

}  // namespace

void reduceBuffers(mtxcomm_datatype_t dt, mtxcomm_op_t op, void* dst, const void* a, const void* b,
                   size_t count) {
  if (!isValidDatatype(dt)) failDatatype("reduceBuffers", dt);
  if (op == MTXCOMM_AVG) {
    fail(MTXCOMM_INVALID_ARGUMENT,
         "reduceBuffers: op avg is not a reduction kernel (the caller applies AVG as SUM "
         "followed by divideBuffer)");
  }
  if (op == MTXCOMM_ADASUM) {
    fail(MTXCOMM_INVALID_ARGUMENT,
         "reduceBuffers: op adasum is not an elementwise reduction (allreduce runs it as the "
         "adasum algorithm, over adasumBuffers)");
  }
  if (!isValidOp(op)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "reduceBuffers: invalid op ", static_cast<int>(op));
  }
  if (count == 0) return;
  dispatchDatatype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduceOp<CodecOf<T>>(op, dst, a, b, count);
  });
}

void adasumBuffers(mtxcomm_datatype_t dt, void* dst, const void* a, const void* b, size_t count) {
  if (!isFloatingType(dt)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "adasumBuffers: datatype ", static_cast<int>(dt), " (",
         datatypeName(dt), ") is not float16, bfloat16, float32 or float64");
  }
  if (count == 0) return;
  dispatchDatatype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Float16Bits> ||
                  std::is_same_v<T, Bfloat16Bits>) {
      adasumTyped<CodecOf<T>>(dst, a, b, count);
    }  // other types: refused above
  });
}

void divideBuffer(mtxcomm_datatype_t dt, void* x, size_t count, int divisor) {
  if (!isValidDatatype(dt)) failDatatype("divideBuffer", dt);
  if (const char* why = opDeclinesDatatype(MTXCOMM_AVG, dt)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "divideBuffer: ", why);
  }
  if (divisor <= 0) {
    fail(MTXCOMM_INVALID_ARGUMENT, "divideBuffer: divisor ", divisor, " is not positive");
  }
  if (count == 0) return;
  dispatchDatatype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(x);
    const bool pow2 = isPowerOfTwo(divisor);
    if constexpr (std::is_same_v<T, Float16Bits> || std::is_same_v<T, Bfloat16Bits>) {
      auto* h = static_cast<uint16_t*>(x);
      if (pow2) {
        scaleHalf<CodecOf<T>>(h, count, 1.0f / static_cast<float>(divisor));
      } else {
        divideHalf<CodecOf<T>>(h, count, static_cast<float>(divisor));
      }
    } else if constexpr (std::is_same_v<T, BoolByte>) {
      // refused above
    } else if constexpr (std::is_floating_point_v<T>) {
      if (pow2) {
        scaleFloat(p, count, static_cast<T>(1) / static_cast<T>(divisor));
      } else {
        divideFloat(p, count, static_cast<T>(divisor));
      }
    } else if constexpr (sizeof(T) <= 2) {
      divideViaFloat(p, count, static_cast<float>(divisor));  // |x| < 2^16: exact in float
    } else if constexpr (std::is_same_v<T, int32_t>) {
      divideViaFloat(p, count, static_cast<double>(divisor));
    } else {
      divideInt(p, count, static_cast<T>(divisor));
    }
  });
}

float halfToFloat(uint16_t h) { return halfToFloatInline(h); }
uint16_t floatToHalf(float f) { return floatToHalfInline(f); }
float bfloat16ToFloat(uint16_t b) { return bfloat16ToFloatInline(b); }
uint16_t floatToBfloat16(float f) { return floatToBfloat16Inline(f); }

void widenToFloat(mtxcomm_datatype_t dt, const uint16_t* in, float* out, size_t count) {
  checkHalfType("widenToFloat", dt);
  if (dt == MTXCOMM_FLOAT16) {
    widen<Half>(in, out, count);
  } else {
    widen<Bfloat16>(in, out, count);
  }
}

void narrowFromFloat(mtxcomm_datatype_t dt, const float* in, uint16_t* out, size_t count) {
  checkHalfType("narrowFromFloat", dt);
  if (dt == MTXCOMM_FLOAT16) {
    narrow<Half>(in, out, count);
  } else {
    narrow<Bfloat16>(in, out, count);
  }
}

void storeElement(mtxcomm_datatype_t dt, void* buf, size_t i, double v) {
  dispatchDatatype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Float16Bits>) {
      static_cast<uint16_t*>(buf)[i] = floatToHalfInline(static_cast<float>(v));
    } else if constexpr (std::is_same_v<T, Bfloat16Bits>) {
      static_cast<uint16_t*>(buf)[i] = floatToBfloat16Inline(static_cast<float>(v));
    } else if constexpr (std::is_same_v<T, BoolByte>) {
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
    } else if constexpr (std::is_floating_point_v<T>) {
      static_cast<T*>(buf)[i] = static_cast<T>(v);
    } else {
      static_cast<T*>(buf)[i] = static_cast<T>(static_cast<int64_t>(v));
    }
  });
}

double loadElement(mtxcomm_datatype_t dt, const void* buf, size_t i) {
  return dispatchDatatype(dt, [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Float16Bits>) {
      return halfToFloatInline(static_cast<const uint16_t*>(buf)[i]);
    } else if constexpr (std::is_same_v<T, Bfloat16Bits>) {
      return bfloat16ToFloatInline(static_cast<const uint16_t*>(buf)[i]);
    } else if constexpr (std::is_same_v<T, BoolByte>) {
      return static_cast<const uint8_t*>(buf)[i] != 0 ? 1.0 : 0.0;
    } else {
      return static_cast<double>(static_cast<const T*>(buf)[i]);
    }
  });
}

void copyBytes(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (bytes < kCopyLoopBytes) {
    std::memcpy(d, s, bytes);
    return;
  }
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  copyBlocks(d, s, bytes / 128);
  const size_t done = bytes / 128 * 128;
  std::memcpy(d + done, s + done, bytes - done);
}

}  // namespace mtxcomm
