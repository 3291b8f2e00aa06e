// The C API's contract beyond the value matrix: argument errors (rejected before any byte
// moves, communicator still usable), timeouts and aborted peers (named, then poisoned), split,
// determinism, float16 rounding once, NaN propagation, counts beyond 2^31, the configuration
// registry and algorithm selection.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "algos/registry.h"
#include "algos/schedule.h"
#include "harness.h"
#include "lib/comm/config.h"
#include "lib/base/reduce.h"
#include "lib/comm/select.h"
#include "mtxcomm/mtxcomm.hpp"

namespace mtxcomm {
namespace {

using testing::makeInprocComms;
using testing::runRanks;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// After a rejected call the communicator must still work: a 2-element allreduce.
void expectUsable(mtxcomm_comm_t comm, int n) {
  float in[2] = {1.0f, 2.0f}, out[2] = {0, 0};
  ASSERT_EQ(mtxcomm_allreduce(in, out, 2, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
            MTXCOMM_SUCCESS)
      << mtxcomm_get_last_error(comm);
  EXPECT_EQ(out[0], 1.0f * n);
  EXPECT_EQ(out[1], 2.0f * n);
}

TEST(Api, InvalidArgumentsAreRejectedLocallyAndLeaveTheCommUsable) {
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    float buf[64] = {0};
    float out[64] = {0};
    struct Bad {
      std::function<mtxcomm_result_t()> call;
      const char* mustMention;
    };
    std::vector<Bad> bad = {
        {[&] {
           return mtxcomm_allreduce(nullptr, out, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "sendbuf is NULL"},
        {[&] {
           return mtxcomm_allreduce(buf, nullptr, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "recvbuf is NULL"},
        {[&] {
           return mtxcomm_allreduce(buf, out, 4, static_cast<mtxcomm_datatype_t>(42), MTXCOMM_SUM,
                                    comm, nullptr);
         },
         "invalid datatype 42"},
        {[&] {
           return mtxcomm_allreduce(buf, out, 4, MTXCOMM_FLOAT32, static_cast<mtxcomm_op_t>(-1),
                                    comm, nullptr);
         },
         "invalid op -1"},
        {[&] { return mtxcomm_broadcast(buf, out, 4, MTXCOMM_FLOAT32, 3, comm, nullptr); },
         "root 3 is out of range"},
        {[&] {
           return mtxcomm_reduce(buf, out, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, -1, comm, nullptr);
         },
         "root -1 is out of range"},
        {[&] {
           return mtxcomm_allreduce(buf, buf + 1, 8, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "partially overlap"},
        {[&] { return mtxcomm_allgather(buf + 1, buf, 4, MTXCOMM_FLOAT32, comm, nullptr); },
         "partially overlap"},
        {[&] {
           return mtxcomm_reduce_scatter(buf, buf + 1, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm,
                                         nullptr);
         },
         "partially overlap"},
        {[&] {
           return mtxcomm_allreduce(buf, out, std::numeric_limits<size_t>::max() / 2,
                                    MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
         },
         "overflows size_t"},
        {[&] {
           return mtxcomm_allgather(buf, out, std::numeric_limits<size_t>::max() / 8,
                                    MTXCOMM_FLOAT32, comm, nullptr);
         },
         "overflows size_t"},
    };
    for (size_t i = 0; i < bad.size(); ++i) {
      EXPECT_EQ(bad[i].call(), MTXCOMM_INVALID_ARGUMENT) << "case " << i;
      std::string msg = mtxcomm_get_last_error(comm);
      EXPECT_TRUE(contains(msg, bad[i].mustMention)) << "case " << i << ": " << msg;
      EXPECT_TRUE(contains(msg, "rank " + std::to_string(rank))) << msg;
    }
    // The message names the rank and what was wrong (checked for the last error).
    EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "rank " + std::to_string(rank)))
        << mtxcomm_get_last_error(comm);
    EXPECT_TRUE(contains(mtxcomm_get_last_error(comm), "allgather"))
        << mtxcomm_get_last_error(comm);
    EXPECT_EQ(mtxcomm_allreduce(buf, out, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, &rank),
              MTXCOMM_UNSUPPORTED);
    expectUsable(comm, 3);
  });
}

TEST(Api, InPlaceAllgatherOnRankZeroIsValid) {
  // rank 0 passing sendbuf == recvbuf is in place for allgather (recvbuf + 0 * sendcount).
  runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    int v[4] = {0, 0, 0, 0};
    v[rank * 2] = 10 + rank;
    v[rank * 2 + 1] = 20 + rank;
    ASSERT_EQ(mtxcomm_allgather(v + rank * 2, v, 2, MTXCOMM_INT32, comm, nullptr), MTXCOMM_SUCCESS);
    EXPECT_EQ(v[0], 10);
    EXPECT_EQ(v[1], 20);
    EXPECT_EQ(v[2], 11);
    EXPECT_EQ(v[3], 21);
  });
}

TEST(Api, NullHandlesAndOutputPointers) {
  float x = 1;
  EXPECT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, nullptr, nullptr),
            MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_barrier(nullptr), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "comm is NULL"));
  int r = 0;
  EXPECT_EQ(mtxcomm_comm_rank(nullptr, &r), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_init_from_env(nullptr), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_get_version(nullptr), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_comm_destroy(nullptr), MTXCOMM_SUCCESS);
  int v = 0;
  EXPECT_EQ(mtxcomm_get_version(&v), MTXCOMM_SUCCESS);
  EXPECT_EQ(v, MTXCOMM_VERSION_CODE);
  for (int code = 0; code <= MTXCOMM_UNSUPPORTED; ++code) {
    std::string s = mtxcomm_get_error_string(static_cast<mtxcomm_result_t>(code));
    EXPECT_FALSE(s.empty());
    EXPECT_NE(s, "unknown result code");
  }
  EXPECT_STREQ(mtxcomm_get_error_string(static_cast<mtxcomm_result_t>(99)), "unknown result code");
  EXPECT_EQ(mtxcomm_datatype_size(MTXCOMM_BFLOAT16), 2u);
  EXPECT_EQ(mtxcomm_datatype_size(static_cast<mtxcomm_datatype_t>(10)), 0u);
}

TEST(Api, ZeroCountSucceedsWithNullBuffersAndKeepsRanksInStep) {
  runRanks(4, [](mtxcomm_comm_t comm, int rank) {
    EXPECT_EQ(mtxcomm_allreduce(nullptr, nullptr, 0, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(mtxcomm_broadcast(nullptr, nullptr, 0, MTXCOMM_INT8, 1, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(mtxcomm_allgather(nullptr, nullptr, 0, MTXCOMM_INT8, comm, nullptr), MTXCOMM_SUCCESS);
    expectUsable(comm, 4);
  });
}

TEST(Api, RanksThatDisagreeGetAnErrorNotWrongData) {
  // Over shared memory every barrier carries the call: a mismatch is an error naming both.
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    std::vector<float> x(rank == 2 ? 20 : 10, 1.0f);
    mtxcomm_result_t rc = mtxcomm_allreduce(x.data(), x.data(), x.size(), MTXCOMM_FLOAT32,
                                            MTXCOMM_SUM, comm, nullptr);
    EXPECT_NE(rc, MTXCOMM_SUCCESS);
    std::string msg = mtxcomm_get_last_error(comm);
    if (rc == MTXCOMM_INVALID_USAGE) {
      EXPECT_TRUE(contains(msg, "disagree")) << msg;
      EXPECT_TRUE(contains(msg, "allreduce(count 20, float32, sum) as call #")) << msg;
    } else {
      EXPECT_EQ(rc, MTXCOMM_REMOTE_ERROR) << msg;  // a peer that saw it first aborted
    }
  });
  // A call rejected on one rank only: the others must not pair it with that rank's next call.
  runRanks(2, [](mtxcomm_comm_t comm, int rank) {
    float x = 1.0f + rank, y = 10.0f * (rank + 1);
    mtxcomm_op_t op = rank == 0 ? static_cast<mtxcomm_op_t>(9) : MTXCOMM_SUM;
    mtxcomm_result_t first = mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, op, comm, nullptr);
    EXPECT_NE(first, MTXCOMM_SUCCESS);
    mtxcomm_result_t second =
        mtxcomm_allreduce(&y, &y, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
    if (rank == 0) {
      EXPECT_EQ(first, MTXCOMM_INVALID_ARGUMENT);
      // Its second call meets rank 1's first: a disagreement (or rank 1's abort), never 12.
      EXPECT_NE(second, MTXCOMM_SUCCESS) << "y = " << y;
    } else {
      EXPECT_NE(first, MTXCOMM_SUCCESS) << "x = " << x;
    }
  });
}

TEST(Api, TimeoutNamesThePeerThenPoisons) {
  for (const char* shm : {"off", "auto"}) {
    Config cfg;
    cfg.timeoutSeconds = 0.3;
    cfg.shm = shm;
    const std::string algo = cfg.shm == "off" ? "recursive_doubling" : "shm";
    std::atomic<bool> rank0Done{false};
    runRanks(
        2,
        [&](mtxcomm_comm_t comm, int rank) {
          if (rank == 1) {
            // Never joins; waits until rank 0 has given up.
            while (!rank0Done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            return;
          }
          float x[4] = {1, 2, 3, 4};
          auto t0 = std::chrono::steady_clock::now();
          mtxcomm_result_t rc =
              mtxcomm_allreduce(x, x, 4, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr);
          double secs =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          rank0Done = true;
          EXPECT_EQ(rc, MTXCOMM_TIMEOUT);
          EXPECT_GE(secs, 0.3);
          // Not a speed check: only "gave up, did not hang" (a loaded host stretches it).
          EXPECT_LT(secs, 120.0);
          std::string msg = mtxcomm_get_last_error(comm);
          EXPECT_TRUE(contains(msg, "rank 0")) << msg;
          EXPECT_TRUE(contains(msg, "peer rank 1")) << msg;
          EXPECT_TRUE(contains(msg, "allreduce")) << msg;
          EXPECT_TRUE(contains(msg, "algorithm " + algo)) << msg;
          // Poisoned: the next call fails at once and points back to the first error.
          EXPECT_EQ(mtxcomm_barrier(comm), MTXCOMM_INVALID_USAGE);
          std::string again = mtxcomm_get_last_error(comm);
          EXPECT_TRUE(contains(again, "first error was")) << again;
          EXPECT_TRUE(contains(again, "peer rank 1")) << again;
        },
        cfg);
  }
}

TEST(Api, AbortedPeerIsARemoteErrorNamingIt) {
  Config cfg;
  cfg.timeoutSeconds = 20;  // the errors must come long before this
  auto comms = makeInprocComms(3, cfg);
  std::vector<mtxcomm_result_t> rc(3, MTXCOMM_SUCCESS);
  std::vector<std::string> msg(3);
  std::vector<double> secs(3, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> x(1 << 16, 1.0f);
      auto t0 = std::chrono::steady_clock::now();
      rc[r] = mtxcomm_allreduce(x.data(), x.data(), x.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM,
                                comms[r], nullptr);
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      msg[r] = mtxcomm_get_last_error(comms[r]);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  mtxcomm_comm_abort(comms[2]);
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rc[r], MTXCOMM_REMOTE_ERROR) << msg[r];
    EXPECT_TRUE(contains(msg[r], "peer rank 2")) << msg[r];
    // REMOTE_ERROR, not TIMEOUT: the abort reached them before the 20 s timeout.
    EXPECT_LT(secs[r], cfg.timeoutSeconds);
    mtxcomm_comm_destroy(comms[r]);
  }
}

TEST(Api, SplitFollowsColorThenKeyThenRank) {
  runRanks(5, [](mtxcomm_comm_t comm, int rank) {
    mtxcomm_comm_t sub = nullptr;
    // Odd ranks get color 1, even ranks color 0, rank 4 opts out; key reverses the order.
    int color = rank == 4 ? MTXCOMM_UNDEFINED : rank % 2;
    ASSERT_EQ(mtxcomm_comm_split(comm, color, -rank, &sub), MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    if (rank == 4) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      int subRank = -1, subSize = 0;
      mtxcomm_comm_rank(sub, &subRank);
      mtxcomm_comm_size(sub, &subSize);
      EXPECT_EQ(subSize, 2);
      // color 0: ranks {0, 2} ordered by key -rank: 2 first. color 1: {1, 3}: 3 first.
      EXPECT_EQ(subRank, (rank == 2 || rank == 3) ? 0 : 1);
      int v = rank + 1, sum = 0;
      ASSERT_EQ(mtxcomm_allreduce(&v, &sum, 1, MTXCOMM_INT32, MTXCOMM_SUM, sub, nullptr),
                MTXCOMM_SUCCESS);
      EXPECT_EQ(sum, rank % 2 == 0 ? 1 + 3 : 2 + 4);
      mtxcomm_comm_destroy(sub);
    }
    // The parent still works, and its traffic never mixed with the children's.
    expectUsable(comm, 5);
  });
}

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

TEST(Config, BadValuesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
  } cases[] = {{"MTXCOMM_TIMEOUT", "abc"},
               {"MTXCOMM_TIMEOUT", "-1"},
               {"MTXCOMM_LOG_LEVEL", "LOUD"},
               {"MTXCOMM_SEGMENT_BYTES", "12Q"},
               {"MTXCOMM_SEGMENT_BYTES", "1"},
               {"MTXCOMM_ALLREDUCE_ALGO", "nonsense"},
               {"MTXCOMM_TRANSPORT", "carrier_pigeon"},
               {"MTXCOMM_STORE", "http://x"},
               {"MTXCOMM_RANK", "-3"},
               {"MTXCOMM_UCX_EAGER_LIMIT", "2G"},
               {"MTXCOMM_UCX_EAGER_LIMIT", "lots"}};
  for (const Case& c : cases) {
    setenv(c.var, c.value, 1);
    try {
      Config::fromEnvironment();
      ADD_FAILURE() << c.var << "=" << c.value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE);
      EXPECT_TRUE(contains(e.what(), c.var)) << e.what();
      EXPECT_TRUE(contains(e.what(), c.value)) << e.what();
    }
    unsetenv(c.var);
  }
  setenv("MTXCOMM_ALLREDUCE_ALGO", "nonsense", 1);
  try {
    Config::fromEnvironment();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "ring|recursive_doubling|rabenseifner")) << e.what();
  }
  unsetenv("MTXCOMM_ALLREDUCE_ALGO");
}

