// A CUDA build without NCCL: the nccl device path is never chosen (it declines with "built
// without NCCL"); forcing it is MTXCOMM_UNSUPPORTED before this is reached.
#include "gpu/device_paths.h"
#include "lib/base/error.h"

namespace mtxcomm {
namespace gpu {

bool ncclBuilt() { return false; }
bool ncclLoaded() { return false; }
bool ncclSharesGpus() { return false; }
std::string ncclSummary() { return "not built (no nccl.h at configure time)"; }

int ncclLoadedVersion(std::string* why) {
  *why = "this mtxcomm was built without NCCL (no nccl.h at configure time)";
  return 0;
}

std::unique_ptr<PathRunner> makeNcclPath(HostCollectives&, int) {
  fail(MTXCOMM_UNSUPPORTED, "this mtxcomm was built without NCCL");
}

}  // namespace gpu
}  // namespace mtxcomm
