#include <stdexcept>

#include "bench/bench_device.h"

namespace mtxcomm {
namespace bench {

namespace {
[[noreturn]] void noCuda() {
  throw std::runtime_error("-d cuda: this mtxcomm_bench was built without CUDA");
}
}  // namespace

void* deviceStream(int) { noCuda(); }
void destroyDeviceStream(void*) {}
void* deviceAlloc(size_t) { noCuda(); }
void deviceFree(void*) {}
void copyToDevice(void*, const void*, size_t) { noCuda(); }
void copyToHost(void*, const void*, size_t) { noCuda(); }
void streamSync(void*) {}

}  // namespace bench
}  // namespace mtxcomm
