// The numbers contract (docs: "Same answer everywhere", "Numbers"): results bitwise identical on
// every rank and from run to run for every allreduce algorithm; float16 accumulated in float32
// and rounded once; NaN propagates; integer avg truncates toward zero and sum wraps; counts beyond
// 2^31 elements and 2 GiB.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "algos/registry.h"
#include "harness.h"
#include "lib/base/reduce.h"
#include "lib/comm/config.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace {

using testing::runRanks;

TEST(Api, ResultsAreBitwiseIdenticalAcrossRanksAndRuns) {
  // Random floats: the sum depends on the order of operations, so this checks that every rank
  // gets the same bits and that a rerun reproduces them, for every allreduce algorithm.
  const int n = 7;
  const size_t count = 100003;
  for (const char* algo : algorithmNames(Collective::kAllreduce)) {
    Config cfg;
    cfg.algo[static_cast<int>(Collective::kAllreduce)] = algo;
    cfg.segmentBytes = 8192;
    std::vector<std::vector<float>> results[2];
    for (int run = 0; run < 2; ++run) {
      results[run].assign(n, std::vector<float>(count));
      runRanks(
          n,
          [&](mtxcomm_comm_t comm, int rank) {
            std::mt19937 gen(1234 + rank);
            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            std::vector<float> in(count);
            for (float& x : in) x = dist(gen) * std::pow(10.0f, static_cast<float>(rank % 4));
            ASSERT_EQ(mtxcomm_allreduce(in.data(), results[run][rank].data(), count,
                                        MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
                      MTXCOMM_SUCCESS);
          },
          cfg);
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(0, std::memcmp(results[0][0].data(), results[0][r].data(), count * 4))
          << algo << ": rank " << r << " differs from rank 0";
      EXPECT_EQ(0, std::memcmp(results[0][r].data(), results[1][r].data(), count * 4))
          << algo << ": rank " << r << " differs between runs";
    }
  }
}

TEST(Api, Float16SumIsRoundedOnceFromFloat32) {
  // 2048 + 1 + 1 + ... in float16 rounds at every step (2048 + 1 -> 2048); accumulated in
  // float32 and rounded once, 2048 + (n - 1) is exact before the final rounding.
  for (int n : {3, 4, 5, 8}) {
    for (const char* algo : algorithmNames(Collective::kAllreduce)) {
      Config cfg;
      cfg.algo[static_cast<int>(Collective::kAllreduce)] = algo;
      runRanks(
          n,
          [&](mtxcomm_comm_t comm, int rank) {
            std::vector<uint16_t> x(5, floatToHalf(rank == 0 ? 2048.0f : 1.0f));
            ASSERT_EQ(mtxcomm_allreduce(x.data(), x.data(), x.size(), MTXCOMM_FLOAT16, MTXCOMM_SUM,
                                        comm, nullptr),
                      MTXCOMM_SUCCESS);
            const uint16_t want = floatToHalf(2048.0f + (n - 1));
            for (uint16_t h : x)
              EXPECT_EQ(h, want) << algo << " n=" << n << " got " << halfToFloat(h);
          },
          cfg);
    }
  }
}

TEST(Api, NaNPropagatesThroughSumProdMinMax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (mtxcomm_op_t op : {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX, MTXCOMM_AVG}) {
    runRanks(4, [&](mtxcomm_comm_t comm, int rank) {
      float x[3] = {1.0f, 2.0f, 3.0f};
      if (rank == 2) x[1] = nan;
      double d[3] = {1.0, 2.0, 3.0};
      if (rank == 3) d[0] = nan;
      ASSERT_EQ(mtxcomm_allreduce(x, x, 3, MTXCOMM_FLOAT32, op, comm, nullptr), MTXCOMM_SUCCESS);
      ASSERT_EQ(mtxcomm_allreduce(d, d, 3, MTXCOMM_FLOAT64, op, comm, nullptr), MTXCOMM_SUCCESS);
      EXPECT_FALSE(std::isnan(x[0]));
      EXPECT_TRUE(std::isnan(x[1])) << "op " << op;
      EXPECT_FALSE(std::isnan(x[2]));
      EXPECT_TRUE(std::isnan(d[0])) << "op " << op;
      uint16_t h[2] = {floatToBfloat16(1.0f), floatToBfloat16(rank == 1 ? nan : 1.0f)};
      ASSERT_EQ(mtxcomm_allreduce(h, h, 2, MTXCOMM_BFLOAT16, op, comm, nullptr), MTXCOMM_SUCCESS);
      EXPECT_FALSE(std::isnan(bfloat16ToFloat(h[0])));
      EXPECT_TRUE(std::isnan(bfloat16ToFloat(h[1]))) << "op " << op;
    });
  }
}

TEST(Api, IntegerAvgTruncatesTowardZeroAndSumWraps) {
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    int32_t a[2] = {rank == 0 ? -7 : 0, 7};  // sums -7 and 21
    ASSERT_EQ(mtxcomm_allreduce(a, a, 2, MTXCOMM_INT32, MTXCOMM_AVG, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(a[0], -2);  // -7 / 3 truncates toward zero
    EXPECT_EQ(a[1], 7);
    int8_t b = 100;  // 300 wraps to 44
    ASSERT_EQ(mtxcomm_allreduce(&b, &b, 1, MTXCOMM_INT8, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(b, static_cast<int8_t>(44));
  });
}

TEST(Api, Int16AvgTruncatesTowardZeroAndSumAndProdWrap) {
  for (const char* algo : algorithmNames(Collective::kAllreduce)) {
    Config cfg;
    cfg.algo[static_cast<int>(Collective::kAllreduce)] = algo;
    runRanks(
        3,
        [&](mtxcomm_comm_t comm, int rank) {
          SCOPED_TRACE(algo);
          int16_t a[3] = {static_cast<int16_t>(rank == 0 ? -7 : 0), 20000, -32768};
          // sums -7, 60000 (wraps to -5536) and -98304 (wraps to -32768)
          ASSERT_EQ(mtxcomm_allreduce(a, a, 3, MTXCOMM_INT16, MTXCOMM_AVG, comm, nullptr),
                    MTXCOMM_SUCCESS)
              << mtxcomm_get_last_error(comm);
          EXPECT_EQ(a[0], -2);     // -7 / 3 truncates toward zero
          EXPECT_EQ(a[1], -1845);  // -5536 / 3 = -1845.33
          EXPECT_EQ(a[2], -10922);
          int16_t s[2] = {20000, 300};
          ASSERT_EQ(mtxcomm_allreduce(s, s, 2, MTXCOMM_INT16, MTXCOMM_SUM, comm, nullptr),
                    MTXCOMM_SUCCESS);
          EXPECT_EQ(s[0], -5536);  // 60000 wraps
          EXPECT_EQ(s[1], 900);
          int16_t p = 300;  // 300^3 = 27000000 = 64704 mod 65536, as int16 -832
          ASSERT_EQ(mtxcomm_allreduce(&p, &p, 1, MTXCOMM_INT16, MTXCOMM_PROD, comm, nullptr),
                    MTXCOMM_SUCCESS);
          EXPECT_EQ(p, -832);
          uint16_t u[2] = {40000, static_cast<uint16_t>(rank == 0 ? 1 : 40000)};
          // u[0]: 120000 wraps to 54464, / 3 = 18154; u[1]: 80001 wraps to 14465, / 3 = 4821
          ASSERT_EQ(mtxcomm_allreduce(u, u, 2, MTXCOMM_UINT16, MTXCOMM_AVG, comm, nullptr),
                    MTXCOMM_SUCCESS);
          EXPECT_EQ(u[0], 18154);
          EXPECT_EQ(u[1], 4821);
          uint16_t m = static_cast<uint16_t>(rank == 1 ? 65535 : rank);
          ASSERT_EQ(mtxcomm_allreduce(&m, &m, 1, MTXCOMM_UINT16, MTXCOMM_MAX, comm, nullptr),
                    MTXCOMM_SUCCESS);
          EXPECT_EQ(m, 65535);
        },
        cfg);
  }
}

TEST(Api, MoreThanTwoToThe31BytesAndElements) {
  // int8, count = 2^31 + 13 (> 2 GiB, > INT_MAX elements), in place on 2 ranks (4.3 GB).
  const size_t count = (size_t{1} << 31) + 13;
  Config cfg;
  cfg.algo[static_cast<int>(Collective::kAllreduce)] = "ring";
  runRanks(
      2,
      [&](mtxcomm_comm_t comm, int rank) {
        std::unique_ptr<int8_t[]> buf(new int8_t[count]);
        for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int8_t>((i + rank) % 7);
        ASSERT_EQ(mtxcomm_allreduce(buf.get(), buf.get(), count, MTXCOMM_INT8, MTXCOMM_SUM, comm,
                                    nullptr),
                  MTXCOMM_SUCCESS)
            << mtxcomm_get_last_error(comm);
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          wrong += buf[i] != static_cast<int8_t>(i % 7 + (i + 1) % 7);
        }
        EXPECT_EQ(wrong, 0u);
      },
      cfg);
}

}  // namespace
}  // namespace mtxcomm
