// The declarations of the "mtxcomm" backend of torch.distributed in C++ (the Python module
// mtxcomm.torch._c10d): the C API helpers, the Work classes and the c10d::Backend. Defined in
// c10d_work.cc (the helpers, the Work classes, the backend's life and its worker's queue),
// c10d_backend.cc (the collectives), c10d_group.cc (monitored barrier, split) and
// c10d_module.cc (the pybind11 registration).
//
// The "mtxcomm" backend of torch.distributed in C++: a c10d::Backend compiled against the
// installed torch (the Python module mtxcomm.torch._c10d), over the public C API only.
//
// Why: the Python backend (python/mtxcomm/torch/backend.py) costs ~130-200 us per call at 8 B
// (PyTorch's PyBackend trampoline, the backend's Python, the engine's hand-over and
// negotiation) where mtxcomm_allreduce costs ~0.5 us. This one calls the C API directly on a
// communicator of its own, made by Python (_group.open_comm: bootstrapped through the group's
// c10d store, as the subgroups' communicators are) and handed over as an address. c10d has
// every rank issue the same collectives on a group in the same order (NCCL relies on it), so
// there is no negotiation: calls reach the communicator in the order they are made.
//
// - A call of at most MTXCOMM_TORCH_INLINE_BYTES bytes (default 64 KiB) runs on the calling
//   thread and returns a completed Work; a larger one goes to the backend's worker thread
//   (FIFO) and returns at once (DDP overlaps its buckets with backward). While the worker has
//   calls, a small call queues behind them too: calls reach the communicator in order.
// - Natively: allreduce (SUM, AVG, MIN, MAX, PRODUCT), broadcast, reduce, all_gather_single,
//   allgather (equal sizes), reduce_scatter_single, reduce_scatter (lists), all_to_all_single
//   (with or without split sizes), barrier, monitored_barrier, send, recv and recv from any
//   source (mtxcomm_isend/irecv), split_group. CPU dense
//   tensors of the C API's dtypes; a non-contiguous one through a contiguous copy.
// - CUDA tensors (a CUDA build of libmtxcomm; PyTorch then routes "cuda" to this backend too):
//   allreduce, broadcast, reduce, the allgathers and reduce-scatters of equal sizes, on the
//   library's device paths (nccl, cuda_ipc, host_staging: docs/gpus.md). Each is enqueued on
//   the device's current stream, after the calls already queued, and returns a CudaWork; the
//   other calls on CUDA tensors (alltoall, send/recv, the fallback's) raise a ValueError
//   naming the call, as does a call whose tensors are on two devices.
// - Everything else (gather, scatter, alltoall lists, the coalesced calls, PREMUL_SUM, complex,
//   uneven allgather, a tensor on another device) goes to the fallback: the Python backend made
//   alongside (a c10d::Backend through PyTorch's trampoline), on a communicator of its own.
//   The worker's queue is drained first, so the fallback never runs beside queued native calls
//   and every rank sees the two in the same order.
// - A failed C API call becomes a c10::Error (c10::ValueError for MTXCOMM_INVALID_ARGUMENT)
//   carrying mtxcomm_get_last_error's message, thrown by Work::wait and set on its future.

#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm_torch {

namespace py = pybind11;

inline constexpr const char* kName = "mtxcomm";

// The C API's datatype of a torch dtype, or nothing (the fallback takes it).
std::optional<mtxcomm_datatype_t> dtypeOf(at::ScalarType t);

std::optional<mtxcomm_op_t> opOf(const c10d::ReduceOp& op);

// Whether the libmtxcomm loaded has the CUDA paths (mtxcomm_get_build_feature("cuda")).
bool cudaBuilt();

