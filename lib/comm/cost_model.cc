#include "lib/comm/cost_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "algos/patterns.h"
#include "lib/base/error.h"
#include "lib/base/topology.h"

namespace mtxcomm {

namespace {

using Json = nlohmann::json;

[[noreturn]] void badFile(const std::string& path, const std::string& key, const std::string& why) {
  fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_TUNING_FILE=", path,
       key.empty() ? std::string(": ") : strCat(": key \"", key, "\": "), why);
}

LevelCost parseLevel(const std::string& path, const Json& j, const std::string& name,
                     LevelCost level) {
  if (!j.is_object()) badFile(path, name, "expected an object {\"alpha\", \"beta\", \"gamma\"}");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = name + "." + it.key();
    double* field = it.key() == "alpha"   ? &level.alpha
                    : it.key() == "beta"  ? &level.beta
                    : it.key() == "gamma" ? &level.gamma
                                          : nullptr;
    if (!field) badFile(path, key, "unknown key (expected alpha, beta, gamma)");
    if (!it.value().is_number()) badFile(path, key, "expected a number of seconds (per byte)");
    const double v = it.value().get<double>();
    if (!std::isfinite(v) || v < 0 || v > 1.0) {
      badFile(path, key, strCat("expected seconds in [0, 1], got ", v));
    }
    *field = v;
  }
  return level;
}

// A point-to-point level as a flat algorithm sees it: the parameters and how many flows share
// the slowest link (ring edges leaving a node; all of a node's ranks for the other patterns).
struct Level {
  LevelCost c;
  int ringShare = 1;
  int share = 1;
};

double log2Ceil(int p) { return p <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(p))); }

// The largest power of two <= p, and whether p needs the fold of non-powers of two.
int pof2Below(int p) { return patterns::powerOfTwoFloor(p); }

double flatSeconds(Collective coll, std::string_view name, double n, int p, const Level& lv,
                   size_t segmentBytes) {
  if (p <= 1) return 0;
  const double a = lv.c.alpha, b = lv.c.beta, g = lv.c.gamma;
  const double pm1 = p - 1;
  const double seg = static_cast<double>(std::max<size_t>(segmentBytes, 1));
  switch (coll) {
    case Collective::kAllreduce: {
      if (name == "ring") {
        const double segs = std::max(1.0, std::ceil(n / p / seg));
        // Segments pipeline: the reduction of one overlaps the transfer of the next.
        const double bw = b * lv.ringShare;
        return 2 * pm1 * segs * a + pm1 / p * n * bw + pm1 / p * n * std::max(bw, g);
      }
      const int q = pof2Below(p);
      const double k = std::log2(static_cast<double>(q));
      const double fold = q == p ? 0.0 : 2 * (a + n * b * lv.share) + n * g;
      if (name == "recursive_doubling") return k * (a + n * b * lv.share + n * g) + fold;
      if (name == "rabenseifner") {
        return 2 * k * a + 2.0 * (q - 1) / q * n * b * lv.share + (q - 1.0) / q * n * g + fold;
      }
      if (name == "adasum") {
        // recursive_doubling's messages; per level two passes over both vectors (the dot
        // product and norms, then the combination) instead of one reduction.
        const double foldAdasum = q == p ? 0.0 : 2 * (a + n * b * lv.share) + 2 * n * g;
        return k * (a + n * b * lv.share + 2 * n * g) + foldAdasum;
      }
      break;
    }
    case Collective::kBroadcast:
      if (name == "binomial") return log2Ceil(p) * (a + n * b);
      if (name == "scatter_allgather") {
        return log2Ceil(p) * a + pm1 / p * n * b + pm1 * (a + n / p * b * lv.ringShare);
      }
      break;
    case Collective::kReduce:
      if (name == "binomial") return log2Ceil(p) * (a + n * b + n * g);
      break;
    case Collective::kAllgather:  // n: bytes per rank
      if (name == "ring") return pm1 * (a + n * b * lv.ringShare);
      if (name == "recursive_doubling") return log2Ceil(p) * a + pm1 * n * b * lv.share;
      break;
    case Collective::kReduceScatter: {  // n: bytes per rank of the result
      const double segs = std::max(1.0, std::ceil(n / seg));
      if (name == "ring") return pm1 * (segs * a + n * std::max(b * lv.ringShare, g));
      break;
    }
    case Collective::kBarrier:
      if (name == "dissemination") return log2Ceil(p) * a;
      break;
    case Collective::kAlltoall:  // n: bytes per rank pair (0 for alltoallv: latency only)
      // p-1 steps of one message each way; every node's ranks share its link.
      if (name == "pairwise") return pm1 * (a + n * b * lv.share);
      break;
  }
  return std::numeric_limits<double>::infinity();
}