TEST(Config, ValuesAreParsedAndUnknownNamesReported) {
  setenv("MTXCOMM_TIMEOUT", "2.5", 1);
  setenv("MTXCOMM_SEGMENT_BYTES", "64K", 1);
  setenv("MTXCOMM_BROADCAST_ALGO", "scatter_allgather", 1);
  setenv("MTXCOMM_TIMEOUTT", "1", 1);
  setenv("MTXCOMM_UCX_EAGER_LIMIT", "256K", 1);
  setenv("MTXCOMM_TCP_IFADDR", "127.0.0.1", 1);
  Config c = Config::fromEnvironment();
  EXPECT_EQ(c.timeoutSeconds, 2.5);
  EXPECT_EQ(c.segmentBytes, 65536u);
  EXPECT_EQ(c.ucxEagerLimit, 262144u);
  EXPECT_EQ(c.tcpIfaddr, "127.0.0.1");
  EXPECT_EQ(c.algorithmFor(Collective::kBroadcast), "scatter_allgather");
  auto unknown = Config::unknownVariables();
  EXPECT_NE(std::find(unknown.begin(), unknown.end(), "MTXCOMM_TIMEOUTT"), unknown.end());
  bool echoed = false;
  for (const auto& line : c.describe()) echoed = echoed || line == "MTXCOMM_SEGMENT_BYTES=65536";
  EXPECT_TRUE(echoed);
  EXPECT_EQ(std::find(unknown.begin(), unknown.end(), "MTXCOMM_TCP_IFADDR"), unknown.end());
  for (const char* v : {"MTXCOMM_TIMEOUT", "MTXCOMM_SEGMENT_BYTES", "MTXCOMM_BROADCAST_ALGO",
                        "MTXCOMM_TIMEOUTT", "MTXCOMM_UCX_EAGER_LIMIT", "MTXCOMM_TCP_IFADDR"})
    unsetenv(v);
  // Every variable in the registry has help text and a type.
  for (const ConfigVar& v : configVars()) {
    EXPECT_FALSE(v.help.empty()) << v.name;
    EXPECT_FALSE(v.type.empty()) << v.name;
  }
}

