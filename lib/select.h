// Algorithm selection: a deterministic rule over values every rank agrees on (collective,
// bytes, communicator size), overridable by MTXCOMM_<COLLECTIVE>_ALGO. A forced algorithm that
// declines the call falls back to the rule with a warning naming why (once per
// collective/algorithm/reason). Each call's choice is logged at DEBUG.
#ifndef MTXCOMM_LIB_SELECT_H_
#define MTXCOMM_LIB_SELECT_H_

#include <string>

#include "algos/registry.h"

namespace mtxcomm {

struct Selection {
  const Algorithm* algorithm;
  std::string why;  // "auto: bytes < 64 KiB", "forced by MTXCOMM_ALLREDUCE_ALGO", ...
};

// The default rule alone (what "auto" means).
const Algorithm* defaultAlgorithm(const CollArgs& args, const CommInfo& info);
// forced is the configured name or "auto". rank is for the log line only.
Selection selectAlgorithm(const CollArgs& args, const CommInfo& info, const std::string& forced,
                          int rank);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_SELECT_H_
