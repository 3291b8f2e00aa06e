#include "bench/bench_tune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "lib/base/reduce.h"
#include "lib/base/topology.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/comm/cost_model.h"

namespace mtxcomm {
namespace bench {

namespace {

using Clock = std::chrono::steady_clock;

void runColl(Comm& c, Collective coll, void* buf, size_t count, mtxcomm_datatype_t dt,
             mtxcomm_op_t op = MTXCOMM_SUM) {
  CollArgs a;
  a.coll = coll;
  a.sendbuf = buf;
  a.recvbuf = buf;
  a.count = count;
  a.dtype = dt;
  a.op = op;
  c.run(a);
}

double maxOverRanks(Comm& c, double v) {
  runColl(c, Collective::kAllreduce, &v, 1, MTXCOMM_FLOAT64, MTXCOMM_MAX);
  return v;
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One measured point and the cost model's coefficients of (alpha, beta, gamma) for it.
struct Point {
  std::string level;
  const Algorithm* algorithm;
  int ranks;
  size_t bytes;
  double seconds;
  std::vector<double> coef;
};

// The median over blocks of the slowest rank's seconds per call of algo on c.
double timeCall(Comm& c, Collective coll, const char* algo, size_t bytes) {
  std::vector<float> buf(std::max<size_t>(bytes / sizeof(float), 1), 0.0f);
  const size_t count = bytes / sizeof(float);
  std::string& forced = c.mutableConfig().algo[static_cast<int>(coll)];
  const std::string saved = forced;
  forced = algo;
  auto once = [&] { runColl(c, coll, buf.data(), count, MTXCOMM_FLOAT32); };
  for (int i = 0; i < 3; ++i) once();
  Clock::time_point t0 = Clock::now();
  once();
  const double first = secondsSince(t0);
  forced = saved;
  const double estimate = maxOverRanks(c, first);
  forced = algo;
  const int iters = std::clamp(static_cast<int>(0.004 / std::max(estimate, 1e-7)), 2, 400);
  std::vector<double> blocks;
  for (int b = 0; b < 5; ++b) {
    CollArgs barrier;
    barrier.coll = Collective::kBarrier;
    c.run(barrier);
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) once();
    const double per = secondsSince(t0) / iters;
    forced = saved;
    blocks.push_back(maxOverRanks(c, per));
    forced = algo;
  }
  forced = saved;
  std::sort(blocks.begin(), blocks.end());
  return blocks[blocks.size() / 2];
}

// The cost model's prediction for the point is linear in the level's (alpha, beta, gamma):
// its coefficients are the predictions with unit parameters.
std::vector<double> coefficients(const Comm& c, const Algorithm& a, size_t bytes) {
  CollArgs args;
  args.coll = a.coll;
  args.count = bytes / sizeof(float);
  args.elemSize = sizeof(float);
  std::vector<double> coef;
  for (int j = 0; j < 3; ++j) {
    CostParams unit;
    LevelCost e{j == 0 ? 1.0 : 0.0, j == 1 ? 1.0 : 0.0, j == 2 ? 1.0 : 0.0};
    unit.intra = unit.inter = e;
    CommInfo info;
    info.nranks = c.size();
    info.topo = &c.topology();
    info.cost = &unit;
    info.segmentBytes = c.config().segmentBytes;
    info.shmSlotBytes = c.shmSlotBytes();
    coef.push_back(predictSeconds(a, args, info));
  }
  return coef;
}

void measureLevel(Comm& c, const std::string& level, const char* bcastAlgo,
                  const char* allreduceAlgo, size_t minBytes, size_t maxBytes,
                  std::vector<Point>& out) {
  for (Collective coll : {Collective::kBroadcast, Collective::kAllreduce}) {
    const char* name = coll == Collective::kBroadcast ? bcastAlgo : allreduceAlgo;
    const Algorithm* a = findAlgorithm(coll, name);
    for (size_t bytes = std::max<size_t>(minBytes, 4); bytes <= maxBytes; bytes *= 4) {
      const double s = timeCall(c, coll, name, bytes);
      out.push_back({level, a, c.size(), bytes, s, coefficients(c, *a, bytes)});
    }
  }
}

// Across nodes, points at least this large are bandwidth-bound enough to fit beta on; alpha is
// fitted on the smaller ones. (One weighted fit over every size let the small points, which
// follow no alpha-beta line on a shaped or busy link, pull beta to half the link's; at 64 KiB a
// point of 128 KiB still passed a token bucket's burst partly unshaped and pulled it 14% low.)
// On the shared segment every size is fitted at once (bandwidthPointBytes 0): there the small
// points do lie near the line, and four large points alone left the fit unstable.
constexpr size_t kBandwidthPointBytes = size_t{512} << 10;

// Fits alpha and beta of a level to its points less their reduction term (gamma given): beta
// (with alpha) on the points of at least bandwidthPointBytes, then alpha on the smaller points
// with that beta. Where one group has fewer than two points, both on all points.
LevelCost fitLevel(const std::vector<Point>& points, const std::string& level, LevelCost dflt,
                   double gamma, size_t bandwidthPointBytes) {
  // Each point's (alpha, beta) coefficients and its time less the reduction term.
  std::vector<std::vector<double>> all, large;
  std::vector<double> yAll, yLarge;
  std::vector<bool> isLarge;
  for (const Point& p : points) {
    if (p.level != level) continue;
    all.push_back({p.coef[0], p.coef[1]});
    yAll.push_back(std::max(p.seconds - p.coef[2] * gamma, 0.0));
    isLarge.push_back(p.bytes >= bandwidthPointBytes);
    if (isLarge.back()) {
      large.push_back(all.back());
      yLarge.push_back(yAll.back());
    }
  }
  if (all.size() < 2) return dflt;
  // Alpha alone with a given beta, on the points below the bandwidth points (all of them when
  // every point is one), weighted by 1/time as the other fits.
  const auto alphaWith = [&](double beta) {
    double num = 0, den = 0;
    for (size_t r = 0; r < all.size(); ++r) {
      if (isLarge[r] && large.size() < all.size()) continue;
      const double w = yAll[r] > 0 ? 1.0 / yAll[r] : 1.0;
      num += all[r][0] * std::max(yAll[r] - all[r][1] * beta, 0.0) * w * w;
      den += all[r][0] * all[r][0] * w * w;
    }
    return den > 0 ? num / den : dflt.alpha;
  };
  if (bandwidthPointBytes > 0 && large.size() < 2) {
    // No sizes large enough to pin the bandwidth term (a sweep of small sizes): a beta fitted
    // to latency-bound points is noise (0 at worst: an infinitely fast link to the selector).
    // The default beta stays, alpha is fitted with it.
    return LevelCost{alphaWith(dflt.beta), dflt.beta, gamma};
  }
  if (large.size() < 2 || all.size() - large.size() < 2) {
    const std::vector<double> x = fitLeastSquares(all, yAll);
    if (x[1] > 0 && x[0] > 0) return LevelCost{x[0], x[1], gamma};
    if (x[1] > 0) {
      // An intercept of 0 (noise on the small points): the least per-message time measured.
      double alpha = dflt.alpha;
      bool first = true;
      for (size_t r = 0; r < all.size(); ++r) {
        if (all[r][0] <= 0 || yAll[r] <= 0) continue;
        const double a = yAll[r] / all[r][0];
        alpha = first ? a : std::min(alpha, a);
        first = false;
      }
      return LevelCost{alpha, x[1], gamma};
    }
    return LevelCost{alphaWith(dflt.beta), dflt.beta, gamma};
  }
  const double beta = fitLeastSquares(large, yLarge)[1];
  return beta > 0 ? LevelCost{alphaWith(beta), beta, gamma}
                  : LevelCost{alphaWith(dflt.beta), dflt.beta, gamma};
}

// Seconds per byte of the library's float32 sum on this CPU, on buffers of bytes bytes that
// stay in cache (as a pipeline segment or shm chunk does when it is reduced on arrival): the
// median of 21 reductions after a warm-up.
double measureReductionGamma(size_t bytes) {
  const size_t count = std::max<size_t>(bytes / sizeof(float), 1);
  std::vector<float> a(count, 1.0f), b(count, 2.0f), dst(count, 0.0f);
  reduceBuffers(MTXCOMM_FLOAT32, MTXCOMM_SUM, dst.data(), a.data(), b.data(), count);
  std::vector<double> t;
  for (int i = 0; i < 21; ++i) {
    const Clock::time_point t0 = Clock::now();
    reduceBuffers(MTXCOMM_FLOAT32, MTXCOMM_SUM, dst.data(), a.data(), b.data(), count);
    t.push_back(secondsSince(t0) / static_cast<double>(count * sizeof(float)));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

std::vector<double> fitLeastSquares(const std::vector<std::vector<double>>& rows,
                                    const std::vector<double>& y) {
  const size_t k = rows.empty() ? 0 : rows[0].size();
  // Normal equations of the weighted problem, solved by Gaussian elimination with pivoting.
  std::vector<std::vector<double>> m(k, std::vector<double>(k + 1, 0.0));
  for (size_t r = 0; r < rows.size(); ++r) {
    const double w = y[r] > 0 ? 1.0 / y[r] : 1.0;
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < k; ++j) m[i][j] += rows[r][i] * w * rows[r][j] * w;
      m[i][k] += rows[r][i] * w * y[r] * w;
    }
  }
  for (size_t col = 0; col < k; ++col) {
    size_t piv = col;
    for (size_t i = col + 1; i < k; ++i) {
      if (std::fabs(m[i][col]) > std::fabs(m[piv][col])) piv = i;
    }
    std::swap(m[col], m[piv]);
    if (std::fabs(m[col][col]) < 1e-300) continue;
    for (size_t i = 0; i < k; ++i) {
      if (i == col) continue;
      const double f = m[i][col] / m[col][col];
      for (size_t j = col; j <= k; ++j) m[i][j] -= f * m[col][j];
    }
  }
  std::vector<double> x(k, 0.0);
  for (size_t i = 0; i < k; ++i) {
    if (std::fabs(m[i][i]) >= 1e-300) x[i] = m[i][k] / m[i][i];
  }
  // Non-negative: an unknown that comes out below zero is held at zero and the others are fitted
  // again without it (one step of an active-set method per unknown).
  size_t worst = k;
  for (size_t i = 0; i < k; ++i) {
    if (x[i] < 0 && (worst == k || x[i] < x[worst])) worst = i;
  }
  if (worst == k) return x;
  std::vector<std::vector<double>> fewer;
  for (const auto& row : rows) {
    std::vector<double> r = row;
    r.erase(r.begin() + static_cast<long>(worst));
    fewer.push_back(r);
  }
  std::vector<double> sub = k > 1 ? fitLeastSquares(fewer, y) : std::vector<double>{};
  sub.insert(sub.begin() + static_cast<long>(worst), 0.0);
  return sub;
}

int runTune(mtxcomm_comm_t handle, const std::string& outPath, size_t minBytes, size_t maxBytes) {
  Comm& world = *unwrapComm(handle);
  const Topology& topo = world.topology();
  const int me = world.rank();
  const int node = topo.nodeOf(me), localRank = topo.localRank(me);
  std::unique_ptr<Comm> local = world.split(node, localRank);
  std::unique_ptr<Comm> cross = world.split(localRank, node);

  std::vector<Point> points;
  // Intra-node: rank 0's node measures its segment (its points are the ones fitted); the other
  // nodes wait meanwhile, so that they take no cycles from it where nodes share a machine (the
  // emulated cluster of tests/cluster).
  if (local->size() > 1 && node == topo.nodeOf(0)) {
    measureLevel(*local, "intra_node", "shm", "shm", minBytes, maxBytes, points);
  }
  std::string interVia;
  if (topo.numNodes() > 1) {
    interVia = "cross-node sub-communicator of the node leaders";
    if (localRank == 0) {
      measureLevel(*cross, "inter_node", "binomial", "recursive_doubling", minBytes, maxBytes,
                   points);
    }
  } else {
    interVia = std::string("no second node: the point-to-point transport (") +
               world.transportName() + ") between the ranks of this node";
    measureLevel(world, "inter_node", "binomial", "recursive_doubling", minBytes, maxBytes, points);
  }

  int rc = 0;
  if (me == 0) {
    const CostParams defaults;
    CostParams fitted;
    // Gamma is this CPU's reduction speed on both levels, measured directly: the reduction term
    // is too small a part of each point for a fit to tell it from beta (recursive doubling on 2
    // ranks differs from a binomial broadcast only by it).
    const double gamma = measureReductionGamma(size_t{1} << 20);
    fitted.intra = fitLevel(points, "intra_node", defaults.intra, gamma, 0);
    fitted.inter = fitLevel(points, "inter_node", defaults.inter, gamma, kBandwidthPointBytes);
    nlohmann::json measured = nlohmann::json::array();
    std::printf("# mtxcomm_bench --tune: %d ranks on %d node(s); inter_node via %s%s\n",
                world.size(), topo.numNodes(), interVia.c_str(),
                local->size() > 1 ? "" : "; intra_node not measured (rank 0's node has one rank)");
    std::printf("# %-10s %-10s %-18s %5s %10s %14s %14s\n", "level", "collective", "algorithm",
                "ranks", "Size", "measured(us)", "fitted(us)");
    for (const Point& p : points) {
      const LevelCost& lc = p.level == "intra_node" ? fitted.intra : fitted.inter;
      const double fit = p.coef[0] * lc.alpha + p.coef[1] * lc.beta + p.coef[2] * lc.gamma;
      std::printf("  %-10s %-10s %-18s %5d %10zu %14.2f %14.2f\n", p.level.c_str(),
                  collectiveName(p.algorithm->coll), p.algorithm->name, p.ranks, p.bytes,
                  p.seconds * 1e6, fit * 1e6);
      measured.push_back({{"level", p.level},
                          {"collective", collectiveName(p.algorithm->coll)},
                          {"algorithm", p.algorithm->name},
                          {"ranks", p.ranks},
                          {"bytes", p.bytes},
                          {"seconds", p.seconds},
                          {"fitted_seconds", fit}});
    }
    const nlohmann::json info = {{"ranks", world.size()},
                                 {"nodes", topo.numNodes()},
                                 {"inter_node_via", interVia},
                                 {"points", measured}};
    std::printf(
        "# intra_node: alpha %.3g s, beta %.3g s/B, gamma %.3g s/B\n"
        "# inter_node: alpha %.3g s, beta %.3g s/B, gamma %.3g s/B\n",
        fitted.intra.alpha, fitted.intra.beta, fitted.intra.gamma, fitted.inter.alpha,
        fitted.inter.beta, fitted.inter.gamma);
    if (fitted.inter.beta == defaults.inter.beta) {
      std::printf(
          "# inter_node: beta is the library's default (no size of %zu bytes or more "
          "to fit it to: widen -m)\n",
          kBandwidthPointBytes);
    }
    std::ofstream f(outPath);
    f << tuningFileJson(fitted, info.dump());
    if (!f) {
      std::fprintf(stderr, "mtxcomm_bench --tune: cannot write %s\n", outPath.c_str());
      rc = 1;
    } else {
      std::printf("# wrote %s (load it with MTXCOMM_TUNING_FILE=%s)\n", outPath.c_str(),
                  outPath.c_str());
    }
  }
  int32_t status = rc;
  runColl(world, Collective::kBroadcast, &status, 1, MTXCOMM_INT32);
  return status;
}

}  // namespace bench
}  // namespace mtxcomm
