#include "algos/registry.h"

#include "algos/patterns.h"

namespace mtxcomm {

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* collectiveAlgoVar(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "MTXCOMM_ALLREDUCE_ALGO";
    case Collective::kBroadcast:
      return "MTXCOMM_BROADCAST_ALGO";
    case Collective::kReduce:
      return "MTXCOMM_REDUCE_ALGO";
    case Collective::kAllgather:
      return "MTXCOMM_ALLGATHER_ALGO";
    case Collective::kReduceScatter:
      return "MTXCOMM_REDUCE_SCATTER_ALGO";
    case Collective::kBarrier:
      return "MTXCOMM_BARRIER_ALGO";
  }
  return "?";
}

bool collectiveReduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

namespace {
const char* acceptsAll(const CollArgs&, int) { return nullptr; }
const char* needsPowerOfTwo(const CollArgs&, int n) {
  return patterns::isPowerOfTwo(n) ? nullptr : "needs a power-of-two number of ranks";
}
}  // namespace

const std::vector<Algorithm>& algorithms() {
  static const std::vector<Algorithm> kAll = {
      {Collective::kAllreduce, "ring",
       "ring reduce-scatter + ring allgather, segmented and pipelined; bandwidth-optimal",
       acceptsAll, buildAllreduceRing},
      {Collective::kAllreduce, "recursive_doubling",
       "whole-vector exchange at distances 1,2,4..; non-powers of two folded; latency-optimal",
       acceptsAll, buildAllreduceRecursiveDoubling},
      {Collective::kAllreduce, "rabenseifner",
       "recursive-halving reduce-scatter + recursive-doubling allgather; log rounds, optimal bytes",
       acceptsAll, buildAllreduceRabenseifner},
      {Collective::kBroadcast, "binomial", "binomial tree from the root; latency-optimal",
       acceptsAll, buildBroadcastBinomial},
      {Collective::kBroadcast, "scatter_allgather",
       "binomial scatter + ring allgather (van de Geijn); for large messages", acceptsAll,
       buildBroadcastScatterAllgather},
      {Collective::kReduce, "binomial", "binomial tree towards the root", acceptsAll,
       buildReduceBinomial},
      {Collective::kAllgather, "ring", "n-1 ring steps; bandwidth-optimal, any rank count",
       acceptsAll, buildAllgatherRing},
      {Collective::kAllgather, "recursive_doubling",
       "exchange at distances 1,2,4..; log rounds; powers of two only", needsPowerOfTwo,
       buildAllgatherRecursiveDoubling},
      {Collective::kReduceScatter, "ring", "ring reduce-scatter, segmented and pipelined",
       acceptsAll, buildReduceScatterRing},
      {Collective::kBarrier, "dissemination", "ceil(log2 n) rounds of one-byte messages",
       acceptsAll, buildBarrierDissemination},
  };
  return kAll;
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
