#include "lib/comm/select.h"

#include <limits>
#include <mutex>
#include <set>
#include <tuple>

#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/topology.h"
#include "lib/comm/cost_model.h"

namespace mtxcomm {

const Algorithm* defaultAlgorithm(const CollArgs& args, const CommInfo& info) {
  // On one node with a shared segment, the shared-memory algorithms move every byte with plain
  // loads and stores: they win at every size (bench/RESULTS.md).
  // (alltoall's shm declines when a slot has no room for a sub-slot per rank: then the cost
  // model picks among the others.)
  // (Op adasum: every algorithm but "adasum" declines it, algorithmDeclines, so the cost model
  // below has that one candidate, on one node too.)
  if (info.shm) {
    const Algorithm* shm = findAlgorithm(args.coll, "shm");
    if (shm && !algorithmDeclines(*shm, args, info)) return shm;
  }
  // A composition only pays when a node holds several ranks; with one rank per node it is the
  // flat algorithm plus overhead.
  const bool composes = info.topo && info.topo->numNodes() > 1 && info.topo->maxLocalSize() > 1;
  const Algorithm* best = nullptr;
  double bestTime = std::numeric_limits<double>::infinity();
  for (const Algorithm& a : algorithms()) {
    if (a.coll != args.coll || algorithmDeclines(a, args, info)) continue;
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
  Selection sel;
  if (forced != "auto") {
    const Algorithm* a = findAlgorithm(args.coll, forced);
    if (!a) {
      fail(MTXCOMM_INVALID_USAGE, collectiveAlgoVar(args.coll), "=", forced,
           " names no algorithm of ", collectiveName(args.coll));
    }
    if (const char* why = algorithmDeclines(*a, args, info)) {
      static std::mutex mu;
      static std::set<std::tuple<int, std::string, int, std::string>> warned;
      std::lock_guard<std::mutex> lock(mu);
      if (warned.insert({static_cast<int>(args.coll), forced, n, why}).second) {
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
    if (!sel.algorithm) {
      fail(MTXCOMM_INTERNAL_ERROR, "no ", collectiveName(args.coll), " algorithm takes op ",
           opName(args.op), " on ", n, " ranks");
    }
    if (sel.why.empty()) {
      sel.why = isAdasumAlgorithm(*sel.algorithm) ? "auto: op adasum"
                : info.shm                        ? "auto: one node, shared memory"
                                                  : "auto: cost model";
    }
  }
  sel.predicted = predictSeconds(*sel.algorithm, args, info);
  if (logEnabled(LogLevel::kDebug)) {
    std::string others;
    for (const Algorithm& a : algorithms()) {
      if (a.coll != args.coll || &a == sel.algorithm || algorithmDeclines(a, args, info)) continue;
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

Selection selectDevicePath(const CollArgs& args, const gpu::DeviceTopology& t,
                           const std::string& forced, int rank) {
  using gpu::DevicePath;
  Selection sel;
  if (forced != "auto") {
    bool known = false;
    for (int p = 0; p < gpu::kNumDevicePaths && !known; ++p) {
      const auto path = static_cast<DevicePath>(p);
      if (forced != gpu::devicePathName(path)) continue;
      known = true;
      if (const char* why = gpu::devicePathDeclines(path, args, t)) {
        fail(MTXCOMM_UNSUPPORTED, "device path ", forced, " (MTXCOMM_CUDA_PATH) cannot take ",
             collectiveName(args.coll), " on device buffers: ", why);
      }
      sel.devicePath = path;
      sel.why = "forced by MTXCOMM_CUDA_PATH";
    }
    if (!known) fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_CUDA_PATH=", forced, " names no device path");
  } else {
    sel.why = "auto";
    sel.devicePath = DevicePath::kHostStaging;
    for (DevicePath path : {DevicePath::kNccl, DevicePath::kCudaIpc}) {
      const char* no = gpu::devicePathDeclines(path, args, t);
      // NCCL's ranks sharing a GPU are experimental and slow: taken when forced only.
      if (!no && path == DevicePath::kNccl && !t.distinctGpus) {
        no = "ranks share a GPU (NCCL takes that only when forced: MTXCOMM_CUDA_PATH=nccl)";
      }
      if (!no) {
        sel.devicePath = path;
        break;
      }
      sel.why += strCat("; not ", gpu::devicePathName(path), ": ", no);
    }
  }
  MTXCOMM_LOG(kDebug, rank, collectiveName(args.coll), " ", args.count, " x ",
              datatypeName(args.dtype), " on device buffers: path ",
              gpu::devicePathName(sel.devicePath), " (", sel.why, ")");
  return sel;
}

}  // namespace mtxcomm
