// The selector: what runs each call. One unit for both kinds of buffers.
//
// Host buffers: a cost model over values every rank agrees on (collective, bytes,
// communicator size, the agreed topology, the agreed cost parameters; lib/cost_model.h),
// overridable by MTXCOMM_<COLLECTIVE>_ALGO. On one node with a shared-memory segment the shm
// algorithms are chosen (they win at every size, bench/RESULTS.md). A forced algorithm that
// declines the call falls back to the automatic choice with a warning naming why (once per
// collective/algorithm/size/reason). Op adasum runs only on the allreduce algorithm "adasum"
// (algorithmDeclines, algos/registry.h): forcing another algorithm for it is such a fallback. Each
// call's choice and its predicted time are logged at DEBUG.
//
// Device buffers (gpu/device.h): a path from the agreed DeviceTopology, in the order nccl,
// cuda_ipc, host_staging (the first whose devicePathDeclines accepts the call), overridable by
// MTXCOMM_CUDA_PATH; a forced path that declines is MTXCOMM_UNSUPPORTED naming it and why (on
// every rank alike, before any byte moves).
#ifndef MTXCOMM_LIB_SELECT_H_
#define MTXCOMM_LIB_SELECT_H_

#include <string>

#include "algos/registry.h"
#include "gpu/device.h"

namespace mtxcomm {

struct Selection {
  const Algorithm* algorithm = nullptr;                        // host buffers
  gpu::DevicePath devicePath = gpu::DevicePath::kHostStaging;  // device buffers
  std::string why;         // "auto: cost model", "forced by MTXCOMM_ALLREDUCE_ALGO", ...
  double predicted = 0.0;  // the cost model's seconds for the chosen algorithm (host)
};

// The automatic choice alone (what "auto" means): shm when the communicator has a segment,
// otherwise the algorithm with the least predicted time (ties: the first in the registry).
const Algorithm* defaultAlgorithm(const CollArgs& args, const CommInfo& info);
// forced is the configured name or "auto". rank is for the log line only.
Selection selectAlgorithm(const CollArgs& args, const CommInfo& info, const std::string& forced,
                          int rank);
// A call on device buffers (user-level args: AVG, 16-bit types). forced is MTXCOMM_CUDA_PATH
// ("auto" or a path name). rank is for the log line only.
Selection selectDevicePath(const CollArgs& args, const gpu::DeviceTopology& t,
                           const std::string& forced, int rank);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_SELECT_H_
