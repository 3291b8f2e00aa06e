// cuda_ipc: every collective on device buffers of ranks on one node (one process per rank;
// several ranks may share a GPU), through each rank's device scratch S_r mapped by every peer
// (gpu/cuda_ipc.h). All work is enqueued on the call's stream; a phase ends with
// CudaIpcGroup::endPhase (record own event, host barrier, wait on the peers' events), so the
// host never waits for the GPU.
//
// An allreduce of at least 1 MiB skips the scratch ("direct"): each rank passes the IPC
// handles of its sendbuf and recvbuf allocations (an allgather; peers open each allocation
// once and cache it), then, after an end of phase, reduces its slice reading every rank's
// sendbuf and writes the result into every rank's recvbuf with one kernel; an end of phase
// ends the call. Bytes per rank: B read, B written: on n ranks sharing one GPU, 2nB of DRAM
// traffic per allreduce, against 2B for a copy of B, so busbw (x 2(n-1)/n) can reach half the
// copy bandwidth at n = 2. Everything else, and smaller allreduces (fewer host steps):
//
// The count is cut into chunks that fit the scratch (MTXCOMM_CUDA_IPC_BYTES; planChunks).
// Per chunk of len elements (B = len x element size), on n ranks:
//   allreduce       1. copy sendbuf chunk -> S_me                           | end phase
//                   2. reduce own slice (rankSlice): S_me[s] = op_r S_r[s]  | end phase
//                      (sources in rank order, one kernel reading all n; AVG divides, 16-bit
//                      floats accumulate in float32 and round once)
//                   3. copy every rank's slice S_r[s_r] -> recvbuf          | end phase
//                   bytes per rank: B in, B read + B/n written by the kernel, B out (a
//                   reduce-scatter + allgather through device memory, as NCCL's ring does
//                   with n-1 hops; here one hop since every peer's memory is addressable)
//   broadcast       1. root copies its chunk -> S_root | 2. others copy S_root -> recvbuf
//   reduce          1. copy chunk -> S_me | 2. root reduces all S_r -> recvbuf
//   allgather       1. copy chunk -> S_me | 2. copy every S_r -> recvbuf block r
//   reduce_scatter  1. copy the n blocks of the chunk -> S_me (one 2D copy)
//                   2. reduce block me of every S_r -> recvbuf
// each step followed by an end of phase (the last one lets the scratch be reused).
// Example, allreduce SUM of 8 floats on 2 ranks, rank r holding x_r: step 1 S_0 = x_0,
// S_1 = x_1; step 2 rank 0 writes S_0[0..4) = x_0+x_1 there, rank 1 S_1[4..8); step 3 both
// copy S_0[0..4) and S_1[4..8) into recvbuf.
// Source: the single-node "one-shot/two-shot" allreduce of NCCL's NVLS/P2P paths and of
// TensorRT-LLM's custom allreduce (IPC-mapped peer buffers + a flag barrier), here with the
// host barrier of the communicator instead of device flags.
#include <memory>

#include "gpu/cuda_check.h"
#include "gpu/cuda_ipc.h"
#include "gpu/device.h"
#include "gpu/device_paths.h"
#include "gpu/reduce_kernels.h"
#include "lib/base/dtype.h"

namespace mtxcomm {
namespace gpu {

namespace {

class CudaIpcPath : public PathRunner {
 public:
  CudaIpcPath(HostCollectives& host, size_t scratchBytes)
      : host_(host), group_(host, scratchBytes) {}

  void run(const CollArgs& a, cudaStream_t stream) override {
    const size_t es = datatypeSize(a.dtype);
    const ChunkPlan plan = planChunks(a.coll, a.count, es, host_.size(), group_.scratchBytes());
    group_.beginCall(stream);
    if (a.coll == Collective::kAllreduce && a.count * es >= kDirectBytes) {
      allreduceDirect(a, stream);
      return;
    }
    for (size_t c = 0; c < plan.chunks; ++c) {
      const size_t off = c * plan.chunkElems;
      const size_t len = std::min(plan.chunkElems, a.count - off);
      runChunk(a, off, len, stream);
    }
  }

 private:
  static constexpr size_t kDirectBytes = size_t{1} << 20;

