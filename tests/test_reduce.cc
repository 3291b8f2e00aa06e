// Tests for the CPU reduction kernels and the datatype tables (lib/base/reduce.h,
// lib/base/dtype.h). Every expectation is computed here by a straightforward scalar reference that
// does not share code with the kernels: integer results in 128-bit arithmetic reduced mod 2^bits,
// 16-bit float conversions by searching the sorted table of representable values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/base/dtype.h"
#include "lib/base/reduce.h"
#include "mtxcomm/mtxcomm.hpp"

namespace mtxcomm {
namespace {

constexpr mtxcomm_op_t kOps[] = {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX};
constexpr size_t kCounts[] = {1, 3, 17, 300, 1031};

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T>
bool sameBits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// ---- Reference 16-bit conversions ----------------------------------------------------------

// Exact value of a finite binary16 / bfloat16 bit pattern (sign bit clear), as a double.
double halfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
}
double bf16Value(uint16_t b) {
  return static_cast<double>(floatOf(static_cast<uint32_t>(b) << 16));
}

// Positive representable values in increasing order, then the "value" at which the format
// overflows, treated as Inf's position for rounding: IEEE rounds to Inf exactly when
// round-to-nearest-even against max and max + ulp(max) would pick the latter.
struct Table {
  std::vector<double> values;  // index == bit pattern (sign clear), last entry: Inf position
};
const Table& halfTable() {
  static const Table t = [] {
    Table r;
    for (uint32_t h = 0; h < 0x7c00; ++h) r.values.push_back(halfValue(static_cast<uint16_t>(h)));
    r.values.push_back(65536.0);  // 0x7c00
    return r;
  }();
  return t;
}
const Table& bf16Table() {
  static const Table t = [] {
    Table r;
    for (uint32_t b = 0; b < 0x7f80; ++b) r.values.push_back(bf16Value(static_cast<uint16_t>(b)));
    r.values.push_back(std::ldexp(1.0, 128));  // 0x7f80
    return r;
  }();
  return t;
}

// Round |x| (finite or Inf, not NaN) to nearest, ties to even bit pattern, by table search.
uint16_t roundByTable(const Table& t, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double v = std::fabs(static_cast<double>(x));
  const auto& vals = t.values;
  if (v >= vals.back()) return sign | static_cast<uint16_t>(vals.size() - 1);
  // First value > v; the candidates are the one before (<= v) and this one.
  const size_t hi = std::upper_bound(vals.begin(), vals.end(), v) - vals.begin();
  const size_t lo = hi - 1;
  if (vals[lo] == v) return sign | static_cast<uint16_t>(lo);
  const double dlo = v - vals[lo], dhi = vals[hi] - v;
  size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint16_t>(pick);
}

uint16_t refFloatToHalf(float x) {
  if (std::isnan(x)) return 0x7e00;  // any quiet NaN; callers check NaN-ness only
  return roundByTable(halfTable(), x);
}
uint16_t refFloatToBf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  return roundByTable(bf16Table(), x);
}
float refHalfToFloat(uint16_t h) {
  const float s = (h & 0x8000) ? -1.0f : 1.0f;
  if ((h & 0x7c00) == 0x7c00) {
    return (h & 0x3ff) ? std::numeric_limits<float>::quiet_NaN()
                       : s * std::numeric_limits<float>::infinity();
  }
  return s * static_cast<float>(halfValue(h & 0x7fff));
}
float refBf16ToFloat(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

bool isHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool isBf16Nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// ---- Reference reductions ------------------------------------------------------------------

template <class T>
T refIntOp(mtxcomm_op_t op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  const __int128 x = a, y = b;
  switch (op) {
    case MTXCOMM_SUM:
      return static_cast<T>(static_cast<U>(static_cast<unsigned __int128>(x + y)));
    case MTXCOMM_PROD:
      return static_cast<T>(
          static_cast<U>(static_cast<unsigned __int128>(x) * static_cast<unsigned __int128>(y)));
    case MTXCOMM_MIN:
      return x <= y ? a : b;
    default:
      return x >= y ? a : b;
  }
}

template <class F>
F refFloatOp(mtxcomm_op_t op, F a, F b) {
  switch (op) {
    case MTXCOMM_SUM:
      return a + b;
    case MTXCOMM_PROD:
      return a * b;
    case MTXCOMM_MIN:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return b < a ? b : (a < b ? a : b);  // equal (incl. +-0): the second operand
    default:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return b > a ? b : (a > b ? a : b);
  }
}

// ---- Input generation ----------------------------------------------------------------------

template <class T>
std::vector<T> intInputs(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  const T special[] = {0,
                       1,
                       static_cast<T>(-1),
                       std::numeric_limits<T>::max(),
                       std::numeric_limits<T>::min(),
                       static_cast<T>(std::numeric_limits<T>::max() - 1),
                       2,
                       3};
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    if (r % 4 == 0) {
      v[i] = special[(r >> 8) % 8];
    } else if (r % 4 == 1) {
      v[i] = static_cast<T>(static_cast<int64_t>((r >> 8) % 21) - 10);  // small: exact products
    } else {
      v[i] = static_cast<T>(r >> 3);
    }
  }
  return v;
}

template <class F>
std::vector<F> floatInputs(size_t n, uint32_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1000.0, 1000.0);
  const F inf = std::numeric_limits<F>::infinity();
  const F sp[] = {std::numeric_limits<F>::quiet_NaN(),
                  -std::numeric_limits<F>::quiet_NaN(),
                  inf,
                  -inf,
                  F(0),
                  -F(0),
                  std::numeric_limits<F>::denorm_min(),
                  F(1)};
  std::vector<F> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    v[i] = (specials && r % 8 == 0) ? sp[(r >> 8) % 8] : static_cast<F>(dist(rng));
  }
  return v;
}

std::vector<uint16_t> sixteenBitInputs(size_t n, uint32_t seed, bool bf16, bool specials) {
  std::vector<float> f = floatInputs<float>(n, seed, specials);
  std::vector<uint16_t> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) {
    v[i] = bf16 ? refFloatToBf16(f[i]) : refFloatToHalf(f[i] / 16.0f);
    if (specials && rng() % 10 == 0) v[i] = static_cast<uint16_t>(rng());  // any bit pattern
  }
  return v;
}

// ---- Per-dtype checks ----------------------------------------------------------------------

// Runs dst = a op b in the three aliasing arrangements and returns each result.
template <class S>
std::vector<std::vector<S>> runAllArrangements(mtxcomm_datatype_t dt, mtxcomm_op_t op,
                                               const std::vector<S>& a, const std::vector<S>& b) {
  const size_t n = a.size();
  std::vector<S> out(n, S(0x55)), inA = a, inB = b;
  reduceBuffers(dt, op, out.data(), a.data(), b.data(), n);
  reduceBuffers(dt, op, inA.data(), inA.data(), b.data(), n);  // dst == a
  reduceBuffers(dt, op, inB.data(), a.data(), inB.data(), n);  // dst == b
  return {out, inA, inB};
}

template <class T>
void checkIntType(mtxcomm_datatype_t dt) {
  for (size_t n : kCounts) {
    const auto a = intInputs<T>(n, 1 + static_cast<uint32_t>(n));
    const auto b = intInputs<T>(n, 7 + static_cast<uint32_t>(n));
    for (mtxcomm_op_t op : kOps) {
      SCOPED_TRACE(std::string(datatypeName(dt)) + " " + opName(op) + " n=" + std::to_string(n));
      for (const auto& got : runAllArrangements(dt, op, a, b)) {
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(got[i], refIntOp<T>(op, a[i], b[i]))
              << "i=" << i << " a=" << +a[i] << " b=" << +b[i];
        }
      }
    }
  }
}