// A tensor the C API takes as it is: a dense tensor of one of its dtypes, on the CPU or (a
// CUDA build of libmtxcomm) on a CUDA device.
bool native(const at::Tensor& t);
// Every tensor native and all on one device (the call's).
bool native(const std::vector<at::Tensor>& ts);
// Native and on the CPU: the calls the C API takes on host memory only (alltoall,
// point-to-point) and the Python fallback's.
bool nativeHost(const at::Tensor& t);
// The CUDA device of a call's tensors (all on it), or nothing for CPU tensors. Tensors on
// different devices: a ValueError naming both.
std::optional<c10::Device> cudaDeviceOf(const std::vector<at::Tensor>& ts, const char* what);

mtxcomm_datatype_t dt(const at::Tensor& t);

size_t bytesOf(const std::vector<at::Tensor>& ts);

// Throws the C API's error code as a c10 error carrying the library's message.
[[noreturn]] void raise(int code, mtxcomm_comm_t comm, const char* what);

void check(int code, mtxcomm_comm_t comm, const char* what);

// A contiguous view of t for the C API, and the copy back when t was not contiguous.
struct Staged {
  at::Tensor orig, flat;
  explicit Staged(const at::Tensor& t) : orig(t), flat(t.contiguous()) {}
  void* ptr() const { return flat.data_ptr(); }
  size_t count() const { return size_t(flat.numel()); }
  void copyBack() const {
    if (!flat.is_same(orig)) orig.copy_(flat);
  }
};

// Whether the caller of a collective waits for it: dist.all_reduce(t) and the other
// synchronous calls set opts.asyncOp to false (torch 2.8+), and for a null Work they skip
// Work.wait() ("the backend has synchronised in C++", distributed_c10d.py). Such a call that
// completed on the calling thread returns no Work: no Work to make, to hand to Python and to
// wait for. Options without the field (older torch) are asynchronous. Not while torch keeps
// Works of in-flight collectives as graph inputs (it registers every Work it gets).
template <class O>
auto asyncOpOf(const O& o, int) -> decltype(bool(o.asyncOp)) {
  return o.asyncOp;
}
template <class O>
bool asyncOpOf(const O&, long) {
  return true;
}
template <class O>
bool isWaited(const O& opts) {
  return !asyncOpOf(opts, 0) && !c10d::allow_inflight_collective_as_graph_input();
}

// ---- Work -----------------------------------------------------------------------------------

class MtxWork : public c10d::Work {
 public:
  MtxWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, op), outputs_(std::move(outputs)) {}

  std::vector<at::Tensor> result() override { return outputs_; }

  // Made on first use (a plain dist.all_reduce never asks for it); completed with the outputs
  // or the error, as DDP's communication hooks need.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    bool done;
    std::exception_ptr error;
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!future_) {
        future_ =
            c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
        fresh_ = true;
      }
      fut = future_;
      done = completed_ && fresh_;
      if (done) fresh_ = false;
      error = exception_;
    }
    if (done) settle(fut, error);
    return fut;
  }

  // Marks the work done (error: its exception) and completes its future if one was made.
  void complete(std::exception_ptr error) {
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      completed_ = true;
      exception_ = error;
      if (future_ && fresh_) {
        fut = future_;
        fresh_ = false;
      }
    }
    cv_.notify_all();
    if (fut) settle(fut, error);
  }

 protected:
  void settle(const c10::intrusive_ptr<c10::ivalue::Future>& fut, std::exception_ptr error) {
    if (error) {
      fut->setError(error);
    } else {
      fut->markCompleted(c10::IValue(outputs_));
    }
  }

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool fresh_ = false;  // future_ made and not yet completed
};

// A collective on CUDA tensors, enqueued on the device's current stream when it was made
// (ProcessGroupNCCL's semantics): done when the stream reaches the end event recorded after
// it. wait() makes the caller's current stream wait for that event (the host does not wait);
// the future is completed on the call's stream, so its waiters and callbacks are ordered
// after the collective on their own streams.
class CudaWork : public MtxWork {
 public:
  CudaWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs, c10::Stream stream);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  c10::Stream stream_;
  c10::Event end_;
};