// The shm algorithms: per chunk (a slot; allreduce's and reduce_scatter's may be half of one:
// CommInfo::shmReductionChunkBytes) two synchronisations; every rank copies in and out of the
// segment and reduces its share of each chunk.
double shmSeconds(Collective coll, double n, int p, const LevelCost& c, const CommInfo& info) {
  if (p <= 1) return 0;
  const bool reduction = coll == Collective::kAllreduce || coll == Collective::kReduceScatter;
  const size_t slotBytes = info.shmSlotBytes;
  const size_t chunkBytes =
      reduction && info.shmReductionChunkBytes ? info.shmReductionChunkBytes : slotBytes;
  const double chunks = std::max(1.0, std::ceil(n / static_cast<double>(chunkBytes)));
  const double sync = 2 * chunks * c.alpha;
  const double share = (p - 1.0) / p;
  switch (coll) {
    case Collective::kAllreduce:
    case Collective::kReduce:
      return sync + 2 * n * c.beta + share * n * c.gamma;
    case Collective::kBroadcast:  // the root's copy-in of a chunk overlaps the copy-out
      return sync + n * c.beta;
    case Collective::kAllgather:  // n per rank: copy in n, copy out p*n
      return sync + (1.0 + p) * n * c.beta;
    case Collective::kReduceScatter:  // n per rank of the result: copy in p*n, reduce, copy out
      return sync + (p + 1.0) * n * c.beta + (p - 1.0) * n * c.gamma;
    case Collective::kBarrier:
      return 2 * c.alpha;
    case Collective::kAlltoall: {  // n per rank pair: p-1 blocks in, p-1 out, slot / p per block
      const double perSlot = std::max(1.0, std::floor(static_cast<double>(slotBytes) / p));
      return 2 * std::max(1.0, std::ceil(n / perSlot)) * c.alpha + 2 * (p - 1.0) * n * c.beta;
    }
  }
  return std::numeric_limits<double>::infinity();
}

// The fastest point-to-point algorithm of coll on p ranks of one level.
double bestFlatSeconds(Collective coll, double n, int p, const Level& lv, size_t segmentBytes) {
  double best = std::numeric_limits<double>::infinity();
  for (const Algorithm& a : algorithms()) {
    if (a.coll != coll || !a.build || isAdasumAlgorithm(a)) continue;  // levels of SUM etc.
    if (coll == Collective::kAllgather && std::string_view(a.name) == "recursive_doubling" &&
        !patterns::isPowerOfTwo(p)) {
      continue;
    }
    best = std::min(best, flatSeconds(coll, a.name, n, p, lv, segmentBytes));
  }
  return best;
}

