// The scalar references and inputs shared by the reduction kernel tests (tests/test_reduce_*.cc).
// Every expectation is computed by a straightforward scalar reference that does not share code
// with the kernels (lib/base/reduce.h, lib/base/dtype.h): integer results in 128-bit arithmetic
// reduced mod 2^bits, 16-bit float conversions by searching the sorted table of representable
// values.
#ifndef MTXCOMM_TESTS_COMMON_REDUCE_REFERENCE_H_
#define MTXCOMM_TESTS_COMMON_REDUCE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace reduceref {

inline constexpr mtxcomm_op_t kOps[] = {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX};
inline constexpr size_t kCounts[] = {1, 3, 17, 300, 1031};

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
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
inline double halfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
}
inline double bf16Value(uint16_t b) {
  return static_cast<double>(floatOf(static_cast<uint32_t>(b) << 16));
}

// Positive representable values in increasing order, then the "value" at which the format
// overflows, treated as Inf's position for rounding: IEEE rounds to Inf exactly when
// round-to-nearest-even against max and max + ulp(max) would pick the latter.
struct Table {
  std::vector<double> values;  // index == bit pattern (sign clear), last entry: Inf position
};
inline const Table& halfTable() {
  static const Table t = [] {
    Table r;
    for (uint32_t h = 0; h < 0x7c00; ++h) r.values.push_back(halfValue(static_cast<uint16_t>(h)));
    r.values.push_back(65536.0);  // 0x7c00
    return r;
  }();
  return t;
}
inline const Table& bf16Table() {
  static const Table t = [] {
    Table r;
    for (uint32_t b = 0; b < 0x7f80; ++b) r.values.push_back(bf16Value(static_cast<uint16_t>(b)));
    r.values.push_back(std::ldexp(1.0, 128));  // 0x7f80
    return r;
  }();
  return t;
}

// Round |x| (finite or Inf, not NaN) to nearest, ties to even bit pattern, by table search.
inline uint16_t roundByTable(const Table& t, float x) {
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

inline uint16_t refFloatToHalf(float x) {
  if (std::isnan(x)) return 0x7e00;  // any quiet NaN; callers check NaN-ness only
  return roundByTable(halfTable(), x);
}
inline uint16_t refFloatToBf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  return roundByTable(bf16Table(), x);
}
inline float refHalfToFloat(uint16_t h) {
  const float s = (h & 0x8000) ? -1.0f : 1.0f;
  if ((h & 0x7c00) == 0x7c00) {
    return (h & 0x3ff) ? std::numeric_limits<float>::quiet_NaN()
                       : s * std::numeric_limits<float>::infinity();
  }
  return s * static_cast<float>(halfValue(h & 0x7fff));
}
inline float refBf16ToFloat(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

inline bool isHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
inline bool isBf16Nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

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

inline std::vector<uint16_t> sixteenBitInputs(size_t n, uint32_t seed, bool bf16, bool specials) {
  std::vector<float> f = floatInputs<float>(n, seed, specials);
  std::vector<uint16_t> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) {
    v[i] = bf16 ? refFloatToBf16(f[i]) : refFloatToHalf(f[i] / 16.0f);
    if (specials && rng() % 10 == 0) v[i] = static_cast<uint16_t>(rng());  // any bit pattern
  }
  return v;
}

}  // namespace reduceref
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_REDUCE_REFERENCE_H_