// A posted send or receive: done when mtxcomm_test or mtxcomm_wait says so.
class P2PWork : public MtxWork {
 public:
  // groupTimeout: how long wait() with no timeout of its own waits (the group's timeout, as
  // Gloo's and NCCL's waits): past it the request fails with MTXCOMM_TIMEOUT.
  P2PWork(int rank, c10d::OpType op, at::Tensor t, Staged staged, mtxcomm_request_t req,
          mtxcomm_comm_t comm, std::string what, std::chrono::milliseconds groupTimeout)
      : MtxWork(rank, op, {std::move(t)}),
        staged_(std::move(staged)),
        req_(req),
        comm_(comm),
        what_(std::move(what)),
        groupTimeout_(groupTimeout) {}

  ~P2PWork() override;

  // Frees the kept requests that have completed (at each new post).
  static void sweep();
  // Keeps a request still in flight, with its buffer, until it completes.
  static void keep(mtxcomm_request_t req, Staged staged);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  // The rank whose message a completed receive took (dist.recv(src=None) asks); a send's peer.
  int sourceRank() const override;

 private:
  void finishLocked(int rc);

  static std::mutex& keptMutex();
  static std::vector<std::pair<mtxcomm_request_t, Staged>>& keptList();

  Staged staged_;
  mtxcomm_request_t req_;
  mtxcomm_comm_t comm_;
  std::string what_;
  const std::chrono::milliseconds groupTimeout_;
  mutable std::mutex p2pMutex_;
  int source_ = MTXCOMM_ANY_SOURCE;
};

// ---- the backend ----------------------------------------------------------------------------

class MtxcommBackend : public c10d::Backend {
 public:
  MtxcommBackend(int rank, int size, uintptr_t comm, py::object fallback,
                 std::chrono::milliseconds timeout, int64_t inlineBytes);
  ~MtxcommBackend() override;

  const std::string getBackendName() const override { return kName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  size_t inlineBytes() const { return inlineBytes_; }
  uintptr_t commAddress() const { return reinterpret_cast<uintptr_t>(comm_); }
  py::object fallbackObject() const { return fallbackPy_ ? fallbackPy_ : py::none(); }
  size_t pending();

  // Runs the calls already made, then frees the communicator (local). Returns what
  // mtxcomm_comm_destroy found ("" when it succeeded or the communicator was closed already): a
  // disagreement of a call that returned before its peers had entered it (a broadcast's root),
  // or a peer gone before making such a call.
  std::string close();
  // close(), raising what it found (RuntimeError): destroy_process_group reports it.
  void shutdown() override;
  void abort() override;

  // -- the collectives (c10d_backend.cc) --

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outSplits,
                                                   std::vector<int64_t>& inSplits,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // mtxcomm.torch.direct_all_reduce: an in-place allreduce of one contiguous CPU tensor on the
  // calling thread, without torch.distributed's dispatch (after the calls already queued).
  void allreduceDirect(at::Tensor& t, int op);
  // The library's own call as a benchmark sees it: iters x mtxcomm_allreduce (in place, SUM) on
  // the group's communicator in a C++ loop, no binding in between; seconds per call
  // (bench/torch_call_layers.py compares the framework's call with it in the same job).
  double benchAllreduce(at::Tensor& t, int64_t iters);

  // -- the group's own operations (c10d_group.cc) --

  // Gloo's contract: rank 0 waits for every other rank (each within the timeout), naming the
  // first that did not arrive (every one with waitAllRanks), then releases them.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  // split_group: a backend of the ranks (of this group, sorted) bootstrapped through store, as
  // a new group's (the Python side, backend.split_backend); nullptr on a rank not in ranks.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  // -- everything else: the fallback, after the queued calls (c10d_backend.cc) --

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

 private:
  // A call's body: stream is the CUDA stream of a call on CUDA tensors, else nullptr (the C
  // API's stream argument either way).
  using Fn = std::function<void(void* stream)>;
  struct Item {
    c10::intrusive_ptr<MtxWork> work;
    Fn fn;
  };

  // The collectives' helpers (c10d_backend.cc).
  void checkRoot(int root, const char* what) const;
  c10::intrusive_ptr<c10d::Work> raiseIfBadRoot(c10::intrusive_ptr<c10d::Work> work, int root);
  c10d::Backend* fallback(const char* what);
  // The calls that take CPU tensors only (the fallback's, alltoall, send/recv): a ValueError
  // naming the call when one of ts is a CUDA tensor.
  void hostOnly(const char* what, const std::vector<at::Tensor>& ts) const;
  c10::intrusive_ptr<c10d::Work> p2p(bool isSend, std::vector<at::Tensor>& tensors, int peer,
                                     int tag);
  // monitoredBarrier's: waits for req until deadline without failing the channel (a late
  // rank's message may still come); the request's result, or nothing at the deadline.
  std::optional<int> waitUntil(mtxcomm_request_t req,
                               std::chrono::steady_clock::time_point deadline);
  // Frees the monitored barrier's requests (the communicator is gone: they completed).
  void freeMonitorRequests();

  // The worker and its queue (c10d_work.cc). run: a call on CPU tensors inline or queued; on
  // CUDA tensors (device), on the calling thread, on the device's current stream, after the
  // queued calls.
  // waited: the caller waits for the call (opts.asyncOp false, isWaited); such a call that
  // completes inline returns no Work, and torch.distributed then has nothing to wait for.
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType op, std::vector<at::Tensor> outputs, size_t bytes,
                                     Fn fn, std::optional<c10::Device> device = std::nullopt,
                                     bool waited = false);
  c10::intrusive_ptr<c10d::Work> runOnStream(c10d::OpType op, std::vector<at::Tensor> outputs,
                                             c10::Device device, const Fn& fn);
  std::exception_ptr execute(const Fn& fn);
  void loop();
  void drain();
  c10::intrusive_ptr<c10d::Work> delegated(c10::intrusive_ptr<c10d::Work> work);
  void enqueue(Item item);

