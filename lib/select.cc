#include "lib/select.h"

#include <limits>
#include <mutex>
#include <set>
#include <tuple>

#include "lib/cost_model.h"
#include "lib/error.h"
#include "lib/log.h"
#include "lib/topology.h"

namespace mtxcomm {

const Algorithm* defaultAlgorithm(const CollArgs& args, const CommInfo& info) {
  // On one node with a shared segment, the shared-memory algorithms move every byte with plain
  // loads and stores: they win at every size (bench/RESULTS.md).
  if (info.shm) return findAlgorithm(args.coll, "shm");
  // A composition only pays when a node holds several ranks; with one rank per node it is the
  // flat algorithm plus overhead.
  const bool composes = info.topo && info.topo->numNodes() > 1 && info.topo->maxLocalSize() > 1;
  const Algorithm* best = nullptr;
  double bestTime = std::numeric_limits<double>::infinity();
  for (const Algorithm& a : algorithms()) {
    if (a.coll != args.coll || a.declines(args, info)) continue;
    if (a.compose && !composes) continue;
    const double t = predictSeconds(a, args, info);
    if (!best || t < bestTime) {
      best = &a;
      bestTime = t;
    }
  }
  return best;
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
    if (sel.why.empty()) sel.why = info.shm ? "auto: one node, shared memory" : "auto: cost model";
  }
  sel.predicted = predictSeconds(*sel.algorithm, args, info);
  if (logEnabled(LogLevel::kDebug)) {
    std::string others;
    for (const Algorithm& a : algorithms()) {
      if (a.coll != args.coll || &a == sel.algorithm || a.declines(args, info)) continue;
      others += strCat(others.empty() ? "" : ", ", a.name, " ",
                       formatSeconds(predictSeconds(a, args, info)));
    }
    const int nodes = info.topo ? info.topo->numNodes() : 1;
    MTXCOMM_LOG(kDebug, rank, collectiveName(args.coll), " ", args.count, " x ", args.elemSize,
                " B on ", n, " ranks: ", sel.algorithm->name, " (", sel.why, "; ", nodes,
                " node(s)), predicted ", formatSeconds(sel.predicted),
                others.empty() ? std::string() : strCat("; others: ", others));
  }
  return sel;
}

}  // namespace mtxcomm
