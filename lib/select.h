// Algorithm selection: a cost model over values every rank agrees on (collective, bytes,
// communicator size, the agreed topology, the agreed cost parameters; lib/cost_model.h),
// overridable by MTXCOMM_<COLLECTIVE>_ALGO. On one node with a shared-memory segment the shm
// algorithms are chosen (they win at every size, bench/RESULTS.md). A forced algorithm that
// declines the call falls back to the automatic choice with a warning naming why (once per
// collective/algorithm/reason). Each call's choice and its predicted time are logged at DEBUG.
#ifndef MTXCOMM_LIB_SELECT_H_
#define MTXCOMM_LIB_SELECT_H_

#include <string>

#include "algos/registry.h"

namespace mtxcomm {

struct Selection {
  const Algorithm* algorithm;
  std::string why;         // "auto: cost model", "forced by MTXCOMM_ALLREDUCE_ALGO", ...
  double predicted = 0.0;  // the cost model's seconds for the chosen algorithm
};

// The automatic choice alone (what "auto" means): shm when the communicator has a segment,
// otherwise the algorithm with the least predicted time (ties: the first in the registry).
const Algorithm* defaultAlgorithm(const CollArgs& args, const CommInfo& info);
// forced is the configured name or "auto". rank is for the log line only.
Selection selectAlgorithm(const CollArgs& args, const CommInfo& info, const std::string& forced,
                          int rank);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_SELECT_H_
