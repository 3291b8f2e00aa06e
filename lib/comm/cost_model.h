// The cost model of algorithm selection: alpha-beta-gamma per topology level.
//
// A message of m bytes between two ranks costs alpha + m * beta seconds; reducing m bytes costs
// m * gamma (Hockney's model with a reduction term, as in Thakur, Rabenseifner & Gropp,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005). There are two
// levels: intra-node (the shared-memory segment: the shm algorithms and the node-local level of
// the hierarchical ones) and inter-node (the point-to-point transport: every schedule algorithm;
// across nodes, the network). Each algorithm's predicted time comes from its message pattern (see
// predictSeconds); selection takes the minimum. Where ranks of one node share a network link,
// concurrent flows multiply the link's beta (the ring's inter-node edges per node, all ranks of
// a node for the recursive algorithms, the L concurrent cross-node allreduces of hierarchical).
//
// The parameters come from the file named by MTXCOMM_TUNING_FILE (written by
// `mtxcomm_bench --tune`), otherwise from the documented defaults below. Every rank uses rank
// 0's parameters (agreed at init), so selection stays deterministic.
#ifndef MTXCOMM_LIB_COST_MODEL_H_
#define MTXCOMM_LIB_COST_MODEL_H_

#include <string>
#include <vector>

#include "algos/registry.h"

namespace mtxcomm {

struct LevelCost {
  double alpha;  // seconds per message
  double beta;   // seconds per byte moved
  double gamma;  // seconds per byte reduced
  bool operator==(const LevelCost& o) const {
    return alpha == o.alpha && beta == o.beta && gamma == o.gamma;
  }
};

// Plain doubles: allgathered as raw bytes at init.
struct CostParams {
  // Defaults: shared memory at ~10 GB/s copy and float reduction, ~1 us per synchronised
  // chunk (bench/RESULTS.md: 1 MiB shm allreduce on 2 ranks in ~230 us); a 10 Gb/s network
  // with ~20 us per message (TCP over Ethernet).
  LevelCost intra{1e-6, 1e-10, 1e-10};
  LevelCost inter{2e-5, 8e-10, 1e-10};
  bool operator==(const CostParams& o) const { return intra == o.intra && inter == o.inter; }
  bool operator!=(const CostParams& o) const { return !(*this == o); }
};

// Reads and validates a tuning file (JSON, see tuningFileJson). Throws
// Error(MTXCOMM_INVALID_USAGE) naming the file and the bad key.
CostParams loadTuningFile(const std::string& path);
// The same from the file's text; path names it in the errors (tests/fuzz/fuzz_tuning_json.cc).
CostParams parseTuningText(const std::string& text, const std::string& path);
// The JSON a tuning file holds; extra is merged in as the "measured" object (free-form).
std::string tuningFileJson(const CostParams& params, const std::string& measuredJson = "{}");

// Predicted seconds of algorithm a for the call on the communicator described by info
// (info.cost: the parameters; null = defaults).
double predictSeconds(const Algorithm& a, const CollArgs& args, const CommInfo& info);

// Human-readable "1.23 ms".
std::string formatSeconds(double s);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COST_MODEL_H_