template <class F>
void checkFloatType(mtxcomm_datatype_t dt) {
  for (size_t n : kCounts) {
    const auto a = floatInputs<F>(n, 3 + static_cast<uint32_t>(n), true);
    const auto b = floatInputs<F>(n, 5 + static_cast<uint32_t>(n), true);
    for (mtxcomm_op_t op : kOps) {
      SCOPED_TRACE(std::string(datatypeName(dt)) + " " + opName(op) + " n=" + std::to_string(n));
      for (const auto& got : runAllArrangements(dt, op, a, b)) {
        for (size_t i = 0; i < n; ++i) {
          const F want = refFloatOp<F>(op, a[i], b[i]);
          if (std::isnan(want) && (op == MTXCOMM_SUM || op == MTXCOMM_PROD)) {
            ASSERT_TRUE(std::isnan(got[i])) << "i=" << i << " a=" << a[i] << " b=" << b[i];
          } else {
            // MIN/MAX return an operand unchanged: bitwise, NaN payload and sign of zero too.
            ASSERT_TRUE(sameBits(got[i], want)) << "i=" << i << " a=" << a[i] << " b=" << b[i]
                                                << " got=" << got[i] << " want=" << want;
          }
        }
      }
    }
  }
}

void checkSixteenBitType(mtxcomm_datatype_t dt) {
  const bool bf16 = dt == MTXCOMM_BFLOAT16;
  auto toF = [&](uint16_t x) { return bf16 ? refBf16ToFloat(x) : refHalfToFloat(x); };
  auto fromF = [&](float x) { return bf16 ? refFloatToBf16(x) : refFloatToHalf(x); };
  auto isNan = [&](uint16_t x) { return bf16 ? isBf16Nan(x) : isHalfNan(x); };
  const uint16_t quietBit = bf16 ? 0x0040 : 0x0200;
  for (size_t n : kCounts) {
    const auto a = sixteenBitInputs(n, 11 + static_cast<uint32_t>(n), bf16, true);
    const auto b = sixteenBitInputs(n, 13 + static_cast<uint32_t>(n), bf16, true);
    for (mtxcomm_op_t op : kOps) {
      SCOPED_TRACE(std::string(datatypeName(dt)) + " " + opName(op) + " n=" + std::to_string(n));
      for (const auto& got : runAllArrangements(dt, op, a, b)) {
        for (size_t i = 0; i < n; ++i) {
          const bool minMax = op == MTXCOMM_MIN || op == MTXCOMM_MAX;
          if (minMax && isNan(a[i])) {
            ASSERT_EQ(got[i], a[i] | quietBit) << "i=" << i;  // a's NaN, made quiet
          } else if (minMax && isNan(b[i])) {
            ASSERT_EQ(got[i], b[i] | quietBit) << "i=" << i;
          } else {
            // Widen both to float32, combine in float32, round once.
            const uint16_t want = fromF(refFloatOp<float>(op, toF(a[i]), toF(b[i])));
            if (isNan(want)) {
              ASSERT_TRUE(isNan(got[i])) << "i=" << i << " a=" << a[i] << " b=" << b[i];
            } else {
              ASSERT_EQ(got[i], want) << "i=" << i << " a=" << a[i] << " b=" << b[i];
            }
          }
        }
      }
    }
  }
}

TEST(ReduceBuffers, Int8) { checkIntType<int8_t>(MTXCOMM_INT8); }
TEST(ReduceBuffers, Uint8) { checkIntType<uint8_t>(MTXCOMM_UINT8); }
TEST(ReduceBuffers, Int16) { checkIntType<int16_t>(MTXCOMM_INT16); }
TEST(ReduceBuffers, Uint16) { checkIntType<uint16_t>(MTXCOMM_UINT16); }
TEST(ReduceBuffers, Int32) { checkIntType<int32_t>(MTXCOMM_INT32); }
TEST(ReduceBuffers, Uint32) { checkIntType<uint32_t>(MTXCOMM_UINT32); }
TEST(ReduceBuffers, Int64) { checkIntType<int64_t>(MTXCOMM_INT64); }
TEST(ReduceBuffers, Uint64) { checkIntType<uint64_t>(MTXCOMM_UINT64); }
TEST(ReduceBuffers, Float32) { checkFloatType<float>(MTXCOMM_FLOAT32); }
TEST(ReduceBuffers, Float64) { checkFloatType<double>(MTXCOMM_FLOAT64); }
TEST(ReduceBuffers, Float16) { checkSixteenBitType(MTXCOMM_FLOAT16); }
TEST(ReduceBuffers, Bfloat16) { checkSixteenBitType(MTXCOMM_BFLOAT16); }

