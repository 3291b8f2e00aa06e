// Device memory for `mtxcomm_bench -d cuda`: the buffers live on the GPU (rank % visible
// devices) and the calls get a stream. bench_device_cuda.cc in CUDA builds; without CUDA,
// bench_device_none.cc, whose deviceStream() refuses -d cuda with a message.
#ifndef MTXCOMM_BENCH_BENCH_DEVICE_H_
#define MTXCOMM_BENCH_BENCH_DEVICE_H_

#include <cstddef>

namespace mtxcomm {
namespace bench {

// Selects this rank's GPU and creates the stream the calls use. Throws std::runtime_error
// (no CUDA in this build, no device).
void* deviceStream(int rank);
void destroyDeviceStream(void* stream);
// Throw std::runtime_error naming the CUDA call that failed.
void* deviceAlloc(size_t bytes);
void deviceFree(void* p);
void copyToDevice(void* dst, const void* src, size_t bytes);
void copyToHost(void* dst, const void* src, size_t bytes);
void streamSync(void* stream);

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_DEVICE_H_
