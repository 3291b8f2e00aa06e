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
//                 scratch directly (gpu/path_cuda_ipc.cc)
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

#include "lib/base/call.h"

namespace mtxcomm {
namespace gpu {

// The host collectives the device paths use (bootstrap of NCCL and IPC, barriers between stream
// phases, the staged collectives): the communicator's own, over its host transport. The
// communicator implements it; nothing in gpu/ sees the communicator itself.
class HostCollectives {
 public:
  virtual ~HostCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // One user-level collective on host buffers (AVG and 16-bit types allowed), collective over
  // the communicator. Throws what the communicator throws.
  virtual void run(const CollArgs& args) = 0;
  // all[r * bytes ..] = rank r's mine (bytes each): identities and handles between ranks.
  void allgatherBytes(const void* mine, void* all, size_t bytes);
  void barrier();
};

// Sizes of the device paths' buffers (MTXCOMM_CUDA_IPC_BYTES, MTXCOMM_CUDA_STAGING_BYTES).
struct DeviceOptions {
  size_t cudaIpcBytes = size_t{64} << 20;
  size_t cudaStagingBytes = size_t{4} << 20;
};

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
// The NCCL this process loads for the nccl path (gpu/nccl_api.h): "libnccl.so.2 2.30.7
// (path)", "not loadable: why", or "not built" (for mtxcomm_info).
std::string ncclSummary();
// NCCL_VERSION_CODE of the NCCL this process loads (loading it now), or 0 with *why set (no
// nccl path in this build, or it cannot be loaded). For mtxcomm_get_nccl_version.
int ncclLoadedVersion(std::string* why);

enum class DevicePath { kNccl, kCudaIpc, kUcxCuda, kHostStaging };
constexpr int kNumDevicePaths = 4;
// "nccl", "cuda_ipc", "ucx_cuda", "host_staging".
const char* devicePathName(DevicePath p);

// What every rank agrees on about the communicator's GPUs (allgathered once by DeviceComm).
struct DeviceTopology {
  int nranks = 1;
  bool ncclBuilt = false;          // this mtxcomm has the nccl path (CUDA build with nccl.h)
  bool ncclLoaded = false;         // every rank loaded NCCL (gpu/nccl_api.h)
  bool ncclSharedGpu = false;      // every rank's NCCL may share a GPU between ranks (2.30+ with
                                   // NCCL_MULTI_RANK_GPU_ENABLE=1): nccl when forced, never auto
  bool distinctGpus = false;       // no two ranks on the same GPU (node, device UUID)
  bool oneNode = false;            // every rank on this node
  bool oneProcessPerRank = false;  // no two ranks in one process (IPC opens others' memory only)
};

// Most ranks the cuda_ipc path takes (its kernels read every peer's scratch at once).
constexpr int kMaxIpcRanks = 16;

// Why path cannot take this call (args as the user passed them: AVG, 16-bit types), or
// nullptr when it can.
const char* devicePathDeclines(DevicePath path, const CollArgs& args, const DeviceTopology& t);
// Whether NCCL has a reduction for dt (not int16, uint16, bool: devicePathDeclines keeps their
// reductions off the nccl path, which moves them as bytes in the other collectives).
bool ncclReducesDatatype(mtxcomm_datatype_t dt);

// Which path takes a call is chosen by the communicator's selector (lib/comm/select.h), from
// devicePathDeclines and the agreed DeviceTopology.

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
  // What every rank agrees on about the GPUs, for the selector.
  virtual const DeviceTopology& topology() const = 0;
  // The first half of a call on device buffers (user-level arguments; args.stream is the
  // cudaStream_t): checks that the buffers are on this communicator's device, and on one rank
  // or for count 0 does the call's local copy and returns true (nothing else to do).
  virtual bool runLocal(const CollArgs& args) = 0;
  // Runs the call on path (chosen by the selector), stream-ordered. Errors throw
  // mtxcomm::Error naming the path; the caller adds rank and collective.
  virtual void run(const CollArgs& args, DevicePath path) = 0;
  // Collective over host (allgathers node, process and GPU identities). The communicator's
  // device calls then run on the device of firstCall's buffers.
  static std::unique_ptr<DeviceComm> create(HostCollectives& host, const CollArgs& firstCall,
                                            const DeviceOptions& options);
};

}  // namespace gpu
}  // namespace mtxcomm

#endif  // MTXCOMM_GPU_DEVICE_H_