// bool: random bytes, a third of them 0 and many non-canonical trues; every op against the
// logical reference (SUM/MAX: OR, PROD/MIN: AND), in every aliasing arrangement, and every
// byte written is 0 or 1.
TEST(ReduceBuffers, Bool) {
  const uint8_t trues[] = {1, 0x02, 0x80, 0xff, 0x7f};
  auto inputs = [&](size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (uint8_t& x : v) {
      const uint32_t r = rng();
      x = r % 3 == 0 ? 0 : (r % 3 == 1 ? trues[(r >> 8) % 5] : static_cast<uint8_t>(r >> 16));
    }
    return v;
  };
  for (size_t n : kCounts) {
    const auto a = inputs(n, 21 + static_cast<uint32_t>(n));
    const auto b = inputs(n, 23 + static_cast<uint32_t>(n));
    for (mtxcomm_op_t op : kOps) {
      SCOPED_TRACE(std::string("bool ") + opName(op) + " n=" + std::to_string(n));
      const bool isAnd = op == MTXCOMM_PROD || op == MTXCOMM_MIN;
      for (const auto& got : runAllArrangements(MTXCOMM_BOOL, op, a, b)) {
        for (size_t i = 0; i < n; ++i) {
          const bool x = a[i] != 0, y = b[i] != 0;
          const uint8_t want = (isAnd ? (x && y) : (x || y)) ? 1 : 0;
          ASSERT_EQ(+got[i], +want) << "i=" << i << " a=" << +a[i] << " b=" << +b[i];
        }
      }
      // dst == a == b: x op x is x itself, written as 0 or 1.
      auto self = a;
      reduceBuffers(MTXCOMM_BOOL, op, self.data(), self.data(), self.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(+self[i], a[i] != 0 ? 1 : 0) << "i=" << i;
    }
  }
}

TEST(ReduceBuffers, BoolNonCanonicalTruesGiveOne) {
  auto one = [](mtxcomm_op_t op, uint8_t a, uint8_t b) {
    uint8_t out = 0x55;
    reduceBuffers(MTXCOMM_BOOL, op, &out, &a, &b, 1);
    return +out;
  };
  for (mtxcomm_op_t op : {MTXCOMM_SUM, MTXCOMM_MAX}) {  // OR
    SCOPED_TRACE(opName(op));
    EXPECT_EQ(one(op, 0x02, 0x00), 1);
    EXPECT_EQ(one(op, 0x00, 0xff), 1);
    EXPECT_EQ(one(op, 0xff, 0xff), 1);  // not 0xfe (a wrapping sum) nor 0xff
    EXPECT_EQ(one(op, 0x80, 0x80), 1);  // not 0 (a wrapping sum)
    EXPECT_EQ(one(op, 0x02, 0x01), 1);  // not 0x02 (a byte max) nor 0x03
    EXPECT_EQ(one(op, 0x00, 0x00), 0);
  }
  for (mtxcomm_op_t op : {MTXCOMM_PROD, MTXCOMM_MIN}) {  // AND
    SCOPED_TRACE(opName(op));
    EXPECT_EQ(one(op, 0x02, 0xff), 1);  // not 0x02 (a byte min) nor 0xfe (a wrapping product)
    EXPECT_EQ(one(op, 0x02, 0x80), 1);  // not 0 (a wrapping product: 0x100)
    EXPECT_EQ(one(op, 0xff, 0x00), 0);
    EXPECT_EQ(one(op, 0x00, 0x01), 0);
    EXPECT_EQ(one(op, 0x00, 0x00), 0);
  }
}

TEST(ReduceBuffers, IntegerWrap) {
  auto one = [](mtxcomm_datatype_t dt, mtxcomm_op_t op, auto a, auto b) {
    decltype(a) out{};
    reduceBuffers(dt, op, &out, &a, &b, 1);
    return out;
  };
  EXPECT_EQ(one(MTXCOMM_INT8, MTXCOMM_SUM, int8_t{127}, int8_t{1}), int8_t{-128});
  EXPECT_EQ(one(MTXCOMM_INT8, MTXCOMM_SUM, int8_t{-128}, int8_t{-1}), int8_t{127});
  EXPECT_EQ(one(MTXCOMM_INT8, MTXCOMM_PROD, int8_t{-128}, int8_t{-1}), int8_t{-128});
  EXPECT_EQ(one(MTXCOMM_INT8, MTXCOMM_PROD, int8_t{16}, int8_t{16}), int8_t{0});
  EXPECT_EQ(one(MTXCOMM_UINT8, MTXCOMM_SUM, uint8_t{255}, uint8_t{2}), uint8_t{1});
  EXPECT_EQ(one(MTXCOMM_UINT8, MTXCOMM_PROD, uint8_t{255}, uint8_t{255}), uint8_t{1});
  EXPECT_EQ(one(MTXCOMM_UINT8, MTXCOMM_PROD, uint8_t{16}, uint8_t{17}), uint8_t{16});
  EXPECT_EQ(one(MTXCOMM_INT16, MTXCOMM_SUM, int16_t{32767}, int16_t{1}), int16_t{-32768});
  EXPECT_EQ(one(MTXCOMM_INT16, MTXCOMM_SUM, int16_t{-32768}, int16_t{-1}), int16_t{32767});
  EXPECT_EQ(one(MTXCOMM_INT16, MTXCOMM_PROD, int16_t{-32768}, int16_t{-1}), int16_t{-32768});
  EXPECT_EQ(one(MTXCOMM_INT16, MTXCOMM_PROD, int16_t{256}, int16_t{256}), int16_t{0});
  EXPECT_EQ(one(MTXCOMM_INT16, MTXCOMM_PROD, int16_t{300}, int16_t{300}), int16_t{24464});
  EXPECT_EQ(one(MTXCOMM_INT16, MTXCOMM_MIN, int16_t{-32768}, int16_t{32767}), int16_t{-32768});
  EXPECT_EQ(one(MTXCOMM_UINT16, MTXCOMM_SUM, uint16_t{65535}, uint16_t{2}), uint16_t{1});
  // 65535 * 65535 overflows int, to which uint16_t operands would promote.
  EXPECT_EQ(one(MTXCOMM_UINT16, MTXCOMM_PROD, uint16_t{65535}, uint16_t{65535}), uint16_t{1});
  EXPECT_EQ(one(MTXCOMM_UINT16, MTXCOMM_PROD, uint16_t{40000}, uint16_t{3}), uint16_t{54464});
  EXPECT_EQ(one(MTXCOMM_UINT16, MTXCOMM_MAX, uint16_t{65535}, uint16_t{0}), uint16_t{65535});
  EXPECT_EQ(one(MTXCOMM_INT32, MTXCOMM_SUM, INT32_MAX, int32_t{1}), INT32_MIN);
  EXPECT_EQ(one(MTXCOMM_INT32, MTXCOMM_PROD, INT32_MIN, int32_t{-1}), INT32_MIN);
  EXPECT_EQ(one(MTXCOMM_INT32, MTXCOMM_PROD, int32_t{65536}, int32_t{65536}), 0);
  EXPECT_EQ(one(MTXCOMM_UINT32, MTXCOMM_SUM, UINT32_MAX, uint32_t{1}), 0u);
  EXPECT_EQ(one(MTXCOMM_INT64, MTXCOMM_SUM, INT64_MAX, int64_t{1}), INT64_MIN);
  EXPECT_EQ(one(MTXCOMM_INT64, MTXCOMM_PROD, INT64_MIN, int64_t{-1}), INT64_MIN);
  EXPECT_EQ(one(MTXCOMM_UINT64, MTXCOMM_PROD, UINT64_MAX, UINT64_MAX), uint64_t{1});
  EXPECT_EQ(one(MTXCOMM_INT64, MTXCOMM_MIN, INT64_MIN, INT64_MAX), INT64_MIN);
  EXPECT_EQ(one(MTXCOMM_UINT64, MTXCOMM_MAX, UINT64_MAX, uint64_t{0}), UINT64_MAX);
}

// NaN in either operand (or both) propagates through every op; MIN/MAX return a's NaN when
// both are NaN.
template <class F>
void checkNanFloat(mtxcomm_datatype_t dt) {
  const F nanA = std::numeric_limits<F>::quiet_NaN();
  const F nanB = -std::numeric_limits<F>::quiet_NaN();  // different bits (sign)
  const F one = F(1), big = std::numeric_limits<F>::max();
  const std::vector<F> a = {nanA, one, nanA, big, -big, nanA};
  const std::vector<F> b = {one, nanB, nanB, nanB, nanB, -std::numeric_limits<F>::infinity()};
  for (mtxcomm_op_t op : kOps) {
    std::vector<F> out(a.size());
    reduceBuffers(dt, op, out.data(), a.data(), b.data(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isnan(out[i])) << datatypeName(dt) << " " << opName(op) << " i=" << i;
    }
    if (op == MTXCOMM_MIN || op == MTXCOMM_MAX) {
      EXPECT_TRUE(sameBits(out[0], nanA));
      EXPECT_TRUE(sameBits(out[1], nanB));
      EXPECT_TRUE(sameBits(out[2], nanA));  // both NaN: the first operand's
      EXPECT_TRUE(sameBits(out[3], nanB));
    }
  }
}
TEST(ReduceBuffers, NanFloat32) { checkNanFloat<float>(MTXCOMM_FLOAT32); }
TEST(ReduceBuffers, NanFloat64) { checkNanFloat<double>(MTXCOMM_FLOAT64); }

void checkNanSixteen(mtxcomm_datatype_t dt, uint16_t one, uint16_t nanA, uint16_t nanB,
                     uint16_t quiet) {
  auto isNan = [&](uint16_t x) { return dt == MTXCOMM_BFLOAT16 ? isBf16Nan(x) : isHalfNan(x); };
  const std::vector<uint16_t> a = {nanA, one, nanA};
  const std::vector<uint16_t> b = {one, nanB, nanB};
  for (mtxcomm_op_t op : kOps) {
    std::vector<uint16_t> out(3);
    reduceBuffers(dt, op, out.data(), a.data(), b.data(), 3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(isNan(out[i])) << datatypeName(dt) << " " << opName(op) << " i=" << i;
      EXPECT_TRUE(out[i] & quiet) << "NaN not quiet";
    }
    if (op == MTXCOMM_MIN || op == MTXCOMM_MAX) {
      EXPECT_EQ(out[0], nanA | quiet);
      EXPECT_EQ(out[1], nanB | quiet);
      EXPECT_EQ(out[2], nanA | quiet);
    }
  }
}
TEST(ReduceBuffers, NanFloat16) {
  checkNanSixteen(MTXCOMM_FLOAT16, 0x3c00, 0x7e01, 0xfd55 /* signalling */, 0x0200);
}
TEST(ReduceBuffers, NanBfloat16) {
  checkNanSixteen(MTXCOMM_BFLOAT16, 0x3f80, 0x7fc1, 0xff81 /* signalling */, 0x0040);
}

TEST(ReduceBuffers, SixteenBitRoundsOnceInFloat32) {
  // float16: 2048 + 1 is not representable (ulp 2 at 2048): tie, rounds to even 2048.
  const uint16_t h2048 = 0x6800, h1 = 0x3c00, h3 = 0x4200;
  uint16_t out;
  reduceBuffers(MTXCOMM_FLOAT16, MTXCOMM_SUM, &out, &h2048, &h1, 1);
  EXPECT_EQ(out, h2048);
  reduceBuffers(MTXCOMM_FLOAT16, MTXCOMM_SUM, &out, &h2048, &h3, 1);
  EXPECT_EQ(out, floatToHalf(2052.0f));  // 2051 -> 2052
  const uint16_t hMax = 0x7bff;          // 65504 + 65504 overflows to Inf
  reduceBuffers(MTXCOMM_FLOAT16, MTXCOMM_SUM, &out, &hMax, &hMax, 1);
  EXPECT_EQ(out, 0x7c00);
  // bfloat16: 256 + 1 is a tie (ulp 2 at 256), rounds to even 256; 256 + 3 -> 260.
  const uint16_t b256 = floatToBfloat16(256.0f), b1 = 0x3f80, b3 = floatToBfloat16(3.0f);
  reduceBuffers(MTXCOMM_BFLOAT16, MTXCOMM_SUM, &out, &b256, &b1, 1);
  EXPECT_EQ(out, b256);
  reduceBuffers(MTXCOMM_BFLOAT16, MTXCOMM_SUM, &out, &b256, &b3, 1);
  EXPECT_EQ(bfloat16ToFloat(out), 260.0f);
}

TEST(ReduceBuffers, DstAliasesBothOperands) {
  std::vector<float> x = {1.5f, -2.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
  reduceBuffers(MTXCOMM_FLOAT32, MTXCOMM_SUM, x.data(), x.data(), x.data(), x.size());
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], -4.0f);
  EXPECT_TRUE(std::isnan(x[2]));
  std::vector<int8_t> y(1031, 100);
  reduceBuffers(MTXCOMM_INT8, MTXCOMM_SUM, y.data(), y.data(), y.data(), y.size());
  for (int8_t v : y) ASSERT_EQ(v, -56);  // 200 wraps
  std::vector<uint16_t> h(17, 0x3c00);   // float16 1.0
  reduceBuffers(MTXCOMM_FLOAT16, MTXCOMM_PROD, h.data(), h.data(), h.data(), h.size());
  for (uint16_t v : h) ASSERT_EQ(v, 0x3c00);
}

