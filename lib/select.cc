#include "lib/select.h"

#include <mutex>
#include <set>
#include <tuple>

#include "algos/patterns.h"
#include "lib/error.h"
#include "lib/log.h"

namespace mtxcomm {

namespace {
// The rule, as data: for each collective, the algorithm by bytes per rank. Thresholds follow
// the usual latency/bandwidth crossover (Thakur, Rabenseifner & Gropp 2005; Open MPI's
// coll_tuned fixed rules), to be refined by measurement (bench/RESULTS.md).
constexpr size_t kAllreduceSmall = 64 << 10;   // below: recursive_doubling
constexpr size_t kAllreduceMedium = 4 << 20;   // below: rabenseifner; above: ring
constexpr size_t kBroadcastLarge = 512 << 10;  // at or above (and n > 2): scatter_allgather
constexpr size_t kAllgatherSmall = 256
                                   << 10;  // total below (and n a power of 2): recursive_doubling
}  // namespace

const Algorithm* defaultAlgorithm(const CollArgs& args, const CommInfo& info) {
  // On one node with a shared segment, the shared-memory algorithms move every byte with plain
  // loads and stores: they win at every size (bench/RESULTS.md).
  if (info.shm) return findAlgorithm(args.coll, "shm");
  const int n = info.nranks;
  const size_t bytes = args.bytes();
  const char* name = nullptr;
  switch (args.coll) {
    case Collective::kAllreduce:
      name = bytes < kAllreduceSmall    ? "recursive_doubling"
             : bytes < kAllreduceMedium ? "rabenseifner"
                                        : "ring";
      break;
    case Collective::kBroadcast:
      name = (n > 2 && bytes >= kBroadcastLarge) ? "scatter_allgather" : "binomial";
      break;
    case Collective::kAllgather:
      name = (patterns::isPowerOfTwo(n) && bytes * n < kAllgatherSmall) ? "recursive_doubling"
                                                                        : "ring";
      break;
    case Collective::kReduce:
      name = "binomial";
      break;
    case Collective::kReduceScatter:
      name = "ring";
      break;
    case Collective::kBarrier:
      name = "dissemination";
      break;
  }
  return findAlgorithm(args.coll, name);
}

Selection selectAlgorithm(const CollArgs& args, const CommInfo& info, const std::string& forced,
                          int rank) {
  const int n = info.nranks;
  Selection sel{nullptr, ""};
  if (forced != "auto") {
    const Algorithm* a = findAlgorithm(args.coll, forced);
    if (!a) {
      fail(MTXCOMM_INVALID_USAGE, collectiveAlgoVar(args.coll), "=", forced,
           " names no algorithm of ", collectiveName(args.coll));
    }
    if (const char* why = a->declines(args, info)) {
      static std::mutex mu;
      static std::set<std::tuple<int, std::string, int>> warned;
      std::lock_guard<std::mutex> lock(mu);
      if (warned.insert({static_cast<int>(args.coll), forced, n}).second) {
        MTXCOMM_LOG(kWarn, rank, collectiveAlgoVar(args.coll), "=", forced, " cannot run on ", n,
                    " ranks (", why, "); falling back to the automatic choice");
      }
      sel.why = strCat("fallback: forced ", forced, " ", why);
    } else {
      sel.algorithm = a;
      sel.why = strCat("forced by ", collectiveAlgoVar(args.coll));
    }
  }
  if (!sel.algorithm) {
    sel.algorithm = defaultAlgorithm(args, info);
    if (sel.why.empty()) sel.why = "auto";
  }
  MTXCOMM_LOG(kDebug, rank, collectiveName(args.coll), " ", args.count, " x ", args.elemSize,
              " B on ", n, " ranks: ", sel.algorithm->name, " (", sel.why, ")");
  return sel;
}

}  // namespace mtxcomm
