// The reduction kernels against the scalar references: reduceBuffers and adasumBuffers.
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

}  // namespace
}  // namespace mtxcomm