TEST(ReduceBuffers, CountZeroAcceptsNull) {
  for (int dt = 0; dt < MTXCOMM_NUM_DATATYPES; ++dt) {
    for (mtxcomm_op_t op : kOps) {
      EXPECT_NO_THROW(
          reduceBuffers(static_cast<mtxcomm_datatype_t>(dt), op, nullptr, nullptr, nullptr, 0));
    }
    if (dt == MTXCOMM_BOOL) continue;  // no AVG on bool, whatever the count (below)
    EXPECT_NO_THROW(divideBuffer(static_cast<mtxcomm_datatype_t>(dt), nullptr, 0, 3));
  }
  float x = 5.0f;
  reduceBuffers(MTXCOMM_FLOAT32, MTXCOMM_SUM, &x, &x, &x, 0);
  EXPECT_EQ(x, 5.0f);  // untouched
}

TEST(ReduceBuffers, WritesExactlyCountElements) {
  for (size_t n : kCounts) {
    std::vector<double> a(n + 8, 1.0), b(n + 8, 2.0), out(n + 8, -7.0);
    reduceBuffers(MTXCOMM_FLOAT64, MTXCOMM_SUM, out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 3.0);
    for (size_t i = n; i < n + 8; ++i) ASSERT_EQ(out[i], -7.0);
    std::vector<uint16_t> ha(n + 8, 0x3c00), hout(n + 8, 0xabcd);
    reduceBuffers(MTXCOMM_FLOAT16, MTXCOMM_SUM, hout.data(), ha.data(), ha.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hout[i], 0x4000);
    for (size_t i = n; i < n + 8; ++i) ASSERT_EQ(hout[i], 0xabcd);
  }
}

template <class Fn>
void expectInvalidArgument(Fn fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), MTXCOMM_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ReduceBuffers, InvalidArguments) {
  float x[2] = {1, 2};
  expectInvalidArgument(
      [&] { reduceBuffers(static_cast<mtxcomm_datatype_t>(42), MTXCOMM_SUM, x, x, x, 2); }, "42");
  expectInvalidArgument(
      [&] { reduceBuffers(static_cast<mtxcomm_datatype_t>(-1), MTXCOMM_SUM, x, x, x, 2); }, "-1");
  expectInvalidArgument(
      [&] { reduceBuffers(MTXCOMM_FLOAT32, static_cast<mtxcomm_op_t>(17), x, x, x, 2); }, "17");
  expectInvalidArgument([&] { reduceBuffers(MTXCOMM_FLOAT32, MTXCOMM_AVG, x, x, x, 2); }, "avg");
  expectInvalidArgument([&] { reduceBuffers(MTXCOMM_FLOAT32, MTXCOMM_ADASUM, x, x, x, 2); },
                        "adasum");
  expectInvalidArgument(
      [&] { reduceBuffers(MTXCOMM_NUM_DATATYPES, MTXCOMM_SUM, nullptr, nullptr, nullptr, 0); },
      std::to_string(MTXCOMM_NUM_DATATYPES));
  expectInvalidArgument([&] { divideBuffer(static_cast<mtxcomm_datatype_t>(99), x, 2, 2); }, "99");
  expectInvalidArgument([&] { divideBuffer(MTXCOMM_FLOAT32, x, 2, 0); }, "0");
  uint16_t h = 0;
  expectInvalidArgument([&] { widenToFloat(MTXCOMM_FLOAT32, &h, x, 1); }, "float32");
  expectInvalidArgument([&] { narrowFromFloat(MTXCOMM_INT8, x, &h, 1); }, "int8");
  expectInvalidArgument([&] { narrowFromFloat(MTXCOMM_INT16, x, &h, 1); }, "int16");
  EXPECT_EQ(x[0], 1.0f);
}

// AVG is not defined on bool: the reduction kernel refuses the op as for every type, and the
// division refuses the type (also with count 0), leaving the buffer as it was.
TEST(ReduceBuffers, BoolAvgIsRefused) {
  uint8_t b[3] = {0x02, 0, 1};
  expectInvalidArgument([&] { reduceBuffers(MTXCOMM_BOOL, MTXCOMM_AVG, b, b, b, 3); }, "avg");
  expectInvalidArgument([&] { divideBuffer(MTXCOMM_BOOL, b, 3, 2); }, "bool");
  expectInvalidArgument([&] { divideBuffer(MTXCOMM_BOOL, b, 3, 2); }, "avg");
  expectInvalidArgument([&] { divideBuffer(MTXCOMM_BOOL, nullptr, 0, 2); }, "bool");
  EXPECT_EQ(b[0], 0x02);
  EXPECT_EQ(b[1], 0);
  EXPECT_EQ(b[2], 1);
  EXPECT_EQ(opDeclinesDatatype(MTXCOMM_AVG, MTXCOMM_BOOL) != nullptr, true);
  EXPECT_NE(std::string(opDeclinesDatatype(MTXCOMM_AVG, MTXCOMM_BOOL)).find("avg"),
            std::string::npos);
  EXPECT_NE(std::string(opDeclinesDatatype(MTXCOMM_AVG, MTXCOMM_BOOL)).find("bool"),
            std::string::npos);
  for (int d = 0; d < MTXCOMM_NUM_DATATYPES; ++d) {
    const auto dt = static_cast<mtxcomm_datatype_t>(d);
    for (int o = 0; o < MTXCOMM_NUM_OPS; ++o) {
      const auto op = static_cast<mtxcomm_op_t>(o);
      EXPECT_EQ(opDeclinesDatatype(op, dt) != nullptr,
                (dt == MTXCOMM_BOOL && op == MTXCOMM_AVG) ||
                    (op == MTXCOMM_ADASUM && !isFloatingType(dt)))
          << datatypeName(dt) << " " << opName(op);
    }
  }
}

