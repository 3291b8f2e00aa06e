// Allreduce with op MTXCOMM_ADASUM (include/mtxcomm/mtxcomm.h): ranks as threads through the C
// API, each result checked against the pairwise formula and the tree written out here in
// double (with each level's output rounded to the datatype, as the op defines), and checked to
// be the same bits on every rank; the exact cases (orthogonal vectors add, identical vectors
// give the vector, a zero vector leaves the other); count 0 and one rank; refusals
// (integers, other collectives) that leave the communicator usable; no other algorithm (shm,
// hierarchical on emulated nodes, a forced schedule) ever runs it; and the TCP transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "algos/registry.h"
#include "common/test_util.h"
#include "harness.h"
#include "lib/base/dtype.h"
#include "lib/base/reduce.h"
#include "lib/comm/config.h"
#include "lib/comm/stores.h"
#include "mtxcomm/mtxcomm.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace {

using testing::runRanks;
using testutil::contains;
using Vec = std::vector<double>;
using Bytes = std::vector<unsigned char>;

// ---- The reference: the op's definition, in double -------------------------------------------

// v with every element rounded to dt (what a buffer of dt holds), as doubles again.
Vec roundTo(mtxcomm_datatype_t dt, const Vec& v) {
  Bytes b(v.size() * datatypeSize(dt));
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    storeElement(dt, b.data(), i, v[i]);
    out[i] = loadElement(dt, b.data(), i);
  }
  return out;
}

// adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, a coefficient 1 for |x| = 0.
Vec pairRef(const Vec& a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa == 0 ? 1.0 : 1.0 - ab / (2 * aa);
  const double cb = bb == 0 ? 1.0 : 1.0 - ab / (2 * bb);
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

// The tree: q = the largest power of two <= n; ranks r >= q fold onto r - q (the lower rank's
// vector first); then at distances d = 1, 2, 4, ... < q ranks r and r ^ d both take
// adasum(lower, higher). Every level's output is rounded to dt.
Vec treeRef(std::vector<Vec> v, mtxcomm_datatype_t dt) {
  const int n = static_cast<int>(v.size());
  int q = 1;
  while (2 * q <= n) q *= 2;
  for (int r = q; r < n; ++r) v[r - q] = roundTo(dt, pairRef(v[r - q], v[r]));
  for (int d = 1; d < q; d *= 2) {
    for (int r = 0; r < q; ++r) {
      if (r & d) continue;
      const Vec w = roundTo(dt, pairRef(v[r], v[r | d]));
      v[r] = v[r | d] = w;
    }
  }
  return v[0];
}

// ---- Running the collective ------------------------------------------------------------------

Bytes encode(mtxcomm_datatype_t dt, const Vec& v) {
  Bytes b(v.size() * datatypeSize(dt));
  for (size_t i = 0; i < v.size(); ++i) storeElement(dt, b.data(), i, v[i]);
  return b;
}

Vec decode(mtxcomm_datatype_t dt, const Bytes& b) {
  Vec v(b.size() / datatypeSize(dt));
  for (size_t i = 0; i < v.size(); ++i) v[i] = loadElement(dt, b.data(), i);
  return v;
}

// Random vectors with a common direction (so the pairs' dot products are far from 0) and a
// per-rank part and scale, exactly representable in dt.
std::vector<Vec> randomInputs(int n, size_t count, mtxcomm_datatype_t dt, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec common(count);
  for (double& x : common) x = u(gen);
  std::vector<Vec> in(n, Vec(count));
  for (int r = 0; r < n; ++r) {
    const double scale = 1.0 + 0.5 * r, mix = 0.3 + 0.1 * (r % 5);
    for (size_t i = 0; i < count; ++i) in[r][i] = scale * (common[i] + mix * u(gen));
    in[r] = roundTo(dt, in[r]);
  }
  return in;
}

// The adasum allreduce of inputs (one per rank) on the communicators of runRanks; returns every
// rank's result bytes and checks on each rank: success, the algorithm that ran, and that an
// out-of-place call left its send buffer alone.
std::vector<Bytes> runAdasum(const std::vector<Vec>& inputs, mtxcomm_datatype_t dt, bool inPlace,
                             const Config& cfg = Config(), const std::vector<int>& nodeOf = {}) {
  const int n = static_cast<int>(inputs.size());
  std::vector<Bytes> results(n);
  runRanks(
      n,
      [&](mtxcomm_comm_t comm, int rank) {
        const Bytes send = encode(dt, inputs[rank]);
        const size_t count = inputs[rank].size();
        Bytes in = send, out(send.size(), 0xee);
        void* recvbuf = inPlace ? in.data() : out.data();
        ASSERT_EQ(mtxcomm_allreduce(in.data(), recvbuf, count, dt, MTXCOMM_ADASUM, comm, nullptr),
                  MTXCOMM_SUCCESS)
            << mtxcomm_get_last_error(comm);
        EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), n == 1 ? "local" : "adasum");
        if (!inPlace) {
          EXPECT_EQ(in, send) << "the send buffer was written";
        }
        results[rank] = inPlace ? in : out;
      },
      cfg, nodeOf);
  return results;
}