TEST(Config, BindingsReadNormalisedValuesThroughTheCApi) {
  char buf[64];
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_FUSION_BYTES", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_STREQ(buf, "67108864");  // the default, 64M
  setenv("MTXCOMM_FUSION_BYTES", "2K", 1);
  setenv("MTXCOMM_CYCLE_TIME", "0.005", 1);
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_FUSION_BYTES", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_STREQ(buf, "2048");
  ASSERT_EQ(mtxcomm_config_get("MTXCOMM_CYCLE_TIME", buf, sizeof(buf)), MTXCOMM_SUCCESS);
  EXPECT_STREQ(buf, "0.005");
  EXPECT_EQ(mtxcomm_config_get("MTXCOMM_CYCLE_TIME", buf, 3), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_EQ(mtxcomm_config_get("MTXCOMM_NO_SUCH", buf, sizeof(buf)), MTXCOMM_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mtxcomm_get_last_error(nullptr)).find("MTXCOMM_NO_SUCH"),
            std::string::npos);
  setenv("MTXCOMM_CYCLE_TIME", "2", 1);  // above the 1 s limit
  EXPECT_EQ(mtxcomm_config_get("MTXCOMM_CYCLE_TIME", buf, sizeof(buf)), MTXCOMM_INVALID_USAGE);
  EXPECT_NE(std::string(mtxcomm_get_last_error(nullptr)).find("MTXCOMM_CYCLE_TIME"),
            std::string::npos);
  unsetenv("MTXCOMM_FUSION_BYTES");
  unsetenv("MTXCOMM_CYCLE_TIME");
}