// ---- adasumBuffers -------------------------------------------------------------------------

// Small cases whose answer is exact in binary: orthogonal vectors add, equal vectors give the
// vector, a zero vector leaves the other, opposite ones cancel, and a = (1, 1), b = (1, 0):
// a.b = 1, |a|^2 = 2, |b|^2 = 1, so ca = 1 - 1/4 and cb = 1 - 1/2: (1.25, 0.75) (the pair is
// symmetric: swapped, the same). In every floating type.
TEST(AdasumBuffers, ExactSmallCases) {
  struct Case {
    std::vector<double> a, b, want;
  };
  const std::vector<Case> cases = {
      {{1, 0}, {0, 1}, {1, 1}},       {{3, -2}, {2, 3}, {5, 1}},      {{1, 2}, {1, 2}, {1, 2}},
      {{0, 0}, {-4, 8}, {-4, 8}},     {{-4, 8}, {0, 0}, {-4, 8}},     {{0, 0}, {0, 0}, {0, 0}},
      {{1, 1}, {1, 0}, {1.25, 0.75}}, {{1, 0}, {1, 1}, {1.25, 0.75}}, {{2, 0}, {-2, 0}, {0, 0}},
  };
  for (mtxcomm_datatype_t dt :
       {MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16, MTXCOMM_FLOAT32, MTXCOMM_FLOAT64}) {
    const size_t es = datatypeSize(dt);
    for (const Case& c : cases) {
      std::vector<unsigned char> a(2 * es), b(2 * es), out(2 * es);
      for (size_t i = 0; i < 2; ++i) {
        storeElement(dt, a.data(), i, c.a[i]);
        storeElement(dt, b.data(), i, c.b[i]);
      }
      adasumBuffers(dt, out.data(), a.data(), b.data(), 2);
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(loadElement(dt, out.data(), i), c.want[i])
            << datatypeName(dt) << " a=(" << c.a[0] << "," << c.a[1] << ") b=(" << c.b[0] << ","
            << c.b[1] << ") element " << i;
      }
    }
  }
}

// Against the formula in double over a vector whose length is no multiple of the 8 partial
// sums; dst == a and dst == b give the bits of the out-of-place call, and so do the operands
// swapped (IEEE + and * commute, and the two coefficients are computed alike).
TEST(AdasumBuffers, MatchesTheFormulaAndAliases) {
  for (size_t n : {1u, 7u, 8u, 9u, 1003u}) {
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(std::sin(0.1 * static_cast<double>(i) + 1.0));
      b[i] = static_cast<float>(0.5 * std::cos(0.3 * static_cast<double>(i)) + 0.2);
    }
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; ++i) {
      ab += static_cast<double>(a[i]) * b[i];
      aa += static_cast<double>(a[i]) * a[i];
      bb += static_cast<double>(b[i]) * b[i];
    }
    const double ca = 1 - ab / (2 * aa), cb = 1 - ab / (2 * bb);
    std::vector<float> out(n);
    adasumBuffers(MTXCOMM_FLOAT32, out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const double want = ca * a[i] + cb * b[i];
      EXPECT_NEAR(out[i], want, 1e-6 * (std::fabs(want) + 1)) << "n=" << n << " i=" << i;
    }
    std::vector<float> intoA = a, intoB = b;
    adasumBuffers(MTXCOMM_FLOAT32, intoA.data(), intoA.data(), b.data(), n);
    adasumBuffers(MTXCOMM_FLOAT32, intoB.data(), a.data(), intoB.data(), n);
    EXPECT_EQ(0, std::memcmp(out.data(), intoA.data(), n * sizeof(float))) << "n=" << n;
    EXPECT_EQ(0, std::memcmp(out.data(), intoB.data(), n * sizeof(float))) << "n=" << n;
    std::vector<float> swapped(n);
    adasumBuffers(MTXCOMM_FLOAT32, swapped.data(), b.data(), a.data(), n);
    EXPECT_EQ(0, std::memcmp(out.data(), swapped.data(), n * sizeof(float))) << "n=" << n;
  }
}

TEST(AdasumBuffers, NaNOrInfMakesEveryElementNaNAndIntegersAreRefused) {
  float a[3] = {1, 2, 3}, b[3] = {4, std::numeric_limits<float>::quiet_NaN(), 6}, out[3];
  adasumBuffers(MTXCOMM_FLOAT32, out, a, b, 3);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  const float inf = std::numeric_limits<float>::infinity();
  float c[3] = {inf, 0, 1}, z[3] = {0, 0, 0};
  adasumBuffers(MTXCOMM_FLOAT32, out, c, a, 3);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  adasumBuffers(MTXCOMM_FLOAT32, out, z, c, 3);  // a zero vector and an Inf: 0 * Inf in a.b
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  int32_t i[2] = {1, 2};
  expectInvalidArgument([&] { adasumBuffers(MTXCOMM_INT32, i, i, i, 2); }, "int32");
  expectInvalidArgument([&] { adasumBuffers(static_cast<mtxcomm_datatype_t>(42), i, i, i, 2); },
                        "42");
  adasumBuffers(MTXCOMM_FLOAT32, nullptr, nullptr, nullptr, 0);  // count 0: nothing to do
}

// ---- divideBuffer --------------------------------------------------------------------------

template <class T>
void checkDivideTruncates(mtxcomm_datatype_t dt) {
  std::vector<T> x = {T(-7),
                      T(7),
                      T(-8),
                      T(0),
                      T(-1),
                      T(1),
                      std::numeric_limits<T>::min(),
                      std::numeric_limits<T>::max()};
  const auto orig = x;
  divideBuffer(dt, x.data(), x.size(), 2);
  EXPECT_EQ(x[0], T(-3));
  EXPECT_EQ(x[1], T(3));
  EXPECT_EQ(x[2], T(-4));
  EXPECT_EQ(x[4], T(0));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], T(orig[i] / 2)) << datatypeName(dt);
}
TEST(DivideBuffer, SignedTruncatesTowardZero) {
  checkDivideTruncates<int8_t>(MTXCOMM_INT8);
  checkDivideTruncates<int16_t>(MTXCOMM_INT16);
  checkDivideTruncates<int32_t>(MTXCOMM_INT32);
  checkDivideTruncates<int64_t>(MTXCOMM_INT64);
}

template <class T>
void checkDivideAgainstScalar(mtxcomm_datatype_t dt) {
  for (int d : {1, 2, 3, 7, 8, 13, 255, 256, 1000003, INT32_MAX}) {
    for (size_t n : kCounts) {
      auto x = intInputs<T>(n, static_cast<uint32_t>(d + n));
      const auto orig = x;
      divideBuffer(dt, x.data(), n, d);
      for (size_t i = 0; i < n; ++i) {
        // Reference in 128-bit: truncating division toward zero.
        const __int128 want = static_cast<__int128>(orig[i]) / d;
        ASSERT_EQ(static_cast<__int128>(x[i]), want)
            << datatypeName(dt) << " " << +orig[i] << " / " << d;
      }
    }
  }
}
TEST(DivideBuffer, IntegersMatchTruncatingDivision) {
  checkDivideAgainstScalar<int8_t>(MTXCOMM_INT8);
  checkDivideAgainstScalar<uint8_t>(MTXCOMM_UINT8);
  checkDivideAgainstScalar<int16_t>(MTXCOMM_INT16);
  checkDivideAgainstScalar<uint16_t>(MTXCOMM_UINT16);
  checkDivideAgainstScalar<int32_t>(MTXCOMM_INT32);
  checkDivideAgainstScalar<uint32_t>(MTXCOMM_UINT32);
  checkDivideAgainstScalar<int64_t>(MTXCOMM_INT64);
  checkDivideAgainstScalar<uint64_t>(MTXCOMM_UINT64);
}