void expectSameBitsOnEveryRank(const std::vector<Bytes>& results) {
  for (size_t r = 1; r < results.size(); ++r) {
    EXPECT_TRUE(results[r] == results[0]) << "rank " << r << " differs from rank 0";
  }
}

// max |got - want| <= tol * max |want| (a normwise bound: single elements may cancel).
void expectNear(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    const double e = std::fabs(got[i] - want[i]);
    if (!(e <= err)) {
      err = e;
      worst = i;
    }
  }
  EXPECT_LE(err, tol * scale) << what << ": element " << worst << " is " << got[worst]
                              << ", the formula gives " << want[worst];
}

double tolerance(mtxcomm_datatype_t dt) {
  switch (dt) {
    case MTXCOMM_FLOAT64:
      return 1e-12;
    case MTXCOMM_FLOAT32:
      return 1e-6;
    case MTXCOMM_FLOAT16:
      return 4e-3;  // a few ulps of 2^-10
    default:
      return 3e-2;  // bfloat16: a few ulps of 2^-7
  }
}

void checkAgainstTheTree(int n, mtxcomm_datatype_t dt, size_t count, bool inPlace) {
  const std::string what = std::string(datatypeName(dt)) + " n=" + std::to_string(n) +
                           " count=" + std::to_string(count) + (inPlace ? " in place" : "");
  const auto inputs = randomInputs(n, count, dt, 1000u * n + static_cast<unsigned>(count));
  const auto results = runAdasum(inputs, dt, inPlace);
  expectSameBitsOnEveryRank(results);
  expectNear(decode(dt, results[0]), treeRef(inputs, dt), tolerance(dt), what);
}

// ---- The formula and the tree ----------------------------------------------------------------

TEST(Adasum, Float32MatchesTheTree) {
  for (int n : {2, 3, 4, 5, 6, 7, 8}) {
    for (bool inPlace : {false, true}) checkAgainstTheTree(n, MTXCOMM_FLOAT32, 1003, inPlace);
  }
  checkAgainstTheTree(3, MTXCOMM_FLOAT32, 1, false);
  checkAgainstTheTree(4, MTXCOMM_FLOAT32, 300007, false);  // 1.2 MB per message
}

TEST(Adasum, Float64MatchesTheTree) {
  for (int n : {2, 3, 4, 8}) {
    for (bool inPlace : {false, true}) checkAgainstTheTree(n, MTXCOMM_FLOAT64, 1003, inPlace);
  }
}

// 16-bit vectors travel as 16 bits and each level's output is rounded to the datatype: the
// reference rounds the same way.
TEST(Adasum, Float16AndBfloat16MatchTheTree) {
  for (mtxcomm_datatype_t dt : {MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16}) {
    for (int n : {2, 3, 4, 8}) {
      for (bool inPlace : {false, true}) checkAgainstTheTree(n, dt, 1003, inPlace);
    }
  }
}

