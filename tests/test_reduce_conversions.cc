// divideBuffer (AVG), the 16-bit float conversions, the datatype and op tables, and copyBytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/reduce_reference.h"
#include "lib/base/dtype.h"
#include "lib/base/reduce.h"
#include "mtxcomm/mtxcomm.hpp"

namespace mtxcomm {
namespace {

using namespace reduceref;  // NOLINT: the scalar references and the inputs

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