TEST(DivideBuffer, ExhaustiveInt8AndUint8SmallDivisors) {
  for (int d = 1; d <= 300; ++d) {
    std::vector<int8_t> s(256);
    std::vector<uint8_t> u(256);
    for (int i = 0; i < 256; ++i) {
      s[i] = static_cast<int8_t>(i - 128);
      u[i] = static_cast<uint8_t>(i);
    }
    divideBuffer(MTXCOMM_INT8, s.data(), 256, d);
    divideBuffer(MTXCOMM_UINT8, u.data(), 256, d);
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(s[i], (i - 128) / d) << d;
      ASSERT_EQ(u[i], i / d) << d;
    }
  }
}

// Every int16 and uint16 value (the division goes through float32: exact for |x| < 2^24).
TEST(DivideBuffer, ExhaustiveInt16AndUint16) {
  for (int d : {1, 2, 3, 5, 7, 8, 13, 255, 256, 257, 1000, 32767, 32768, 65535, 65536, 1000003}) {
    std::vector<int16_t> s(65536);
    std::vector<uint16_t> u(65536);
    for (int i = 0; i < 65536; ++i) {
      s[i] = static_cast<int16_t>(i - 32768);
      u[i] = static_cast<uint16_t>(i);
    }
    divideBuffer(MTXCOMM_INT16, s.data(), s.size(), d);
    divideBuffer(MTXCOMM_UINT16, u.data(), u.size(), d);
    for (int i = 0; i < 65536; ++i) {
      ASSERT_EQ(s[i], (i - 32768) / d) << "int16 " << i - 32768 << " / " << d;
      ASSERT_EQ(u[i], i / d) << "uint16 " << i << " / " << d;
    }
  }
  // Truncation toward zero, not floor: -7 / 2 is -3, -32768 / 3 is -10922.
  int16_t x[3] = {-7, -32768, 32767};
  divideBuffer(MTXCOMM_INT16, x, 3, 3);
  EXPECT_EQ(x[0], -2);
  EXPECT_EQ(x[1], -10922);
  EXPECT_EQ(x[2], 10922);
}

TEST(DivideBuffer, Uint64LargeValues) {
  std::vector<uint64_t> x = {UINT64_MAX, UINT64_MAX - 1, uint64_t{1} << 63, (uint64_t{1} << 53) + 1,
                             12345678901234567890ull};
  divideBuffer(MTXCOMM_UINT64, x.data(), x.size(), 3);
  EXPECT_EQ(x[0], 6148914691236517205ull);
  EXPECT_EQ(x[1], 6148914691236517204ull);
  EXPECT_EQ(x[2], 3074457345618258602ull);
  EXPECT_EQ(x[3], 3002399751580331ull);
  EXPECT_EQ(x[4], 4115226300411522630ull);
  std::vector<int64_t> y = {INT64_MIN, INT64_MAX, -(int64_t{1} << 62) - 1};
  divideBuffer(MTXCOMM_INT64, y.data(), y.size(), 7);
  EXPECT_EQ(y[0], INT64_MIN / 7);
  EXPECT_EQ(y[1], INT64_MAX / 7);
  EXPECT_EQ(y[2], (-(int64_t{1} << 62) - 1) / 7);
  std::vector<int32_t> z = {INT32_MIN, INT32_MAX, -2147483647};
  divideBuffer(MTXCOMM_INT32, z.data(), z.size(), 3);
  EXPECT_EQ(z[0], INT32_MIN / 3);
  EXPECT_EQ(z[1], INT32_MAX / 3);
  EXPECT_EQ(z[2], -715827882);
  std::vector<uint32_t> w = {UINT32_MAX, 0x80000001u};
  divideBuffer(MTXCOMM_UINT32, w.data(), w.size(), 2);
  EXPECT_EQ(w[0], 0x7fffffffu);
  EXPECT_EQ(w[1], 0x40000000u);
}

TEST(DivideBuffer, FloatingTypes) {
  std::vector<float> f = {1.0f, -7.0f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 0.1f};
  divideBuffer(MTXCOMM_FLOAT32, f.data(), f.size(), 3);
  EXPECT_EQ(f[0], 1.0f / 3.0f);
  EXPECT_EQ(f[1], -7.0f / 3.0f);
  EXPECT_TRUE(std::isinf(f[2]));
  EXPECT_TRUE(std::isnan(f[3]));
  EXPECT_EQ(f[4], 0.1f / 3.0f);
  std::vector<double> d = {1.0, -7.0, 1e308};
  divideBuffer(MTXCOMM_FLOAT64, d.data(), d.size(), 3);
  EXPECT_EQ(d[0], 1.0 / 3.0);
  EXPECT_EQ(d[1], -7.0 / 3.0);
  EXPECT_EQ(d[2], 1e308 / 3.0);
  // 16-bit: every bit pattern, divided in float32 and rounded once.
  for (mtxcomm_datatype_t dt : {MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16}) {
    const bool bf = dt == MTXCOMM_BFLOAT16;
    std::vector<uint16_t> x(65536);
    for (uint32_t i = 0; i < 65536; ++i) x[i] = static_cast<uint16_t>(i);
    divideBuffer(dt, x.data(), x.size(), 3);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      if (bf ? isBf16Nan(h) : isHalfNan(h)) {
        ASSERT_TRUE(bf ? isBf16Nan(x[i]) : isHalfNan(x[i]));
        continue;
      }
      const float q = (bf ? refBf16ToFloat(h) : refHalfToFloat(h)) / 3.0f;
      ASSERT_EQ(x[i], bf ? refFloatToBf16(q) : refFloatToHalf(q)) << datatypeName(dt) << " " << i;
    }
  }
}

// A power-of-two divisor runs as a multiplication by its exact reciprocal: the same bits as the
// division for every value, subnormals (and results that become subnormal), infinities, signed
// zeros and NaN included.
template <class T, class Bits>
void checkPowerOfTwoDivisionBits(mtxcomm_datatype_t dt) {
  std::mt19937_64 gen(7);
  std::vector<Bits> patterns;
  for (int i = 0; i < 200000; ++i) patterns.push_back(static_cast<Bits>(gen()));
  for (Bits low = 0; low < 4096; ++low) {  // the smallest subnormals, and their negatives
    patterns.push_back(low);
    patterns.push_back(static_cast<Bits>(low | (Bits{1} << (sizeof(Bits) * 8 - 1))));
  }
  for (T v : {std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
              std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::infinity(), T(-0.0),
              T(1), T(3), T(-5)}) {
    Bits b;
    std::memcpy(&b, &v, sizeof(b));
    patterns.push_back(b);
  }
  for (int d : {1, 2, 4, 8, 16, 1024, 1 << 30}) {
    std::vector<T> x(patterns.size());
    std::memcpy(x.data(), patterns.data(), x.size() * sizeof(T));
    const std::vector<T> orig = x;
    divideBuffer(dt, x.data(), x.size(), d);
    for (size_t i = 0; i < x.size(); ++i) {
      volatile T divisor = static_cast<T>(d);  // a real division, not one the compiler rewrote
      const T want = orig[i] / divisor;
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(x[i])) << datatypeName(dt) << " pattern " << +patterns[i];
        continue;
      }
      Bits got, wantBits;
      std::memcpy(&got, &x[i], sizeof(got));
      std::memcpy(&wantBits, &want, sizeof(wantBits));
      ASSERT_EQ(got, wantBits) << datatypeName(dt) << " pattern " << +patterns[i] << " / " << d;
    }
  }
}
TEST(DivideBuffer, PowerOfTwoDivisorsGiveTheBitsOfADivision) {
  checkPowerOfTwoDivisionBits<float, uint32_t>(MTXCOMM_FLOAT32);
  checkPowerOfTwoDivisionBits<double, uint64_t>(MTXCOMM_FLOAT64);
  for (mtxcomm_datatype_t dt : {MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16}) {
    const bool bf = dt == MTXCOMM_BFLOAT16;
    for (int d : {2, 4, 8, 1 << 20}) {
      std::vector<uint16_t> x(65536);
      for (uint32_t i = 0; i < 65536; ++i) x[i] = static_cast<uint16_t>(i);
      divideBuffer(dt, x.data(), x.size(), d);
      for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t h = static_cast<uint16_t>(i);
        if (bf ? isBf16Nan(h) : isHalfNan(h)) {
          ASSERT_TRUE(bf ? isBf16Nan(x[i]) : isHalfNan(x[i]));
          continue;
        }
        volatile float divisor = static_cast<float>(d);
        const float q = (bf ? refBf16ToFloat(h) : refHalfToFloat(h)) / divisor;
        ASSERT_EQ(x[i], bf ? refFloatToBf16(q) : refFloatToHalf(q))
            << datatypeName(dt) << " " << i << " / " << d;
      }
    }
  }
}

