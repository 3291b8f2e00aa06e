#include "bench/bench_data.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lib/base/dtype.h"
#include "lib/base/reduce.h"

namespace mtxcomm {
namespace bench {
namespace {

constexpr size_t kPeriod = 61;  // prime: rank r's pattern is rank 0's shifted by 7r

// Rank r's input at element i: 1..61 (SUM, MIN, MAX, AVG, and the non-reducing collectives);
// for PROD 2 at about one element in seven, else 1, so products stay small. ADASUM: rank r owns
// the elements whose k = i % 61 has k % nranks == r, holding k + 1 there and 0 elsewhere, so the
// ranks' vectors (and every partial result of the tree) are orthogonal: each pair's dot product
// is exactly 0, both coefficients exactly 1, and the adaptive sum is the plain sum, k + 1
// everywhere (exact in every floating type).
int64_t inputValue(mtxcomm_op_t op, int rank, int nranks, size_t i) {
  if (op == MTXCOMM_ADASUM) {
    const size_t k = i % kPeriod;
    return k % static_cast<size_t>(nranks) == static_cast<size_t>(rank)
               ? static_cast<int64_t>(k) + 1
               : 0;
  }
  const size_t k = (7 * static_cast<size_t>(rank) + i) % kPeriod;
  if (op == MTXCOMM_PROD) return k % 7 == 0 ? 2 : 1;
  return static_cast<int64_t>(k) + 1;
}

// Integers: combine in the type, SUM and PROD wrapping (computed unsigned; types narrower than
// unsigned int in unsigned int, which they would otherwise promote to signed int).
template <typename T>
struct IntCodec {
  static constexpr bool kLogical = false;
  using Acc = T;
  using U = std::make_unsigned_t<T>;
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
  static Acc make(int64_t v) { return static_cast<T>(v); }
  static Acc combine(mtxcomm_op_t op, Acc a, Acc b) {
    switch (op) {
      case MTXCOMM_PROD:
        return static_cast<T>(static_cast<U>(static_cast<W>(a) * static_cast<W>(b)));
      case MTXCOMM_MIN:
        return std::min(a, b);
      case MTXCOMM_MAX:
        return std::max(a, b);
      default:  // SUM, AVG
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  }
  static Acc average(Acc sum, int n) {
    return static_cast<T>(sum / static_cast<std::common_type_t<T, int>>(n));
  }
  static void store(Acc v, unsigned char* dst) { std::memcpy(dst, &v, sizeof(T)); }
  static void storeResult(Acc v, unsigned char* dst) { store(v, dst); }
};

// bool: inputs are bytes, some of them non-canonical trues (0x02, 0xff); the reduction is
// logical (SUM/MAX: OR, PROD/MIN: AND) and its result 0 or 1. The inputs do not depend on the
// op (every op needs both values to be tested), and there is no AVG (the bench refuses it).
struct BoolCodec {
  static constexpr bool kLogical = true;
  using Acc = uint8_t;
  static Acc make(int64_t v) {
    static constexpr uint8_t kBytes[5] = {0, 1, 2, 0xff, 1};
    return kBytes[v % 5];
  }
  static Acc combine(mtxcomm_op_t op, Acc a, Acc b) {
    const bool x = a != 0, y = b != 0;
    return op == MTXCOMM_PROD || op == MTXCOMM_MIN ? (x && y) : (x || y);
  }
  static Acc average(Acc sum, int) { return sum; }  // not reached
  static void store(Acc v, unsigned char* dst) { *dst = v; }
  static void storeResult(Acc v, unsigned char* dst) { *dst = v != 0; }
};

// Floating types: accumulate in Acc (float32 for the 16-bit types), round once in store.
template <typename Acc, uint16_t (*kNarrow)(float)>
struct FloatCodec {
  static constexpr bool kLogical = false;
  static Acc make(int64_t v) { return static_cast<Acc>(v); }
  static Acc combine(mtxcomm_op_t op, Acc a, Acc b) {
    switch (op) {
      case MTXCOMM_PROD:
        return a * b;
      case MTXCOMM_MIN:
        return std::min(a, b);
      case MTXCOMM_MAX:
        return std::max(a, b);
      default:  // SUM, AVG; ADASUM of the orthogonal inputs above
        return a + b;
    }
  }
  static Acc average(Acc sum, int n) { return sum / static_cast<Acc>(n); }
  static void store(Acc v, unsigned char* dst) {
    if constexpr (kNarrow != nullptr) {
      const uint16_t h = kNarrow(v);
      std::memcpy(dst, &h, 2);
    } else {
      std::memcpy(dst, &v, sizeof(Acc));
    }
  }
  static void storeResult(Acc v, unsigned char* dst) { store(v, dst); }
};

template <typename Codec>
void buildLines(mtxcomm_op_t op, int nranks, size_t elemSize,
                std::vector<std::vector<unsigned char>>& inputs,
                std::vector<unsigned char>& reduced) {
  inputs.assign(nranks, std::vector<unsigned char>(2 * kPeriod * elemSize));
  reduced.assign(2 * kPeriod * elemSize, 0);
  const mtxcomm_op_t inputOp = Codec::kLogical ? MTXCOMM_SUM : op;
  for (size_t j = 0; j < 2 * kPeriod; ++j) {
    auto acc = Codec::make(inputValue(inputOp, 0, nranks, j));
    Codec::store(acc, inputs[0].data() + j * elemSize);
    for (int r = 1; r < nranks; ++r) {
      const auto v = Codec::make(inputValue(inputOp, r, nranks, j));
      Codec::store(v, inputs[r].data() + j * elemSize);
      acc = Codec::combine(op, acc, v);
    }
    if (op == MTXCOMM_AVG) acc = Codec::average(acc, nranks);
    Codec::storeResult(acc, reduced.data() + j * elemSize);
  }
}

// Copies line (periodic with kPeriod) from global index first onwards, kPeriod elements at a time.
void fillFromLine(const std::vector<unsigned char>& line, size_t elemSize, size_t first,
                  size_t count, void* dst) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t done = 0;
  while (done < count) {
    const size_t n = std::min(kPeriod, count - done);
    std::memcpy(out + done * elemSize, line.data() + ((first + done) % kPeriod) * elemSize,
                n * elemSize);
    done += n;
  }
}

size_t countWrongFromLine(const std::vector<unsigned char>& line, size_t elemSize, size_t first,
                          size_t count, const void* buf) {
  const auto* in = static_cast<const unsigned char*>(buf);
  size_t wrong = 0;
  size_t done = 0;
  while (done < count) {
    const size_t n = std::min(kPeriod, count - done);
    const unsigned char* want = line.data() + ((first + done) % kPeriod) * elemSize;
    const unsigned char* got = in + done * elemSize;
    if (std::memcmp(got, want, n * elemSize) != 0) {
      for (size_t k = 0; k < n; ++k) {
        wrong += std::memcmp(got + k * elemSize, want + k * elemSize, elemSize) != 0;
      }
    }
    done += n;
  }
  return wrong;
}

}  // namespace

TestData::TestData(mtxcomm_datatype_t dtype, mtxcomm_op_t op, int nranks)
    : elemSize_(datatypeSize(dtype)) {
  dispatchDatatype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Codec = std::conditional_t<
        std::is_same_v<T, Float16Bits>, FloatCodec<float, floatToHalf>,
        std::conditional_t<
            std::is_same_v<T, Bfloat16Bits>, FloatCodec<float, floatToBfloat16>,
            std::conditional_t<std::is_same_v<T, BoolByte>, BoolCodec,
                               std::conditional_t<std::is_floating_point_v<T>,
                                                  FloatCodec<T, nullptr>, IntCodec<T>>>>>;
    buildLines<Codec>(op, nranks, elemSize_, inputLines_, reducedLine_);
  });
}

void TestData::fillInput(int rank, size_t first, size_t count, void* dst) const {
  fillFromLine(inputLines_[rank], elemSize_, first, count, dst);
}

size_t TestData::countWrongInput(int rank, size_t first, size_t count, const void* buf) const {
  return countWrongFromLine(inputLines_[rank], elemSize_, first, count, buf);
}

size_t TestData::countWrongReduced(size_t first, size_t count, const void* buf) const {
  return countWrongFromLine(reducedLine_, elemSize_, first, count, buf);
}

}  // namespace bench
}  // namespace mtxcomm
