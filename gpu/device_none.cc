// Device buffers in a build without CUDA: every buffer is host memory; a stream is refused.
#include "gpu/device.h"
#include "lib/base/error.h"

namespace mtxcomm {
namespace gpu {

bool isDeviceCall(const CollArgs& args, int rank) {
  if (args.stream) {
    fail(MTXCOMM_UNSUPPORTED,
         "stream must be NULL: this mtxcomm was built without CUDA (device buffers are not "
         "supported by this build)");
  }
  return false;
}

std::string deviceSummary() { return "none (built without CUDA)"; }

int visibleDeviceCount() { return 0; }

std::string ncclSummary() { return "not built (no CUDA)"; }

int ncclLoadedVersion(std::string* why) {
  *why = "this mtxcomm was built without CUDA (no nccl device path)";
  return 0;
}

std::unique_ptr<DeviceComm> DeviceComm::create(HostCollectives&, const CollArgs&,
                                               const DeviceOptions&) {
  fail(MTXCOMM_UNSUPPORTED, "this mtxcomm was built without CUDA");
}

}  // namespace gpu
}  // namespace mtxcomm
