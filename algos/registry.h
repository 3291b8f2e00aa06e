// The registry of collective algorithms. Each algorithm has a stable name (the same in its file
// name, the MTXCOMM_<COLLECTIVE>_ALGO value, the logs and the bench output), a one-line
// description, a check that may decline the call (returning why), and a builder that turns one
// call into a Schedule for one rank. The vocabulary of a call (Collective, CollArgs) is
// lib/base/call.h.
#ifndef MTXCOMM_ALGOS_REGISTRY_H_
#define MTXCOMM_ALGOS_REGISTRY_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "lib/base/call.h"

namespace mtxcomm {

class Schedule;
class ShmGroup;
class Topology;
struct CostParams;

// Tunables an algorithm may use, all from the configuration (identical on every rank).
struct AlgoParams {
  size_t segmentBytes = 1 << 20;  // pipeline segment of ring algorithms
};

// What selection and algorithms know of the communicator: values every rank agrees on.
struct CommInfo {
  int nranks = 1;
  ShmGroup* shm = nullptr;            // set when every rank is on this node and shares a segment
  const Topology* topo = nullptr;     // the agreed node map (null: one node, nothing known)
  const CostParams* cost = nullptr;   // the agreed cost-model parameters (null: the defaults)
  size_t segmentBytes = 1 << 20;      // MTXCOMM_SEGMENT_BYTES, for the cost of segmented rings
  size_t shmSlotBytes = 256 << 10;    // MTXCOMM_SHM_SLOT_BYTES, for the cost of shm chunks
  size_t shmReductionChunkBytes = 0;  // allreduce's and reduce_scatter's shm chunk (0: the slot)
};

// The two levels a hierarchical algorithm composes, built from the communicator with its split:
// the node-local sub-communicator of this rank (its ranks on this node, in rank order) and the
// cross-node one of the ranks with this rank's local index (one per node that has that many
// ranks, in node order: the node leaders for local index 0). Each runs a whole collective with
// its own selection (shm on the node, the point-to-point algorithms across nodes).
class Levels {
 public:
  virtual ~Levels() = default;
  virtual void runLocal(const CollArgs& args) = 0;
  virtual void runCross(const CollArgs& args) = 0;
};

// An algorithm is a schedule over the point-to-point transport (build), runs directly on a
// shared-memory group (run), or composes whole collectives on the levels of the topology
// (compose); exactly one of the three is set.
struct Algorithm {
  Collective coll;
  const char* name;
  const char* description;
  // nullptr when the algorithm applies to this call; otherwise a reason.
  const char* (*declines)(const CollArgs& args, const CommInfo& info);
  void (*build)(const CollArgs& args, int rank, int nranks, const AlgoParams& params,
                Schedule& schedule);
  void (*run)(const CollArgs& args, ShmGroup& shm);
  void (*compose)(const CollArgs& args, const Topology& topo, int rank, Levels& levels);
  // run() applies args.avgDivisor (MTXCOMM_AVG) itself: it divides each result element once,
  // right where it computes the element, instead of a pass over the whole result afterwards.
  bool averages = false;
};

// Every algorithm, grouped by collective, in a fixed order.
const std::vector<Algorithm>& algorithms();
// What selection asks of an algorithm (nullptr: it can take the call): the op rule, then
// a.declines. The op rule: MTXCOMM_ADASUM is no elementwise reduction, so only the allreduce
// algorithm "adasum" takes it, and that one takes nothing else; every other reducing algorithm
// (shm, hierarchical, the schedules) declines ADASUM.
const char* algorithmDeclines(const Algorithm& a, const CollArgs& args, const CommInfo& info);
// Whether a is the algorithm of op MTXCOMM_ADASUM (and takes no other op).
bool isAdasumAlgorithm(const Algorithm& a);
const Algorithm* findAlgorithm(Collective c, std::string_view name);
// Names of the algorithms of c, e.g. {"ring", "recursive_doubling", "rabenseifner"}.
std::vector<const char*> algorithmNames(Collective c);

// Builders, one per file algos/<collective>_<algorithm>.cc.
void buildAllreduceRing(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllreduceRecursiveDoubling(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllreduceRabenseifner(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllreduceAdasum(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildBroadcastBinomial(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildBroadcastScatterAllgather(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllgatherRing(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAllgatherRecursiveDoubling(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildReduceScatterRing(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildReduceBinomial(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildBarrierDissemination(const CollArgs&, int, int, const AlgoParams&, Schedule&);
void buildAlltoallPairwise(const CollArgs&, int, int, const AlgoParams&, Schedule&);
// Shared-memory algorithms, one per file algos/<collective>_shm.cc.
void runAllreduceShm(const CollArgs&, ShmGroup&);
void runBroadcastShm(const CollArgs&, ShmGroup&);
void runReduceShm(const CollArgs&, ShmGroup&);
void runAllgatherShm(const CollArgs&, ShmGroup&);
void runReduceScatterShm(const CollArgs&, ShmGroup&);
void runBarrierShm(const CollArgs&, ShmGroup&);
void runAlltoallShm(const CollArgs&, ShmGroup&);
// Bytes of the sub-slot per destination alltoall shm cuts a slot into (a multiple of 64;
// 0: the slot is too small for n ranks, and the algorithm declines).
size_t alltoallShmSubSlotBytes(size_t slotBytes, int nranks);
// Hierarchical compositions, one per file algos/<collective>_hierarchical.cc.
void composeAllreduceHierarchical(const CollArgs&, const Topology&, int, Levels&);
void composeBroadcastHierarchical(const CollArgs&, const Topology&, int, Levels&);

}  // namespace mtxcomm

#endif  // MTXCOMM_ALGOS_REGISTRY_H_
