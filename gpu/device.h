// Device buffers: what the communicator calls when a collective's buffers are GPU memory.
//
// The communicator asks isDeviceCall() for every call. Host buffers with a NULL stream take the
// host paths, untouched. A call on device buffers goes to the communicator's DeviceComm (made on
// the first such call: collective, it allgathers each rank's node, process and GPU), which picks
// one path per call from values every rank agrees on and runs it stream-ordered:
//
//   nccl          NCCL as a whole-collective backend; every rank on its own GPU
//   cuda_ipc      ranks on one node (several may share a GPU): each rank's device scratch is
//                 mapped by its peers through CUDA IPC; reduction kernels read every peer's
//                 scratch directly (algos/device_cuda_ipc.cc)
//   ucx_cuda      cross-node GPU-direct through UCX with CUDA memory: not built yet
//   host_staging  the fallback: pinned host buffers, chunks pipelined through the host
//                 collectives (any communicator)
//
// MTXCOMM_CUDA_PATH forces one; a forced path that cannot take the call is MTXCOMM_UNSUPPORTED
// naming the path and why (on every rank alike, before any byte moves).
//
// Which of gpu/device_cuda.cc (CUDA builds) or gpu/device_none.cc is compiled is CMake's
// choice; this header and gpu/device_path.cc (pure selection and chunk arithmetic, unit-tested
// on any machine) are the same in both.
#ifndef MTXCOMM_GPU_DEVICE_H_
#define MTXCOMM_GPU_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "algos/registry.h"

namespace mtxcomm {

class Comm;

namespace gpu {

// True when the buffers of this call are device memory (cudaPointerGetAttributes: device or
// managed); the call then goes to DeviceComm. False for host buffers with a NULL stream.
// Throws MTXCOMM_INVALID_ARGUMENT when sendbuf and recvbuf are of different kinds or on
// different devices, or when a stream is given with host buffers; MTXCOMM_UNSUPPORTED when a
// stream is given but this build has no CUDA or no device is visible.
bool isDeviceCall(const CollArgs& args, int rank);

// "cuda" when this build has the CUDA paths, "none" otherwise; with the device count or why
// there is none (for mtxcomm_info and the GPU tests' skip message).
std::string deviceSummary();
// Visible CUDA devices (0 without CUDA, without a driver or without a GPU).
int visibleDeviceCount();

enum class DevicePath { kNccl, kCudaIpc, kUcxCuda, kHostStaging };
constexpr int kNumDevicePaths = 4;
// "nccl", "cuda_ipc", "ucx_cuda", "host_staging".
const char* devicePathName(DevicePath p);

// What every rank agrees on about the communicator's GPUs (allgathered once by DeviceComm).
struct DeviceTopology {
  int nranks = 1;
  bool ncclBuilt = false;
  bool distinctGpus = false;       // no two ranks on the same GPU (node, device UUID)
  bool oneNode = false;            // every rank on this node
  bool oneProcessPerRank = false;  // no two ranks in one process (IPC opens others' memory only)
};

// Most ranks the cuda_ipc path takes (its kernels read every peer's scratch at once).
constexpr int kMaxIpcRanks = 16;

// Why path cannot take this call (args as the user passed them: AVG, 16-bit types), or
// nullptr when it can.
const char* devicePathDeclines(DevicePath path, const CollArgs& args, const DeviceTopology& t);

struct DevicePathChoice {
  DevicePath path;
  std::string why;  // "auto: ...", "forced by MTXCOMM_CUDA_PATH"
};
// forced is "auto" or a path name. auto tries nccl, cuda_ipc, host_staging in that order.
// A forced path that declines throws MTXCOMM_UNSUPPORTED naming the path and the reason.
DevicePathChoice chooseDevicePath(const CollArgs& args, const DeviceTopology& t,
                                  const std::string& forced);

// How a chunked path (host_staging, cuda_ipc) walks a call. The count is cut into chunks of
// at most chunkElems elements per rank block; a chunk moves inRows blocks in and outRows
// blocks out (reduce_scatter reads nranks blocks, allgather writes nranks blocks), so a chunk
// needs max(inRows, outRows) * chunkElems * elemSize bytes of buffer. chunkElems keeps chunks
// 16-byte aligned (vector loads) whenever the buffer allows it.
struct ChunkPlan {
  size_t chunkElems = 0;
  size_t chunks = 0;
  int inRows = 1;
  int outRows = 1;
};
ChunkPlan planChunks(Collective c, size_t count, size_t elemSize, int nranks, size_t bufferBytes);

// The part of a chunk of count elements that rank reduces in the cuda_ipc allreduce: equal
// slices, 16-byte aligned, the last ones shorter or empty.
struct Slice {
  size_t offset = 0;  // elements
  size_t count = 0;
};
Slice rankSlice(size_t count, int nranks, int rank, size_t elemSize);

// The communicator's device state: the path objects (NCCL communicator, IPC scratch, pinned
// staging buffers), made when first needed.
class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  // Runs one call on device buffers (user-level arguments; args.stream is the cudaStream_t)
  // and returns the name of the path it took ("local" on one rank or for count 0). Errors
  // throw mtxcomm::Error naming the path; the caller adds rank and collective.
  virtual const char* run(const CollArgs& args) = 0;
  // Collective over comm (allgathers node, process and GPU identities). The communicator's
  // device calls then run on the device of firstCall's buffers.
  static std::unique_ptr<DeviceComm> create(Comm& comm, const CollArgs& firstCall);
};

}  // namespace gpu
}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_DEVICE_H_