// Each level's output is rounded to the 16-bit type (the vectors are not widened for the whole
// tree): with two elements the library's dot products add in the reference's order, so the
// per-level reference is matched bit for bit, and the same tree rounded only at the end (float32
// in between) differs on some of the inputs.
TEST(Adasum, Float16IsRoundedAtEveryLevel) {
  int differsFromRoundingOnce = 0;
  for (unsigned seed = 0; seed < 40; ++seed) {
    for (int n : {3, 4}) {
      const auto inputs = randomInputs(n, 2, MTXCOMM_FLOAT16, 100u + seed);
      const auto results = runAdasum(inputs, MTXCOMM_FLOAT16, true);
      expectSameBitsOnEveryRank(results);
      const Vec got = decode(MTXCOMM_FLOAT16, results[0]);
      EXPECT_EQ(got, treeRef(inputs, MTXCOMM_FLOAT16)) << "seed " << seed << " n=" << n;
      const Vec once = roundTo(MTXCOMM_FLOAT16, treeRef(inputs, MTXCOMM_FLOAT32));
      differsFromRoundingOnce += got != once;
    }
  }
  EXPECT_GT(differsFromRoundingOnce, 0);
}

// Orthogonal vectors (each element non-zero on one rank only) stay orthogonal up the tree: the
// result is exactly their sum.
TEST(Adasum, OrthogonalVectorsAdd) {
  for (int n : {2, 3, 4, 5, 8}) {
    for (mtxcomm_datatype_t dt : {MTXCOMM_FLOAT16, MTXCOMM_FLOAT32, MTXCOMM_FLOAT64}) {
      const size_t count = 37;
      std::vector<Vec> in(n, Vec(count, 0.0));
      Vec sum(count, 0.0);
      for (size_t i = 0; i < count; ++i) {
        const int owner = static_cast<int>(i % n);
        in[owner][i] = (i % 2 ? -1.0 : 1.0) * (1.0 + static_cast<double>(i) / 4);
        sum[i] = in[owner][i];
      }
      const auto results = runAdasum(in, dt, false);
      expectSameBitsOnEveryRank(results);
      EXPECT_EQ(decode(dt, results[0]), sum) << datatypeName(dt) << " n=" << n;
    }
  }
}

// adasum(a, a) = a/2 + a/2 = a at every level, bit for bit.
TEST(Adasum, IdenticalVectorsGiveTheVector) {
  for (int n : {2, 3, 4, 6, 8}) {
    for (mtxcomm_datatype_t dt : {MTXCOMM_BFLOAT16, MTXCOMM_FLOAT32, MTXCOMM_FLOAT64}) {
      const Vec v = randomInputs(1, 101, dt, 7u)[0];
      const auto results = runAdasum(std::vector<Vec>(n, v), dt, true);
      expectSameBitsOnEveryRank(results);
      EXPECT_TRUE(results[0] == encode(dt, v)) << datatypeName(dt) << " n=" << n;
    }
  }
}

// A zero vector's coefficient is 1: adasum(v, 0) = v exactly; elsewhere in the tree the
// reference (which takes the same rule) decides.
TEST(Adasum, ZeroVectorOnOneRank) {
  const mtxcomm_datatype_t dt = MTXCOMM_FLOAT32;
  auto two = randomInputs(2, 64, dt, 11u);
  two[1].assign(64, 0.0);
  auto results = runAdasum(two, dt, false);
  expectSameBitsOnEveryRank(results);
  EXPECT_TRUE(results[0] == encode(dt, two[0]));
  auto three = randomInputs(3, 64, dt, 12u);
  three[2].assign(64, 0.0);  // rank 2 folds onto rank 0: adasum(v0, 0) = v0, then (v0, v1)
  results = runAdasum(three, dt, false);
  expectSameBitsOnEveryRank(results);
  const auto twoOnly = runAdasum({three[0], three[1]}, dt, false);
  EXPECT_TRUE(results[0] == twoOnly[0]);
  for (int zero : {0, 2, 3}) {
    auto four = randomInputs(4, 64, dt, 13u);
    four[zero].assign(64, 0.0);
    results = runAdasum(four, dt, false);
    expectSameBitsOnEveryRank(results);
    expectNear(decode(dt, results[0]), treeRef(four, dt), 1e-6,
               "zero on rank " + std::to_string(zero));
  }
  // Every vector zero: zero.
  results = runAdasum(std::vector<Vec>(4, Vec(16, 0.0)), dt, false);
  EXPECT_EQ(decode(dt, results[3]), Vec(16, 0.0));
}

