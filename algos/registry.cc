#include "algos/registry.h"

#include "algos/patterns.h"
#include "lib/base/topology.h"

namespace mtxcomm {

namespace {
const char* acceptsAll(const CollArgs&, const CommInfo&) { return nullptr; }
const char* needsPowerOfTwo(const CollArgs&, const CommInfo& info) {
  return patterns::isPowerOfTwo(info.nranks) ? nullptr : "needs a power-of-two number of ranks";
}
const char* needsShm(const CollArgs&, const CommInfo& info) {
  return info.shm ? nullptr
                  : "needs every rank on one node with a shared-memory segment (MTXCOMM_SHM)";
}
const char* needsSeveralNodes(const CollArgs&, const CommInfo& info) {
  return info.topo && info.topo->numNodes() > 1 ? nullptr
                                                : "all ranks are on one node: nothing to compose";
}
const char* needsAdasumOp(const CollArgs& args, const CommInfo&) {
  return args.op == MTXCOMM_ADASUM ? nullptr
                                   : "computes op adasum only (the other ops have the other "
                                     "allreduce algorithms)";
}
const char* needsShmSubSlots(const CollArgs& args, const CommInfo& info) {
  if (const char* why = needsShm(args, info)) return why;
  return alltoallShmSubSlotBytes(info.shmSlotBytes, info.nranks) > 0
             ? nullptr
             : "MTXCOMM_SHM_SLOT_BYTES / ranks is under 64 bytes (no sub-slot per destination)";
}
}  // namespace

const std::vector<Algorithm>& algorithms() {
  static const std::vector<Algorithm> kAll = {
      {Collective::kAllreduce, "ring",
       "ring reduce-scatter + ring allgather, segmented and pipelined; bandwidth-optimal",
       acceptsAll, buildAllreduceRing, nullptr, nullptr},
      {Collective::kAllreduce, "recursive_doubling",
       "whole-vector exchange at distances 1,2,4..; non-powers of two folded; latency-optimal",
       acceptsAll, buildAllreduceRecursiveDoubling, nullptr, nullptr},
      {Collective::kAllreduce, "rabenseifner",
       "recursive-halving reduce-scatter + recursive-doubling allgather; log rounds, optimal bytes",
       acceptsAll, buildAllreduceRabenseifner, nullptr, nullptr},
      {Collective::kAllreduce, "adasum",
       "adaptive summation (op adasum only): recursive-doubling tree, upper ranks folded onto r-q",
       needsAdasumOp, buildAllreduceAdasum, nullptr, nullptr},
      {Collective::kBroadcast, "binomial", "binomial tree from the root; latency-optimal",
       acceptsAll, buildBroadcastBinomial, nullptr, nullptr},
      {Collective::kBroadcast, "scatter_allgather",
       "binomial scatter + ring allgather (van de Geijn); for large messages", acceptsAll,
       buildBroadcastScatterAllgather, nullptr, nullptr},
      {Collective::kReduce, "binomial", "binomial tree towards the root", acceptsAll,
       buildReduceBinomial, nullptr, nullptr},
      {Collective::kAllgather, "ring", "n-1 ring steps; bandwidth-optimal, any rank count",
       acceptsAll, buildAllgatherRing, nullptr, nullptr},
      {Collective::kAllgather, "recursive_doubling",
       "exchange at distances 1,2,4..; log rounds; powers of two only", needsPowerOfTwo,
       buildAllgatherRecursiveDoubling, nullptr, nullptr},
      {Collective::kReduceScatter, "ring", "ring reduce-scatter, segmented and pipelined",
       acceptsAll, buildReduceScatterRing, nullptr, nullptr},
      {Collective::kBarrier, "dissemination", "ceil(log2 n) rounds of one-byte messages",
       acceptsAll, buildBarrierDissemination, nullptr, nullptr},
      {Collective::kAlltoall, "pairwise",
       "n-1 pairwise exchange steps (r sends to r+k, receives from r-k); alltoall and alltoallv",
       acceptsAll, buildAlltoallPairwise, nullptr, nullptr},
      {Collective::kAllreduce, "shm",
       "shared-memory slots: copy in, reduce from every slot, copy out; cache-sized chunks",
       needsShm, nullptr, runAllreduceShm, nullptr, true},
      {Collective::kBroadcast, "shm", "shared-memory slots: the root copies in, all copy out",
       needsShm, nullptr, runBroadcastShm, nullptr},
      {Collective::kReduce, "shm", "shared-memory slots: ranks reduce slices, the root copies out",
       needsShm, nullptr, runReduceShm, nullptr, true},
      {Collective::kAllgather, "shm", "shared-memory slots: each copies in, all copy all out",
       needsShm, nullptr, runAllgatherShm, nullptr},
      {Collective::kReduceScatter, "shm",
       "shared-memory slots: each copies in, each reduces its own block", needsShm, nullptr,
       runReduceScatterShm, nullptr, true},
      {Collective::kBarrier, "shm", "arrival counters in shared memory", needsShm, nullptr,
       runBarrierShm, nullptr},
      {Collective::kAlltoall, "shm",
       "shared-memory slots cut per destination: each copies its blocks in, each copies its own "
       "out; alltoallv counts compared first",
       needsShmSubSlots, nullptr, runAlltoallShm, nullptr},
      {Collective::kAllreduce, "hierarchical",
       "node-local reduce-scatter (or reduce), cross-node allreduce, node-local allgather (or "
       "broadcast)",
       needsSeveralNodes, nullptr, nullptr, composeAllreduceHierarchical},
      {Collective::kBroadcast, "hierarchical",
       "node-local broadcast on the root's node, cross-node broadcast among leaders, node-local "
       "broadcast",
       needsSeveralNodes, nullptr, nullptr, composeBroadcastHierarchical},
  };
  return kAll;
}

bool isAdasumAlgorithm(const Algorithm& a) { return a.build == buildAllreduceAdasum; }

const char* algorithmDeclines(const Algorithm& a, const CollArgs& args, const CommInfo& info) {
  if (collectiveReduces(args.coll) && args.op == MTXCOMM_ADASUM && !isAdasumAlgorithm(a)) {
    return "takes no op adasum (not an elementwise reduction: only the adasum algorithm computes "
           "it)";
  }
  return a.declines(args, info);
}

const Algorithm* findAlgorithm(Collective c, std::string_view name) {
  for (const Algorithm& a : algorithms()) {
    if (a.coll == c && name == a.name) return &a;
  }
  return nullptr;
}

std::vector<const char*> algorithmNames(Collective c) {
  std::vector<const char*> names;
  for (const Algorithm& a : algorithms()) {
    if (a.coll == c) names.push_back(a.name);
  }
  return names;
}

}  // namespace mtxcomm