double hierarchicalSeconds(Collective coll, double n, const Topology& topo, const CostParams& cp,
                           const CommInfo& info) {
  const int nodes = topo.numNodes(), local = topo.maxLocalSize();
  auto intra = [&](Collective c, double bytes) {
    return shmSeconds(c, bytes, local, cp.intra, info);
  };
  if (coll == Collective::kAllreduce) {
    if (topo.uniformNodes() && local > 1) {
      const double block = std::ceil(n / local);
      // local cross-node allreduces at once, each of one block, share each node's link.
      const Level cross{cp.inter, local, local};
      return intra(Collective::kReduceScatter, block) +
             bestFlatSeconds(Collective::kAllreduce, block, nodes, cross, info.segmentBytes) +
             intra(Collective::kAllgather, block);
    }
    const Level cross{cp.inter, 1, 1};
    return intra(Collective::kReduce, n) +
           bestFlatSeconds(Collective::kAllreduce, n, nodes, cross, info.segmentBytes) +
           intra(Collective::kBroadcast, n);
  }
  if (coll == Collective::kBroadcast) {
    const Level cross{cp.inter, 1, 1};
    return 2 * intra(Collective::kBroadcast, n) +
           bestFlatSeconds(Collective::kBroadcast, n, nodes, cross, info.segmentBytes);
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace

CostParams loadTuningFile(const std::string& path) {
  // Not a directory, FIFO or device: opening a FIFO would block init with no timeout.
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) badFile(path, "", "cannot be opened for reading");
  if (!S_ISREG(st.st_mode)) badFile(path, "", "not a regular file");
  std::ifstream in(path);
  if (!in) badFile(path, "", "cannot be opened for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parseTuningText(text, path);
}

CostParams parseTuningText(const std::string& text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    badFile(path, "", strCat("not valid JSON: ", e.what()));
  }
  if (!j.is_object()) badFile(path, "", "expected a JSON object at the top level");
  CostParams p;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "intra_node") {
      p.intra = parseLevel(path, it.value(), it.key(), p.intra);
    } else if (it.key() == "inter_node") {
      p.inter = parseLevel(path, it.value(), it.key(), p.inter);
    } else if (it.key() == "format") {
      if (it.value() != "mtxcomm-tuning-1") {
        badFile(path, it.key(), "expected \"mtxcomm-tuning-1\"");
      }
    } else if (it.key() != "measured" && it.key() != "comment") {
      badFile(path, it.key(),
              "unknown key (expected format, intra_node, inter_node, measured, comment)");
    }
  }
  return p;
}

std::string tuningFileJson(const CostParams& p, const std::string& measuredJson) {
  auto level = [](const LevelCost& c) {
    return Json{{"alpha", c.alpha}, {"beta", c.beta}, {"gamma", c.gamma}};
  };
  Json j = {{"format", "mtxcomm-tuning-1"},
            {"comment",
             "alpha: seconds per message; beta: seconds per byte moved; gamma: seconds per byte "
             "reduced. Load with MTXCOMM_TUNING_FILE."},
            {"intra_node", level(p.intra)},
            {"inter_node", level(p.inter)},
            {"measured", Json::parse(measuredJson)}};
  return j.dump(2) + "\n";
}

double predictSeconds(const Algorithm& a, const CollArgs& args, const CommInfo& info) {
  static const CostParams kDefaults;
  const CostParams& cp = info.cost ? *info.cost : kDefaults;
  const int p = info.nranks;
  const double n = static_cast<double>(args.bytes());
  if (a.run) return shmSeconds(args.coll, n, p, cp.intra, info);
  if (a.compose) {
    if (!info.topo || info.topo->numNodes() < 2) return std::numeric_limits<double>::infinity();
    return hierarchicalSeconds(args.coll, n, *info.topo, cp, info);
  }
  // Schedules run over the point-to-point transport: the inter-node level, also between ranks
  // of one node (MTXCOMM_SHM=off), where no link is shared.
  Level lv{cp.inter, 1, 1};
  if (info.topo && info.topo->numNodes() > 1) {
    lv =
        Level{cp.inter, std::max(1, info.topo->ringCrossEdgesPerNode()), info.topo->maxLocalSize()};
  }
  return flatSeconds(args.coll, a.name, n, p, lv, info.segmentBytes);
}

std::string formatSeconds(double s) {
  std::ostringstream os;
  os.precision(3);
  if (!std::isfinite(s)) return "inf";
  if (s < 1e-3) {
    os << s * 1e6 << " us";
  } else if (s < 1) {
    os << s * 1e3 << " ms";
  } else {
    os << s << " s";
  }
  return os.str();
}

}  // namespace mtxcomm
