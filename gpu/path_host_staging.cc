// host_staging: device buffers through pinned host memory and the host collectives; the
// fallback that works on any communicator (across nodes until ucx_cuda exists).
//
// Steps, for chunk c of the call (gpu/device.h planChunks; two pinned slots, c uses c % 2):
//   1. the device-to-host copy of chunk c+1 is enqueued on the call's stream before the host
//      works on chunk c, so copies overlap the host collective (a two-stage pipeline);
//   2. the host waits for chunk c's copy (an event; only this stream's work), runs the host
//      collective in place on the slot (every host algorithm, AVG and float16/bfloat16 rules
//      apply unchanged), and enqueues the host-to-device copy of the result.
// The call returns once the last copy is enqueued; the next call's stream waits for it (an
// event) before reusing the slots. Bytes per rank: in + out over PCIe/C2C, plus the host
// collective's own. Per-collective layout of a chunk of len elements (in-place host forms):
//   allreduce, broadcast, reduce   slot = the chunk;
//   allgather                      slot = n blocks of len, own block copied in at rank*len,
//                                  all n copied out with one 2D copy (pitch count);
//   reduce_scatter                 n blocks copied in with one 2D copy, own block out.
// Source: the staged path of Open MPI's CUDA-aware collectives (ompi/mca/coll/cuda) and
// Horovod's host fallback, with NCCL-style chunking.
#include <memory>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_paths.h"
#include "lib/base/dtype.h"

namespace mtxcomm {
namespace gpu {

namespace {

class HostStaging : public PathRunner {
 public:
  HostStaging(HostCollectives& host, size_t chunkBytes) : host_(host), chunkBytes_(chunkBytes) {
    try {
      for (int s = 0; s < 2; ++s) {
        MTXCOMM_CUDA_CHECK(cudaHostAlloc(&slot_[s], chunkBytes_, cudaHostAllocPortable));
        MTXCOMM_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[s], cudaEventDisableTiming));
      }
      MTXCOMM_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  ~HostStaging() override { release(); }

 private:
  void release() {
    if (used_) cudaEventSynchronize(done_);  // the last copies read the slots
    for (int s = 0; s < 2; ++s) {
      if (slot_[s]) cudaFreeHost(slot_[s]);
      if (ready_[s]) cudaEventDestroy(ready_[s]);
    }
    if (done_) cudaEventDestroy(done_);
  }

 public:
  void run(const CollArgs& a, cudaStream_t stream) override {
    const int n = host_.size(), me = host_.rank();
    const size_t es = datatypeSize(a.dtype);
    const ChunkPlan plan = planChunks(a.coll, a.count, es, n, chunkBytes_);
    if (used_) MTXCOMM_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
    used_ = true;
    copyIn(a, plan, 0, stream);
    for (size_t c = 0; c < plan.chunks; ++c) {
      const int s = static_cast<int>(c % 2);
      if (c + 1 < plan.chunks) copyIn(a, plan, c + 1, stream);
      MTXCOMM_CUDA_CHECK(cudaEventSynchronize(ready_[s]));
      const size_t len = chunkLen(plan, a.count, c);
      char* p = static_cast<char*>(slot_[s]);
      CollArgs h = a;
      h.stream = nullptr;
      h.count = len;
      h.sendbuf = h.recvbuf = p;
      if (a.coll == Collective::kAllgather) h.sendbuf = p + me * len * es;
      if (a.coll == Collective::kReduceScatter) h.recvbuf = p + me * len * es;
      if (a.coll == Collective::kReduce && me != a.root) h.recvbuf = nullptr;
      host_.run(h);
      copyOut(a, plan, c, stream);
    }
    MTXCOMM_CUDA_CHECK(cudaEventRecord(done_, stream));
  }

 private:
  static size_t chunkLen(const ChunkPlan& plan, size_t count, size_t c) {
    return std::min(plan.chunkElems, count - c * plan.chunkElems);
  }

  // Enqueues the device-to-host copy of chunk c into its slot and records the slot's event.
  void copyIn(const CollArgs& a, const ChunkPlan& plan, size_t c, cudaStream_t stream) {
    const int n = host_.size(), me = host_.rank();
    const size_t es = datatypeSize(a.dtype), len = chunkLen(plan, a.count, c);
    const size_t off = c * plan.chunkElems * es, bytes = len * es;
    char* p = static_cast<char*>(slot_[c % 2]);
    const char* src = static_cast<const char*>(a.sendbuf);
    switch (a.coll) {
      case Collective::kBroadcast:
        if (me == a.root) {
          MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(p, src + off, bytes, cudaMemcpyDeviceToHost, stream));
        }
        break;
      case Collective::kAllgather:
        MTXCOMM_CUDA_CHECK(
            cudaMemcpyAsync(p + me * bytes, src + off, bytes, cudaMemcpyDeviceToHost, stream));
        break;
      case Collective::kReduceScatter:
        MTXCOMM_CUDA_CHECK(cudaMemcpy2DAsync(p, bytes, src + off, a.count * es, bytes, n,
                                             cudaMemcpyDeviceToHost, stream));
        break;
      default:
        MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(p, src + off, bytes, cudaMemcpyDeviceToHost, stream));
    }
    MTXCOMM_CUDA_CHECK(cudaEventRecord(ready_[c % 2], stream));
  }

  // Enqueues the host-to-device copy of chunk c's result.
  void copyOut(const CollArgs& a, const ChunkPlan& plan, size_t c, cudaStream_t stream) {
    const int n = host_.size(), me = host_.rank();
    const size_t es = datatypeSize(a.dtype), len = chunkLen(plan, a.count, c);
    const size_t off = c * plan.chunkElems * es, bytes = len * es;
    const char* p = static_cast<const char*>(slot_[c % 2]);
    char* dst = static_cast<char*>(a.recvbuf);
    switch (a.coll) {
      case Collective::kReduce:
        if (me != a.root) return;
        break;
      case Collective::kAllgather:
        MTXCOMM_CUDA_CHECK(cudaMemcpy2DAsync(dst + off, a.count * es, p, bytes, bytes, n,
                                             cudaMemcpyHostToDevice, stream));
        return;
      case Collective::kReduceScatter:
        p += me * bytes;
        break;
      default:
        break;
    }
    MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(dst + off, p, bytes, cudaMemcpyHostToDevice, stream));
  }

  HostCollectives& host_;
  size_t chunkBytes_;
  void* slot_[2] = {nullptr, nullptr};
  cudaEvent_t ready_[2] = {nullptr, nullptr};
  cudaEvent_t done_ = nullptr;
  bool used_ = false;
};

}  // namespace

std::unique_ptr<PathRunner> makeHostStagingPath(HostCollectives& host, size_t chunkBytes) {
  return std::make_unique<HostStaging>(host, chunkBytes);
}

}  // namespace gpu
}  // namespace mtxcomm