// A NaN on one rank makes every element NaN on every rank (the dot products are NaN).
TEST(Adasum, NaNOnOneRankMakesTheWholeResultNaN) {
  auto in = randomInputs(4, 20, MTXCOMM_FLOAT32, 5u);
  in[3][5] = std::numeric_limits<double>::quiet_NaN();
  const auto results = runAdasum(in, MTXCOMM_FLOAT32, false);
  for (const Bytes& b : results) {
    for (double x : decode(MTXCOMM_FLOAT32, b)) EXPECT_TRUE(std::isnan(x));
  }
}

TEST(Adasum, CountZeroAndOneRank) {
  runRanks(3, [](mtxcomm_comm_t comm, int) {
    EXPECT_EQ(
        mtxcomm_allreduce(nullptr, nullptr, 0, MTXCOMM_FLOAT32, MTXCOMM_ADASUM, comm, nullptr),
        MTXCOMM_SUCCESS);
    float x = 2.0f;  // the ranks are still in step
    ASSERT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_SUCCESS);
    EXPECT_EQ(x, 6.0f);
  });
  const Vec v = {1.5, -2.0, 3.25};
  const auto results = runAdasum({v}, MTXCOMM_FLOAT64, false);  // one rank: its own vector
  EXPECT_EQ(decode(MTXCOMM_FLOAT64, results[0]), v);
}

// ---- Refusals ----------------------------------------------------------------------------------

TEST(Adasum, IntegersAndOtherCollectivesAreRefusedAndTheCommStaysUsable) {
  runRanks(3, [](mtxcomm_comm_t comm, int rank) {
    for (mtxcomm_datatype_t dt : {MTXCOMM_INT32, MTXCOMM_UINT8, MTXCOMM_INT64, MTXCOMM_INT16,
                                  MTXCOMM_UINT16, MTXCOMM_BOOL}) {
      int64_t v[4] = {1, 2, 3, 4}, out[4] = {0};
      EXPECT_EQ(mtxcomm_allreduce(v, out, 4, dt, MTXCOMM_ADASUM, comm, nullptr),
                MTXCOMM_INVALID_ARGUMENT);
      const std::string err = mtxcomm_get_last_error(comm);
      EXPECT_TRUE(contains(err, "adasum") && contains(err, datatypeName(dt))) << err;
      EXPECT_EQ(out[0], 0);  // nothing moved
    }
    float f[12] = {1, 2, 3}, out[4] = {0};
    EXPECT_EQ(mtxcomm_reduce_scatter(f, out, 4, MTXCOMM_FLOAT32, MTXCOMM_ADASUM, comm, nullptr),
              MTXCOMM_INVALID_ARGUMENT);
    std::string err = mtxcomm_get_last_error(comm);
    EXPECT_TRUE(contains(err, "adasum") && contains(err, "reduce_scatter")) << err;
    EXPECT_EQ(mtxcomm_reduce(f, out, 4, MTXCOMM_FLOAT32, MTXCOMM_ADASUM, 0, comm, nullptr),
              MTXCOMM_INVALID_ARGUMENT);
    err = mtxcomm_get_last_error(comm);
    EXPECT_TRUE(contains(err, "adasum") && contains(err, "reduce")) << err;
    EXPECT_EQ(out[0], 0.0f);
    // Usable afterwards, for other ops and for adasum.
    float x[2] = {1.0f, 2.0f};
    ASSERT_EQ(mtxcomm_allreduce(x, x, 2, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm, nullptr),
              MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    EXPECT_EQ(x[0], 3.0f);
    EXPECT_EQ(x[1], 6.0f);
    float y[3] = {0, 0, 0};
    y[rank] = 1.0f + rank;  // orthogonal: the plain sum
    ASSERT_EQ(mtxcomm_allreduce(y, y, 3, MTXCOMM_FLOAT32, MTXCOMM_ADASUM, comm, nullptr),
              MTXCOMM_SUCCESS)
        << mtxcomm_get_last_error(comm);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 2.0f);
    EXPECT_EQ(y[2], 3.0f);
  });
}