TEST(Api, LocalRankAndSizeCountTheRanksOnThisNode) {
  // Threads of one process are on one node.
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    int lr = -1, ls = -1;
    ASSERT_EQ(mtxcomm_comm_local_rank(comm, &lr), MTXCOMM_SUCCESS);
    ASSERT_EQ(mtxcomm_comm_local_size(comm, &ls), MTXCOMM_SUCCESS);
    EXPECT_EQ(lr, rank);
    EXPECT_EQ(ls, 3);
    EXPECT_EQ(mtxcomm_comm_local_rank(comm, nullptr), MTXCOMM_INVALID_ARGUMENT);
  });
}

TEST(Selection, ForcedAlgorithmThatDeclinesFallsBackVisibly) {
  CollArgs a;
  a.coll = Collective::kAllgather;
  a.count = 10;
  a.elemSize = 4;
  Selection s = selectAlgorithm(a, CommInfo{3, nullptr}, "recursive_doubling", 0);
  EXPECT_STREQ(s.algorithm->name, "ring");
  EXPECT_TRUE(contains(s.why, "power-of-two")) << s.why;
  Selection t = selectAlgorithm(a, CommInfo{4, nullptr}, "recursive_doubling", 0);
  EXPECT_STREQ(t.algorithm->name, "recursive_doubling");
  try {
    selectAlgorithm(a, CommInfo{4, nullptr}, "bogus", 0);
    ADD_FAILURE() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE);
  }
  // The automatic rule by size.
  CollArgs r;
  r.coll = Collective::kAllreduce;
  r.elemSize = 4;
  r.count = 16;
  EXPECT_STREQ(defaultAlgorithm(r, CommInfo{8, nullptr})->name, "recursive_doubling");
  r.count = 1 << 20;
  EXPECT_STREQ(defaultAlgorithm(r, CommInfo{8, nullptr})->name, "ring");
  // Every registered algorithm has a description and is found by its name.
  for (const Algorithm& alg : algorithms()) {
    EXPECT_EQ(findAlgorithm(alg.coll, alg.name), &alg);
    EXPECT_GT(std::strlen(alg.description), 10u);
  }
}