// ---- 16-bit conversions --------------------------------------------------------------------

TEST(Float16, ExhaustiveRoundTripAndValues) {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  widenToFloat(MTXCOMM_FLOAT16, all.data(), wide.data(), all.size());
  narrowFromFloat(MTXCOMM_FLOAT16, wide.data(), back.data(), wide.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = halfToFloat(h);
    ASSERT_TRUE(sameBits(f, wide[i])) << "bulk != scalar at " << i;
    if (isHalfNan(h)) {
      ASSERT_TRUE(std::isnan(f)) << i;
      ASSERT_TRUE(bitsOf(f) & 0x00400000u) << "widened NaN not quiet " << i;
      ASSERT_TRUE(isHalfNan(floatToHalf(f))) << i;
      ASSERT_EQ(floatToHalf(f), h | 0x0200) << "payload kept, quiet " << i;
      ASSERT_EQ(back[i], h | 0x0200) << i;
    } else {
      ASSERT_TRUE(sameBits(f, refHalfToFloat(h))) << i;
      ASSERT_EQ(floatToHalf(f), h) << i;
      ASSERT_EQ(back[i], h) << i;
    }
  }
}

TEST(Float16, RoundingCases) {
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // halfway between max and 2^16: to Inf
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);  // 65504
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(floatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(halfToFloat(floatToHalf(2049.0f)), 2048.0f);  // tie to even
  EXPECT_EQ(halfToFloat(floatToHalf(2051.0f)), 2052.0f);  // tie to even (up)
  EXPECT_EQ(halfToFloat(floatToHalf(2050.0f)), 2050.0f);
  EXPECT_EQ(halfToFloat(floatToHalf(2049.01f)), 2050.0f);
  EXPECT_EQ(floatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);  // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(floatToHalf(-0x1p-25f), 0x8000);
  EXPECT_EQ(floatToHalf(0x1.000002p-25f), 0x0001);  // just above the tie
  EXPECT_EQ(floatToHalf(3 * 0x1p-26f), 0x0001);     // 0.75 ulp rounds up
  EXPECT_EQ(floatToHalf(3 * 0x1p-25f), 0x0002);     // 1.5 ulp: tie to even (2)
  EXPECT_EQ(floatToHalf(5 * 0x1p-25f), 0x0002);     // 2.5 ulp: tie to even (2)
  EXPECT_EQ(floatToHalf(0x1p-14f), 0x0400);         // smallest normal
  EXPECT_EQ(floatToHalf(0x1.ff8p-15f), 0x03ff);     // largest subnormal (1023 * 2^-24)
  EXPECT_EQ(floatToHalf(0x1.ffap-15f), 0x03ff);     // 1023.25 ulp
  EXPECT_EQ(floatToHalf(0x1.ffcp-15f), 0x0400);     // 1023.5 ulp: tie to even, into the normals
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(0.1f), 0x2e66);
  EXPECT_TRUE(isHalfNan(floatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(isHalfNan(floatToHalf(std::numeric_limits<float>::signaling_NaN())));
  EXPECT_TRUE(floatToHalf(std::numeric_limits<float>::signaling_NaN()) & 0x0200);
  EXPECT_TRUE(isHalfNan(floatToHalf(floatOf(0x7f800001u))));  // payload only in low bits
  EXPECT_EQ(halfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(halfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(halfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
}

// Every float in a large sample (random bit patterns plus all floats around each half
// rounding boundary) rounds exactly as the table search says; bulk and scalar agree.
void checkNarrowSample(mtxcomm_datatype_t dt) {
  const bool bf = dt == MTXCOMM_BFLOAT16;
  std::vector<float> in;
  std::mt19937 rng(99);
  for (int i = 0; i < 300000; ++i) in.push_back(floatOf(rng()));
  // Around the midpoints between consecutive representable values.
  const Table& t = bf ? bf16Table() : halfTable();
  for (size_t k = 0; k + 1 < t.values.size(); k += 37) {
    const float mid = static_cast<float>((t.values[k] + t.values[k + 1]) / 2);
    uint32_t u = bitsOf(mid);
    for (uint32_t d = 0; d < 3; ++d) {
      in.push_back(floatOf(u + d));
      in.push_back(floatOf(u - d));
      in.push_back(-floatOf(u + d));
    }
  }
  std::vector<uint16_t> out(in.size());
  narrowFromFloat(dt, in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t scalar = bf ? floatToBfloat16(in[i]) : floatToHalf(in[i]);
    ASSERT_EQ(out[i], scalar) << "bulk != scalar " << bitsOf(in[i]);
    if (std::isnan(in[i])) {
      ASSERT_TRUE(bf ? isBf16Nan(scalar) : isHalfNan(scalar));
    } else {
      ASSERT_EQ(scalar, bf ? refFloatToBf16(in[i]) : refFloatToHalf(in[i]))
          << std::hexfloat << in[i];
    }
  }
}
TEST(Float16, NarrowMatchesReferenceOnSample) { checkNarrowSample(MTXCOMM_FLOAT16); }
TEST(Bfloat16, NarrowMatchesReferenceOnSample) { checkNarrowSample(MTXCOMM_BFLOAT16); }

TEST(Bfloat16, ExhaustiveRoundTrip) {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  widenToFloat(MTXCOMM_BFLOAT16, all.data(), wide.data(), all.size());
  narrowFromFloat(MTXCOMM_BFLOAT16, wide.data(), back.data(), wide.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = bfloat16ToFloat(b);
    ASSERT_TRUE(sameBits(f, wide[i])) << "bulk != scalar at " << i;
    if (isBf16Nan(b)) {
      ASSERT_TRUE(std::isnan(f)) << i;
      ASSERT_TRUE(bitsOf(f) & 0x00400000u) << "widened NaN not quiet " << i;
      ASSERT_EQ(floatToBfloat16(f), b | 0x0040) << i;
      ASSERT_EQ(back[i], b | 0x0040) << i;
    } else {
      ASSERT_EQ(bitsOf(f), static_cast<uint32_t>(b) << 16) << i;
      ASSERT_EQ(floatToBfloat16(f), b) << i;
      ASSERT_EQ(back[i], b) << i;
    }
  }
}

TEST(Bfloat16, RoundingCases) {
  EXPECT_EQ(floatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBfloat16(floatOf(0x3f808000u)), 0x3f80);               // tie, even stays
  EXPECT_EQ(floatToBfloat16(floatOf(0x3f818000u)), 0x3f82);               // tie, odd rounds up
  EXPECT_EQ(floatToBfloat16(floatOf(0x3f808001u)), 0x3f81);               // above the tie
  EXPECT_EQ(floatToBfloat16(floatOf(0x3f807fffu)), 0x3f80);               // below the tie
  EXPECT_EQ(floatToBfloat16(257.0f), floatToBfloat16(256.0f));            // tie to even
  EXPECT_EQ(bfloat16ToFloat(floatToBfloat16(259.0f)), 260.0f);            // tie to even (up)
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to Inf
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f7f8000u)), 0x7f80);  // tie at max, odd: Inf
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(floatToBfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(floatToBfloat16(floatOf(0x00008000u)), 0x0000);  // subnormal tie to even 0
  EXPECT_EQ(floatToBfloat16(floatOf(0x00018000u)), 0x0002);  // subnormal tie to even 2
  EXPECT_EQ(floatToBfloat16(-0.0f), 0x8000);
  // NaN whose payload is only in the low 16 bits must not become Inf.
  EXPECT_TRUE(isBf16Nan(floatToBfloat16(floatOf(0x7f800001u))));
  EXPECT_TRUE(isBf16Nan(floatToBfloat16(floatOf(0xffffffffu))));
  EXPECT_TRUE(floatToBfloat16(std::numeric_limits<float>::signaling_NaN()) & 0x0040);
}

// ---- Datatype and op tables ----------------------------------------------------------------

TEST(Dtype, Tables) {
  // The numbers are the ABI: appended, never renumbered.
  static_assert(MTXCOMM_FLOAT64 == 9 && MTXCOMM_INT16 == 10 && MTXCOMM_UINT16 == 11 &&
                    MTXCOMM_BOOL == 12 && MTXCOMM_NUM_DATATYPES == 13,
                "datatype numbers");
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 2, 2, 1};
  const char* names[] = {"int8",     "uint8",   "int32",   "uint32", "int64",  "uint64", "float16",
                         "bfloat16", "float32", "float64", "int16",  "uint16", "bool"};
  static_assert(sizeof(names) / sizeof(names[0]) == MTXCOMM_NUM_DATATYPES, "every datatype");
  for (int i = 0; i < MTXCOMM_NUM_DATATYPES; ++i) {
    const auto dt = static_cast<mtxcomm_datatype_t>(i);
    EXPECT_TRUE(isValidDatatype(dt));
    EXPECT_EQ(datatypeSize(dt), sizes[i]);
    EXPECT_EQ(mtxcomm_datatype_size(dt), sizes[i]);
    EXPECT_STREQ(datatypeName(dt), names[i]);
    EXPECT_EQ(parseDatatype(datatypeName(dt)), dt);
    EXPECT_EQ(isFloatingType(dt), i >= MTXCOMM_FLOAT16 && i <= MTXCOMM_FLOAT64);
    EXPECT_EQ(isHalfType(dt), dt == MTXCOMM_FLOAT16 || dt == MTXCOMM_BFLOAT16);
    EXPECT_EQ(isBoolType(dt), dt == MTXCOMM_BOOL);
    // dispatchDatatype's storage type has the element's size.
    EXPECT_EQ(dispatchDatatype(dt, [](auto tag) { return sizeof(typename decltype(tag)::type); }),
              sizes[i]);
  }
  for (int bad : {-1, static_cast<int>(MTXCOMM_NUM_DATATYPES), 1000}) {
    const auto dt = static_cast<mtxcomm_datatype_t>(bad);
    EXPECT_FALSE(isValidDatatype(dt));
    EXPECT_EQ(datatypeSize(dt), 0u);
    EXPECT_STREQ(datatypeName(dt), "invalid");
    EXPECT_FALSE(isFloatingType(dt));
  }
  EXPECT_EQ(parseDatatype("int"), MTXCOMM_INT32);
  EXPECT_EQ(parseDatatype("float"), MTXCOMM_FLOAT32);
  EXPECT_EQ(parseDatatype("double"), MTXCOMM_FLOAT64);
  EXPECT_EQ(parseDatatype("half"), MTXCOMM_FLOAT16);
  EXPECT_EQ(parseDatatype("bf16"), MTXCOMM_BFLOAT16);
  EXPECT_EQ(parseDatatype(""), std::nullopt);
  EXPECT_EQ(parseDatatype("invalid"), std::nullopt);
  EXPECT_EQ(parseDatatype("Float32"), std::nullopt);
  EXPECT_EQ(parseDatatype("float32 "), std::nullopt);

  const char* ops[] = {"sum", "prod", "min", "max", "avg", "adasum"};
  static_assert(sizeof(ops) / sizeof(ops[0]) == MTXCOMM_NUM_OPS, "one name per op");
  for (int i = 0; i < MTXCOMM_NUM_OPS; ++i) {
    const auto op = static_cast<mtxcomm_op_t>(i);
    EXPECT_TRUE(isValidOp(op));
    EXPECT_STREQ(opName(op), ops[i]);
    EXPECT_EQ(parseOp(opName(op)), op);
  }
  EXPECT_FALSE(isValidOp(MTXCOMM_NUM_OPS));
  EXPECT_FALSE(isValidOp(static_cast<mtxcomm_op_t>(-1)));
  EXPECT_STREQ(opName(MTXCOMM_NUM_OPS), "invalid");
  EXPECT_EQ(parseOp("invalid"), std::nullopt);
  EXPECT_EQ(parseOp("SUM"), std::nullopt);
}

// storeElement writes bool as its byte (non-canonical trues for test data); loadElement reads
// any nonzero byte as 1. int16/uint16 wrap like the other integers.
TEST(Dtype, StoreAndLoadElementNewTypes) {
  uint8_t b[3] = {0, 0, 0};
  storeElement(MTXCOMM_BOOL, b, 0, 2);
  storeElement(MTXCOMM_BOOL, b, 1, 255);
  storeElement(MTXCOMM_BOOL, b, 2, 0);
  EXPECT_EQ(b[0], 0x02);
  EXPECT_EQ(b[1], 0xff);
  EXPECT_EQ(b[2], 0);
  EXPECT_EQ(loadElement(MTXCOMM_BOOL, b, 0), 1.0);
  EXPECT_EQ(loadElement(MTXCOMM_BOOL, b, 1), 1.0);
  EXPECT_EQ(loadElement(MTXCOMM_BOOL, b, 2), 0.0);
  int16_t s = 0;
  storeElement(MTXCOMM_INT16, &s, 0, 32768);  // wraps
  EXPECT_EQ(s, -32768);
  EXPECT_EQ(loadElement(MTXCOMM_INT16, &s, 0), -32768.0);
  uint16_t u = 0;
  storeElement(MTXCOMM_UINT16, &u, 0, -1);
  EXPECT_EQ(u, 65535);
  EXPECT_EQ(loadElement(MTXCOMM_UINT16, &u, 0), 65535.0);
}

// copyBytes: every byte of [dst, dst + n) is src's, nothing outside it is touched, for sizes
// around the switch to the vector loop and its 128-byte blocks and every alignment of source
// and destination modulo 32.
TEST(CopyBytes, EverySizeAndAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> src(70000), dst(70000 + 128);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  std::vector<size_t> sizes = {0,
                               1,
                               31,
                               127,
                               kCopyLoopBytes - 1,
                               kCopyLoopBytes,
                               kCopyLoopBytes + 1,
                               kCopyLoopBytes + 127,
                               4096 + 95,
                               65536};
  for (size_t n : sizes) {
    for (size_t so = 0; so < 32; so += 3) {
      for (size_t d0 = 0; d0 < 33; d0 += 5) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        copyBytes(dst.data() + 64 + d0, src.data() + so, n);
        ASSERT_EQ(std::memcmp(dst.data() + 64 + d0, src.data() + so, n), 0)
            << "n " << n << " src offset " << so << " dst offset " << d0;
        for (size_t i = 0; i < 64 + d0; ++i) ASSERT_EQ(dst[i], 0xA5) << "before, n " << n;
        for (size_t i = 64 + d0 + n; i < dst.size() && i < 64 + d0 + n + 64; ++i) {
          ASSERT_EQ(dst[i], 0xA5) << "after, n " << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mtxcomm