  mtxcomm_comm_t comm_;
  const size_t inlineBytes_;
  c10::intrusive_ptr<Options> options_;
  c10::intrusive_ptr<c10d::Backend> fallback_;
  py::object fallbackPy_;

  std::mutex commMutex_;  // one thread at a time on the communicator
  std::mutex qMutex_;
  std::condition_variable more_, idle_;
  std::deque<Item> queue_;
  size_t pending_ = 0;  // queued or running on the worker
  bool stop_ = false;
  std::thread worker_;

  // monitoredBarrier's messages (the barrier's number) on its own tag, kMonitorTag. A receive
  // that timed out stays posted and is waited on again by the next barrier, which skips a
  // message of an earlier number: a late rank never passes a later barrier for an old one.
  std::mutex monitorMutex_;
  int64_t monitorSeq_ = 0;
  std::vector<int64_t> monitorIn_;              // per rank: the number received
  std::vector<mtxcomm_request_t> monitorRecv_;  // per rank: its receive (rank 0: from it;
                                                // the others: [0], rank 0's release)
};

// The process group of a group whose only backend is this one (the creator returns it instead
// of the backend): ProcessGroup::getBackendName() then says "mtxcomm", not "custom", where
// PyTorch reports it (DDP's logging data, pg.name()).
class MtxcommProcessGroup : public c10d::ProcessGroup {
 public:
  MtxcommProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      const c10::intrusive_ptr<c10d::Backend>& backend)
      : c10d::ProcessGroup(store, rank, size) {
    setBackend(c10::DeviceType::CPU, BackendType::CUSTOM, backend);
    if (cudaBuilt()) setBackend(c10::DeviceType::CUDA, BackendType::CUSTOM, backend);
    setDefaultBackend(BackendType::CUSTOM);
  }
  const std::string getBackendName() const override { return kName; }
};

// The point-to-point tag monitoredBarrier uses; torch's send/recv take the tags below it.
inline constexpr int kMonitorTag = MTXCOMM_P2P_MAX_TAG;

}  // namespace mtxcomm_torch
