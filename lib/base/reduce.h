// CPU reduction kernels. Type-erased entry points; the templates live in reduce.cc, the
// per-element codecs and ops (shared with the CUDA kernels) in reduce_ops.h.
//
// Numbers (the library's contract, ../include/mtxcomm/mtxcomm.h):
// - integer SUM and PROD wrap (two's complement, computed in the unsigned type);
// - bool (one byte, nonzero is true) is logical: SUM and MAX are OR, PROD and MIN are AND, and
//   every byte written is 0 or 1; AVG (divideBuffer) is refused;
// - MIN and MAX propagate NaN (if either operand is NaN the result is that NaN, the first
//   operand's NaN when both are); otherwise the usual comparison;
// - float16 and bfloat16 operands are converted to float32, combined, and rounded to nearest
//   even once. (The collectives widen 16-bit types to float32 for the whole reduction so that a
//   multi-rank sum is rounded only once; these 16-bit kernels serve pairwise use.)
// Kernels are written so GCC/Clang auto-vectorise them (-O3, checked with -fopt-info-vec).
#ifndef MTXCOMM_LIB_REDUCE_H_
#define MTXCOMM_LIB_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {

// dst[i] = a[i] (op) b[i] for i in [0, count). dst may be the same pointer as a or b (not a
// partial overlap). op is SUM, PROD, MIN or MAX (AVG is SUM followed by divideBuffer; ADASUM is
// no elementwise reduction: adasumBuffers below).
// Throws mtxcomm::Error(MTXCOMM_INVALID_ARGUMENT) for an invalid datatype or op, AVG or ADASUM.
void reduceBuffers(mtxcomm_datatype_t dt, mtxcomm_op_t op, void* dst, const void* a, const void* b,
                   size_t count);

// dst = adasum(a, b), the adaptive sum of Maleki et al. (MLSys 2021) of two whole vectors of
// count elements: dst[i] = ca * a[i] + cb * b[i] with ca = 1 - a.b / (2 |a|^2) and
// cb = 1 - a.b / (2 |b|^2) (ca = 1 when |a| = 0, cb = 1 when |b| = 0). The dot product and both
// squared norms are accumulated in double (8 interleaved partial sums, added in a fixed order);
// the combination is computed in double and rounded once to dt (float16/bfloat16 through
// float32). dt is FLOAT16, BFLOAT16, FLOAT32 or FLOAT64; dst may be the same pointer as a or b
// (not a partial overlap). The pair is symmetric, and so are its bits (IEEE + and * commute and
// both coefficients are computed alike); callers still pass the operands in the order the op
// defines (the lower rank's vector first, MTXCOMM_ADASUM in include/mtxcomm/mtxcomm.h).
// Throws MTXCOMM_INVALID_ARGUMENT for any other datatype.
void adasumBuffers(mtxcomm_datatype_t dt, void* dst, const void* a, const void* b, size_t count);

// x[i] = x[i] / divisor. Integers truncate toward zero and keep the type; floating types divide
// in their own type (float16/bfloat16 in float32, rounded once). divisor > 0. Throws
// MTXCOMM_INVALID_ARGUMENT for bool (AVG is not defined on it).
void divideBuffer(mtxcomm_datatype_t dt, void* x, size_t count, int divisor);

// dst[0, bytes) = src[0, bytes) (no overlap): the copy of every shared-memory collective.
// Below kCopyLoopBytes it is memcpy; from there a loop of 128-byte blocks of unaligned vector
// loads and stores (AVX2 where the CPU has it, SSE2 otherwise), the destination aligned to 32
// bytes first. Why not memcpy throughout: from about 2 KiB glibc's x86-64 memcpy switches to
// `rep movsb`, which on AMD Zen CPUs without FSRM copied a slot written by another process's
// core at 1.2-1.6 GB/s for 16-64 KiB (a 16 KiB shm broadcast took 13 us, 2.4 us with vector
// moves; glibc bug 30994 describes the same `rep movsb` slow path); the vector loop stays at
// cache speed there and matches memcpy elsewhere (bench/RESULTS.md, "Copy kernel").
constexpr size_t kCopyLoopBytes = 2048;
void copyBytes(void* dst, const void* src, size_t bytes);

// IEEE binary16 <-> binary32, round to nearest even; NaN stays NaN, overflow gives Inf.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
// bfloat16 <-> binary32, round to nearest even; NaN stays a (quiet) NaN.
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

// Bulk conversions for the widening of 16-bit types: out[i] = convert(in[i]).
// dt is MTXCOMM_FLOAT16 or MTXCOMM_BFLOAT16.
void widenToFloat(mtxcomm_datatype_t dt, const uint16_t* in, float* out, size_t count);
void narrowFromFloat(mtxcomm_datatype_t dt, const float* in, uint16_t* out, size_t count);

// Element i of buf (datatype dt) set to v: integers through int64_t (truncated toward zero,
// then wrapped to the type), floating types rounded to nearest (16-bit ones from float32); bool
// stores the byte as uint8 would (so 2 stores the non-canonical true 0x02).
// For test data, benchmarks and bindings; not a kernel.
void storeElement(mtxcomm_datatype_t dt, void* buf, size_t i, double v);
// Element i of buf as a double (16-bit floats through float32; bool as 0 or 1).
double loadElement(mtxcomm_datatype_t dt, const void* buf, size_t i);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_REDUCE_H_