// ---- Only the adasum algorithm runs it -----------------------------------------------------

// Whatever MTXCOMM_ALLREDUCE_ALGO names (shm, hierarchical, a schedule), op adasum runs on the
// adasum algorithm and gives its result; adasum forced for op sum falls back to another.
TEST(Adasum, EveryForcedAlgorithmLeavesAdasumToTheAdasumAlgorithm) {
  const auto inputs = randomInputs(4, 257, MTXCOMM_FLOAT32, 3u);
  const Bytes want = runAdasum(inputs, MTXCOMM_FLOAT32, false)[0];
  for (const char* forced : algorithmNames(Collective::kAllreduce)) {
    Config cfg;
    cfg.algo[static_cast<int>(Collective::kAllreduce)] = forced;
    auto results = runAdasum(inputs, MTXCOMM_FLOAT32, false, cfg);
    EXPECT_TRUE(results[2] == want) << "forced " << forced;
    // On emulated nodes (two of two ranks), where hierarchical could compose.
    results = runAdasum(inputs, MTXCOMM_FLOAT32, false, cfg, {0, 0, 1, 1});
    EXPECT_TRUE(results[1] == want) << "forced " << forced << ", two nodes";
  }
  Config sumCfg;
  sumCfg.algo[static_cast<int>(Collective::kAllreduce)] = "adasum";
  runRanks(
      3,
      [](mtxcomm_comm_t comm, int rank) {
        double x = rank + 1.0;
        ASSERT_EQ(mtxcomm_allreduce(&x, &x, 1, MTXCOMM_FLOAT64, MTXCOMM_SUM, comm, nullptr),
                  MTXCOMM_SUCCESS);
        EXPECT_EQ(x, 6.0);
        EXPECT_NE(unwrapComm(comm)->lastAlgorithm(), "adasum");
      },
      sumCfg);
}

// ---- Over the TCP transport ----------------------------------------------------------------

// Three ranks (a fold) as threads, each with its own store client and TCP transport, no shared
// memory: the same bits on every rank and the tree's result.
TEST(Adasum, OverTcp) {
  const int n = 3;
  const std::string spec = testutil::tcpSpec();
  const std::chrono::milliseconds timeout(20000);
  std::vector<std::unique_ptr<Store>> stores(n);
  std::vector<mtxcomm_comm_t> comms(n);
  testutil::runThreads(n, [&](int rank) {
    stores[rank] = makeStore(spec, rank, n, timeout, testutil::testSecret());
    Config cfg;
    cfg.shm = "off";
    auto comm = std::make_unique<Comm>(makeTcpTransport(*stores[rank], rank, n, timeout), cfg, 0);
    comm->setup();
    comms[rank] = wrapComm(std::move(comm));
  });
  for (mtxcomm_datatype_t dt : {MTXCOMM_FLOAT32, MTXCOMM_FLOAT16}) {
    const auto inputs = randomInputs(n, 70001, dt, 21u);
    std::vector<Bytes> results(n);
    testutil::runThreads(n, [&](int rank) {
      results[rank] = encode(dt, inputs[rank]);
      ASSERT_EQ(mtxcomm_allreduce(results[rank].data(), results[rank].data(), inputs[rank].size(),
                                  dt, MTXCOMM_ADASUM, comms[rank], nullptr),
                MTXCOMM_SUCCESS)
          << mtxcomm_get_last_error(comms[rank]);
      EXPECT_EQ(unwrapComm(comms[rank])->lastAlgorithm(), "adasum");
    });
    expectSameBitsOnEveryRank(results);
    expectNear(decode(dt, results[0]), treeRef(inputs, dt), tolerance(dt), datatypeName(dt));
  }
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

}  // namespace
}  // namespace mtxcomm