  void allreduceDirect(const CollArgs& a, cudaStream_t stream) {
    const int n = host_.size(), me = host_.rank();
    const size_t es = datatypeSize(a.dtype);
    const std::vector<char*> send = group_.exchangeBuffer(a.sendbuf);
    const std::vector<char*> recv =
        a.sendbuf == a.recvbuf ? send : group_.exchangeBuffer(a.recvbuf);
    group_.endPhase(stream);  // every rank's input is written and its recvbuf free
    const Slice s = rankSlice(a.count, n, me, es);
    if (s.count > 0) {
      ReduceSources src;
      ReduceTargets dst;
      src.n = dst.n = n;
      for (int r = 0; r < n; ++r) {
        src.p[r] = send[r] + s.offset * es;
        dst.p[r] = recv[r] + s.offset * es;
      }
      const bool avg = a.op == MTXCOMM_AVG;
      launchReduce(a.dtype, avg ? MTXCOMM_SUM : a.op, dst, src, s.count, avg ? n : 1, stream);
    }
    group_.endPhase(stream);  // every slice is in every recvbuf
  }

  void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes == 0 || dst == src) return;
    MTXCOMM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }

  // dst = op over r of (S_r + byteOffset), len elements.
  void reduceScratch(const CollArgs& a, void* dst, size_t byteOffset, size_t len,
                     cudaStream_t stream) {
    const int n = host_.size();
    ReduceSources src;
    src.n = n;
    for (int r = 0; r < n; ++r) src.p[r] = group_.scratch(r) + byteOffset;
    const bool avg = a.op == MTXCOMM_AVG;
    launchReduce(a.dtype, avg ? MTXCOMM_SUM : a.op, dst, src, len, avg ? n : 1, stream);
  }

  void runChunk(const CollArgs& a, size_t off, size_t len, cudaStream_t stream) {
    const int n = host_.size(), me = host_.rank();
    const size_t es = datatypeSize(a.dtype), bytes = len * es;
    const char* send = static_cast<const char*>(a.sendbuf);
    char* recv = static_cast<char*>(a.recvbuf);
    char* mine = group_.scratch(me);
    switch (a.coll) {
      case Collective::kAllreduce: {
        copy(mine, send + off * es, bytes, stream);
        group_.endPhase(stream);
        const Slice s = rankSlice(len, n, me, es);
        if (s.count > 0) reduceScratch(a, mine + s.offset * es, s.offset * es, s.count, stream);
        group_.endPhase(stream);
        for (int r = 0; r < n; ++r) {
          const Slice sr = rankSlice(len, n, r, es);
          copy(recv + (off + sr.offset) * es, group_.scratch(r) + sr.offset * es, sr.count * es,
               stream);
        }
        break;
      }
      case Collective::kBroadcast:
        if (me == a.root) {
          copy(mine, send + off * es, bytes, stream);
          copy(recv + off * es, send + off * es, bytes, stream);
        }
        group_.endPhase(stream);
        if (me != a.root) copy(recv + off * es, group_.scratch(a.root), bytes, stream);
        break;
      case Collective::kReduce:
        copy(mine, send + off * es, bytes, stream);
        group_.endPhase(stream);
        if (me == a.root) reduceScratch(a, recv + off * es, 0, len, stream);
        break;
      case Collective::kAllgather:
        copy(mine, send + off * es, bytes, stream);
        group_.endPhase(stream);
        for (int r = 0; r < n; ++r) {
          copy(recv + (r * a.count + off) * es, group_.scratch(r), bytes, stream);
        }
        break;
      case Collective::kReduceScatter:
        MTXCOMM_CUDA_CHECK(cudaMemcpy2DAsync(mine, bytes, send + off * es, a.count * es, bytes, n,
                                             cudaMemcpyDefault, stream));
        group_.endPhase(stream);
        reduceScratch(a, recv + off * es, me * bytes, len, stream);
        break;
      case Collective::kBarrier:
        break;
      case Collective::kAlltoall:  // refused by the communicator and devicePathDeclines
        fail(MTXCOMM_INTERNAL_ERROR, "alltoall reached the cuda_ipc device path");
    }
    group_.endPhase(stream);
  }

  HostCollectives& host_;
  CudaIpcGroup group_;
};

}  // namespace

std::unique_ptr<PathRunner> makeCudaIpcPath(HostCollectives& host, int device,
                                            size_t scratchBytes) {
  return std::make_unique<CudaIpcPath>(host, scratchBytes);
}

}  // namespace gpu
}  // namespace mtxcomm
