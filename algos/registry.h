// The registry of collective algorithms. Each algorithm has a stable name (the same in its file
// name, the MTXCOMM_<COLLECTIVE>_ALGO value, the logs and the bench output), a one-line
// description, a check that may decline the call (returning why), and a builder that turns one
// call into a Schedule for one rank.
#ifndef MTXCOMM_ALGOS_REGISTRY_H_
#define MTXCOMM_ALGOS_REGISTRY_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {

class Schedule;

enum class Collective { kAllreduce, kBroadcast, kReduce, kAllgather, kReduceScatter, kBarrier };
constexpr int kNumCollectives = 6;
// "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "barrier".
const char* collectiveName(Collective c);
// "MTXCOMM_ALLREDUCE_ALGO", ...
const char* collectiveAlgoVar(Collective c);
bool collectiveReduces(Collective c);

// One call as an algorithm sees it (after argument checks; AVG arrives as SUM and 16-bit floats
// arrive widened to float32).
struct CollArgs {
  Collective coll = Collective::kAllreduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  // Elements: allreduce, broadcast, reduce: the whole buffer; allgather: per-rank sendcount;
  // reduce_scatter: per-rank recvcount; barrier: 0.
  size_t count = 0;
  mtxcomm_datatype_t dtype = MTXCOMM_FLOAT32;
  mtxcomm_op_t op = MTXCOMM_SUM;
  int root = 0;
  size_t elemSize = 4;
  // Bytes one rank contributes, the quantity selection rules use.
  size_t bytes() const { return count * elemSize; }
};

// Tunables an algorithm may use, all from the configuration (identical on every rank).
struct AlgoParams {
  size_t segmentBytes = 1 << 20;  // pipeline segment of ring algorithms
};

struct Algorithm {
  Collective coll;
  const char* name;
  const char* description;
  // nullptr when the algorithm applies to this call on nranks ranks; otherwise a reason.
  const char* (*declines)(const CollArgs& args, int nranks);
  void (*build)(const CollArgs& args, int rank, int nranks, const AlgoParams& params,
                Schedule& schedule);
};

// Every algorithm, grouped by collective, in a fixed order.
const std::vector<Algorithm>& algorithms();
const Algorithm* findAlgorithm(Collective c, std::string_view name);
// Names of the algorithms of c, e.g. {"ring", "recursive_doubling", "rabenseifner"}.
std::vector<const char*> algorithmNames(Collective c);

// Builders, one per file algos/<collective>_<algorithm>.cc.
void buildAllreduceRing(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllreduceRecursiveDoubling(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllreduceRabenseifner(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildBroadcastBinomial(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildBroadcastScatterAllgather(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllgatherRing(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllgatherRecursiveDoubling(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildReduceScatterRing(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildReduceBinomial(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildBarrierDissemination(const CollArgs&, int, int, const AlgoParams&, Schedule&);

}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_REGISTRY_H_