TEST(Selection, LastAlgorithmReflectsTheForcedChoice) {
  Config cfg;
  cfg.algo[static_cast<int>(Collective::kAllreduce)] = "rabenseifner";
  runRanks(
      3,
      [](mtxcomm_comm_t comm, int) {
        float x[8] = {0};
        ASSERT_EQ(mtxcomm_allreduce(x, x, 8, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
                  MTXCOMM_SUCCESS);
        EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), "rabenseifner");
      },
      cfg);
}

TEST(Schedule, PrintsItsSteps) {
  CollArgs a;
  a.count = 8;
  a.elemSize = 4;
  float in[8] = {0}, out[8] = {0};
  a.sendbuf = in;
  a.recvbuf = out;
  Schedule s(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
  AlgoParams p;
  buildAllreduceRing(a, 0, 4, p, s);
  // 3 reduce-scatter steps and 3 allgather steps of 2 elements (8 bytes) each.
  EXPECT_EQ(s.steps().size(), 6u);
  std::string text = s.toString();
  EXPECT_TRUE(contains(text, "send 8 B -> rank 1")) << text;
  EXPECT_TRUE(contains(text, "recv 8 B <- rank 3")) << text;
  EXPECT_TRUE(contains(text, "reduce 2 elements")) << text;
}

// Ring allreduce and ring allgather never send a message larger than a segment, in either phase
// (over UCX/TCP every message then stays under the eager limit).
TEST(Schedule, RingMessagesAreAtMostOneSegment) {
  const size_t count = 3 * 1000 + 7, seg = 1024;  // blocks of ~1000 floats: 4 segments each
  std::vector<float> in(count, 1.0f), out(count, 0.0f);
  CollArgs a;
  a.count = count;
  a.elemSize = 4;
  a.sendbuf = in.data();
  a.recvbuf = out.data();
  AlgoParams p;
  p.segmentBytes = seg;
  using Build = void (*)(const CollArgs&, int, int, const AlgoParams&, Schedule&);
  for (Build build : {Build{buildAllreduceRing}, Build{buildAllgatherRing}}) {
    CollArgs args = a;
    if (build == buildAllgatherRing) {
      args.count = count / 3;
      out.assign(count, 0.0f);
    }
    Schedule s(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
    build(args, 1, 3, p, s);
    size_t sent = 0, largest = 0;
    for (const Step& step : s.steps()) {
      for (const CommOp& op : step.comm) {
        largest = std::max(largest, op.bytes);
        if (op.isSend) sent += op.bytes;
      }
    }
    EXPECT_LE(largest, seg) << s.toString();
    EXPECT_GT(sent, 2 * seg) << s.toString();  // several segments were sent
  }
}

TEST(CppWrapper, ThrowsErrorWithCodeAndMessage) {
  auto comms = makeInprocComms(1);
  Communicator c(comms[0]);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  float x = 3;
  c.allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_AVG);
  EXPECT_EQ(x, 3.0f);
  try {
    c.broadcast(&x, &x, 1, MTXCOMM_FLOAT32, 5);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), MTXCOMM_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(e.what(), "root 5")) << e.what();
  }
  Communicator sub = c.split(0, 0);
  EXPECT_EQ(sub.size(), 1);
}

TEST(InitFromEnv, SingleProcessWithoutLauncherIsSizeOne) {
  // Not under a launcher, whatever started this test.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                        "SLURM_STEP_ID", "MTXCOMM_STORE", "MTXCOMM_RANK", "MTXCOMM_SIZE"}) {
    unsetenv(v);
  }
  mtxcomm_comm_t comm = nullptr;
  ASSERT_EQ(mtxcomm_comm_init_from_env(&comm), MTXCOMM_SUCCESS) << mtxcomm_get_last_error(nullptr);
  int size = 0;
  mtxcomm_comm_size(comm, &size);
  EXPECT_EQ(size, 1);
  double d[2] = {1.5, 2.5}, o[2] = {0, 0};
  EXPECT_EQ(mtxcomm_allreduce(d, o, 2, MTXCOMM_FLOAT64, MTXCOMM_MAX, comm, nullptr),
            MTXCOMM_SUCCESS);
  EXPECT_EQ(o[1], 2.5);
  mtxcomm_comm_destroy(comm);
  setenv("MTXCOMM_RANK", "0", 1);
  setenv("MTXCOMM_SIZE", "2", 1);
  EXPECT_EQ(mtxcomm_comm_init_from_env(&comm), MTXCOMM_INVALID_USAGE);
  EXPECT_EQ(comm, nullptr);
  EXPECT_TRUE(contains(mtxcomm_get_last_error(nullptr), "MTXCOMM_STORE"));
  unsetenv("MTXCOMM_RANK");
  unsetenv("MTXCOMM_SIZE");
}

}  // namespace
}  // namespace mtxcomm

namespace mtxcomm {
namespace {

// The README's variable table is kept true: it names every variable of the registry.
TEST(Docs, ReadmeListsEveryVariable) {
  std::ifstream in(std::string(MTXCOMM_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const ConfigVar& v : configVars()) {
    EXPECT_NE(text.find("| `" + v.name + "` |"), std::string::npos) << v.name;
  }
  for (const Algorithm& a : algorithms()) {
    EXPECT_NE(text.find(std::string("`") + a.name + "`"), std::string::npos) << a.name;
  }
}

}  // namespace
}  // namespace mtxcomm
