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
//   (with or without split sizes), barrier, send and recv (mtxcomm_isend/irecv). CPU dense
//   tensors of the C API's dtypes; a non-contiguous one through a contiguous copy.
// - Everything else (gather, scatter, alltoall lists, the coalesced calls, PREMUL_SUM, complex,
//   uneven allgather, a tensor on another device) goes to the fallback: the Python backend made
//   alongside (a c10d::Backend through PyTorch's trampoline), on a communicator of its own.
//   The worker's queue is drained first, so the fallback never runs beside queued native calls
//   and every rank sees the two in the same order.
// - A failed C API call becomes a c10::Error (c10::ValueError for MTXCOMM_INVALID_ARGUMENT)
//   carrying mtxcomm_get_last_error's message, thrown by Work::wait and set on its future.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
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
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "mtxcomm/mtxcomm.h"

#ifndef MTXCOMM_TORCH_VERSION
#define MTXCOMM_TORCH_VERSION "unknown"
#endif

namespace mtxcomm_torch {
namespace {

namespace py = pybind11;

constexpr const char* kName = "mtxcomm";
constexpr double kForever = 1e9;  // seconds: mtxcomm_wait has no "forever" (31 years)

// The C API's datatype of a torch dtype, or nothing (the fallback takes it).
std::optional<mtxcomm_datatype_t> dtypeOf(at::ScalarType t) {
  switch (t) {
    case at::kChar:
      return MTXCOMM_INT8;
    case at::kByte:
      return MTXCOMM_UINT8;
    case at::kShort:
      return MTXCOMM_INT16;
    case at::kUInt16:
      return MTXCOMM_UINT16;
    case at::kInt:
      return MTXCOMM_INT32;
    case at::kUInt32:
      return MTXCOMM_UINT32;
    case at::kLong:
      return MTXCOMM_INT64;
    case at::kUInt64:
      return MTXCOMM_UINT64;
    case at::kHalf:
      return MTXCOMM_FLOAT16;
    case at::kBFloat16:
      return MTXCOMM_BFLOAT16;
    case at::kFloat:
      return MTXCOMM_FLOAT32;
    case at::kDouble:
      return MTXCOMM_FLOAT64;
    case at::kBool:
      return MTXCOMM_BOOL;
    default:
      return std::nullopt;
  }
}

std::optional<mtxcomm_op_t> opOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return MTXCOMM_SUM;
    case c10d::ReduceOp::AVG:
      return MTXCOMM_AVG;
    case c10d::ReduceOp::PRODUCT:
      return MTXCOMM_PROD;
    case c10d::ReduceOp::MIN:
      return MTXCOMM_MIN;
    case c10d::ReduceOp::MAX:
      return MTXCOMM_MAX;
    default:
      return std::nullopt;
  }
}

// A tensor the C API takes as it is: a dense CPU tensor of one of its dtypes.
bool native(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         dtypeOf(t.scalar_type()).has_value();
}

bool native(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (!native(t)) return false;
  }
  return !ts.empty();
}

mtxcomm_datatype_t dt(const at::Tensor& t) { return *dtypeOf(t.scalar_type()); }

size_t bytesOf(const std::vector<at::Tensor>& ts) {
  size_t n = 0;
  for (const auto& t : ts) n += t.nbytes();
  return n;
}

// Throws the C API's error code as a c10 error carrying the library's message.
[[noreturn]] void raise(int code, mtxcomm_comm_t comm, const char* what) {
  const char* last = mtxcomm_get_last_error(comm);
  std::string msg = std::string("mtxcomm backend: ") + what + ": " +
                    (last && *last ? last : mtxcomm_get_error_string(mtxcomm_result_t(code)));
  // RuntimeError in Python for every code, as the Python backend's mtxcomm.Error.
  TORCH_CHECK(false, msg);
}

void check(int code, mtxcomm_comm_t comm, const char* what) {
  if (code != MTXCOMM_SUCCESS) raise(code, comm, what);
}

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

// A posted send or receive: done when mtxcomm_test or mtxcomm_wait says so.
class P2PWork : public MtxWork {
 public:
  P2PWork(int rank, c10d::OpType op, at::Tensor t, Staged staged, mtxcomm_request_t req,
          mtxcomm_comm_t comm, std::string what)
      : MtxWork(rank, op, {std::move(t)}),
        staged_(std::move(staged)),
        req_(req),
        comm_(comm),
        what_(std::move(what)) {}

  ~P2PWork() override {
    // A request still in flight is not freed (there is no cancel) and its buffer must outlive
    // it: both go to the keeper, which frees them once the request completes.
    if (req_ != nullptr) keep(req_, std::move(staged_));
  }

  // Frees the kept requests that have completed (at each new post).
  static void sweep() {
    std::lock_guard<std::mutex> lock(keptMutex());
    auto& kept = keptList();
    for (size_t i = 0; i < kept.size();) {
      int done = 0;
      if (mtxcomm_test(kept[i].first, &done) != MTXCOMM_SUCCESS || done) {
        mtxcomm_request_free(kept[i].first);
        kept[i] = std::move(kept.back());
        kept.pop_back();
      } else {
        ++i;
      }
    }
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(p2pMutex_);
    if (req_ == nullptr) return true;
    int done = 0;
    int rc = mtxcomm_test(req_, &done);
    if (done || rc != MTXCOMM_SUCCESS) finishLocked(rc);
    return req_ == nullptr;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    {
      std::lock_guard<std::mutex> lock(p2pMutex_);
      if (req_ != nullptr) {
        double s = timeout == kNoTimeout ? kForever : std::max(1e-3, timeout.count() / 1e3);
        int rc = mtxcomm_wait(req_, s);
        finishLocked(rc);
      }
    }
    return MtxWork::wait(timeout);
  }

 private:
  void finishLocked(int rc) {
    std::exception_ptr error;
    if (rc != MTXCOMM_SUCCESS) {
      try {
        raise(rc, comm_, what_.c_str());
      } catch (...) {
        error = std::current_exception();
      }
    } else {
      try {
        staged_.copyBack();
      } catch (...) {
        error = std::current_exception();
      }
    }
    mtxcomm_request_free(req_);
    req_ = nullptr;
    complete(error);
  }

  static std::mutex& keptMutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::pair<mtxcomm_request_t, Staged>>& keptList() {
    static auto* kept = new std::vector<std::pair<mtxcomm_request_t, Staged>>();
    return *kept;
  }
  static void keep(mtxcomm_request_t req, Staged staged) {
    std::lock_guard<std::mutex> lock(keptMutex());
    keptList().emplace_back(req, std::move(staged));
  }

  Staged staged_;
  mtxcomm_request_t req_;
  mtxcomm_comm_t comm_;
  std::string what_;
  std::mutex p2pMutex_;
};

// ---- the backend ----------------------------------------------------------------------------

class MtxcommBackend : public c10d::Backend {
 public:
  MtxcommBackend(int rank, int size, uintptr_t comm, py::object fallback,
                 std::chrono::milliseconds timeout, int64_t inlineBytes)
      : c10d::Backend(rank, size),
        comm_(reinterpret_cast<mtxcomm_comm_t>(comm)),
        inlineBytes_(inlineBytes < 0 ? 0 : size_t(inlineBytes)),
        options_(c10::make_intrusive<Options>(kName, timeout)) {
    if (!fallback.is_none()) {
      fallback_ = fallback.cast<c10::intrusive_ptr<c10d::Backend>>();
      fallbackPy_ = std::move(fallback);
    }
  }

  ~MtxcommBackend() override {
    close();
    // The Python fallback is released with the GIL, or left to the interpreter at its exit.
    if (fallbackPy_) {
      if (Py_IsInitialized() && !_Py_IsFinalizing()) {
        py::gil_scoped_acquire gil;
        fallbackPy_ = py::object();
      } else {
        fallbackPy_.release();
      }
    }
  }

  const std::string getBackendName() const override { return kName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  size_t inlineBytes() const { return inlineBytes_; }
  uintptr_t commAddress() const { return reinterpret_cast<uintptr_t>(comm_); }
  py::object fallbackObject() const { return fallbackPy_ ? fallbackPy_ : py::none(); }
  size_t pending() {
    std::lock_guard<std::mutex> lock(qMutex_);
    return pending_;
  }

  // Runs the calls already made, then frees the communicator (local).
  void close() {
    std::optional<py::gil_scoped_release> nogil;
    if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
    {
      std::unique_lock<std::mutex> lock(qMutex_);
      idle_.wait(lock, [&] { return pending_ == 0; });
      stop_ = true;
    }
    more_.notify_all();
    if (worker_.joinable()) worker_.join();
    std::lock_guard<std::mutex> lock(commMutex_);
    if (comm_ != nullptr) {
      mtxcomm_comm_destroy(comm_);
      comm_ = nullptr;
    }
  }

  void shutdown() override {
    close();
    if (fallback_) fallback_->shutdown();
  }

  void abort() override {
    mtxcomm_comm_t c = comm_;
    if (c != nullptr) mtxcomm_comm_abort(c);
    comm_ = nullptr;
    if (fallback_) fallback_->abort();
  }

  // -- allreduce, broadcast, reduce --

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    auto op = opOf(opts.reduceOp);
    if (!op || !native(tensors)) {
      drain();
      return delegated(fallback("allreduce")->allreduce(tensors, opts));
    }
    auto ts = tensors;
    mtxcomm_op_t o = *op;
    return run(c10d::OpType::ALLREDUCE, tensors, bytesOf(tensors), [this, ts, o] {
      for (const auto& t : ts) {
        Staged s(t);
        check(mtxcomm_allreduce(s.ptr(), s.ptr(), s.count(), dt(t), o, comm_, nullptr), comm_,
              "allreduce");
        s.copyBack();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    if (!native(tensors) || opts.rootTensor != 0) {
      drain();
      return delegated(fallback("broadcast")->broadcast(tensors, opts));
    }
    auto ts = tensors;
    int root = int(opts.rootRank);
    auto work = run(c10d::OpType::BROADCAST, tensors, bytesOf(tensors), [this, ts, root] {
      for (const auto& t : ts) {
        Staged s(t);
        int rc = mtxcomm_broadcast(s.ptr(), s.ptr(), s.count(), dt(t), root, comm_, nullptr);
        checkRoot(root, "broadcast");
        check(rc, comm_, "broadcast");
        s.copyBack();
      }
    });
    return raiseIfBadRoot(work, root);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    auto op = opOf(opts.reduceOp);
    if (!op || !native(tensors) || opts.rootTensor != 0) {
      drain();
      return delegated(fallback("reduce")->reduce(tensors, opts));
    }
    auto ts = tensors;
    int root = int(opts.rootRank);
    mtxcomm_op_t o = *op;
    bool isRoot = root == getRank();
    auto work = run(c10d::OpType::REDUCE, tensors, bytesOf(tensors), [this, ts, root, o, isRoot] {
      for (const auto& t : ts) {
        Staged s(t);
        // The root reduces in place; the others' tensors keep their values.
        int rc = mtxcomm_reduce(s.ptr(), isRoot ? s.ptr() : nullptr, s.count(), dt(t), o, root,
                                comm_, nullptr);
        checkRoot(root, "reduce");
        check(rc, comm_, "reduce");
        if (isRoot) s.copyBack();
      }
    });
    return raiseIfBadRoot(work, root);
  }

  // -- allgather --

  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override {
    if (!native(output) || !native(input) || output.scalar_type() != input.scalar_type() ||
        output.numel() != input.numel() * getSize()) {
      drain();
      return delegated(fallback("all_gather_into_tensor")->_allgather_base(output, input, opts));
    }
    at::Tensor in = input, out = output;
    return run(c10d::OpType::_ALLGATHER_BASE, {output}, output.nbytes(), [this, in, out] {
      Staged s(in), o(out);
      check(mtxcomm_allgather(s.ptr(), o.ptr(), s.count(), dt(in), comm_, nullptr), comm_,
            "all_gather_into_tensor");
      o.copyBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return all_gather_single(output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    bool ok = native(inputs) && outputs.size() == inputs.size();
    for (size_t i = 0; ok && i < inputs.size(); ++i) {
      ok = outputs[i].size() == size_t(getSize()) && native(outputs[i]);
      for (size_t r = 0; ok && r < outputs[i].size(); ++r) {
        ok = outputs[i][r].numel() == inputs[i].numel() &&
             outputs[i][r].scalar_type() == inputs[i].scalar_type();
      }
    }
    if (!ok) {  // uneven sizes, a wrong list: the fallback (and its messages)
      drain();
      return delegated(fallback("allgather")->allgather(outputs, inputs, opts));
    }
    std::vector<at::Tensor> flatOut;
    for (const auto& outs : outputs) flatOut.insert(flatOut.end(), outs.begin(), outs.end());
    auto ins = inputs;
    auto outs = outputs;
    int n = getSize();
    return run(c10d::OpType::ALLGATHER, flatOut, bytesOf(flatOut), [this, ins, outs, n] {
      for (size_t i = 0; i < ins.size(); ++i) {
        Staged s(ins[i]);
        auto flat = at::empty({int64_t(s.count()) * n}, ins[i].options());
        check(mtxcomm_allgather(s.ptr(), flat.data_ptr(), s.count(), dt(ins[i]), comm_, nullptr),
              comm_, "allgather");
        auto parts = flat.chunk(n);
        for (int r = 0; r < n; ++r) outs[i][r].copy_(parts[r].view(outs[i][r].sizes()));
      }
    });
  }

  // -- reduce-scatter --

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    auto op = opOf(opts.reduceOp);
    if (!op || !native(output) || !native(input) || output.scalar_type() != input.scalar_type() ||
        input.numel() != output.numel() * getSize()) {
      drain();
      return delegated(
          fallback("reduce_scatter_tensor")->_reduce_scatter_base(output, input, opts));
    }
    at::Tensor in = input, out = output;
    mtxcomm_op_t o = *op;
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, input.nbytes(), [this, in, out, o] {
      Staged s(in), r(out);
      check(mtxcomm_reduce_scatter(s.ptr(), r.ptr(), r.count(), dt(out), o, comm_, nullptr), comm_,
            "reduce_scatter_tensor");
      r.copyBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return reduce_scatter_single(output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    auto op = opOf(opts.reduceOp);
    bool ok = op.has_value() && native(outputs) && outputs.size() == inputs.size();
    for (size_t i = 0; ok && i < outputs.size(); ++i) {
      ok = inputs[i].size() == size_t(getSize()) && native(inputs[i]);
      for (size_t r = 0; ok && r < inputs[i].size(); ++r) {
        ok = inputs[i][r].numel() == outputs[i].numel() &&
             inputs[i][r].scalar_type() == outputs[i].scalar_type();
      }
    }
    if (!ok) {
      drain();
      return delegated(fallback("reduce_scatter")->reduce_scatter(outputs, inputs, opts));
    }
    auto outs = outputs;
    auto ins = inputs;
    mtxcomm_op_t o = *op;
    size_t bytes = 0;
    for (const auto& l : inputs) bytes += bytesOf(l);
    return run(c10d::OpType::REDUCE_SCATTER, outputs, bytes, [this, outs, ins, o] {
      for (size_t i = 0; i < outs.size(); ++i) {
        std::vector<at::Tensor> flat;
        for (const auto& t : ins[i]) flat.push_back(t.reshape({-1}));
        auto cat = at::cat(flat);
        Staged r(outs[i]);
        check(mtxcomm_reduce_scatter(cat.data_ptr(), r.ptr(), r.count(), dt(outs[i]), o, comm_,
                                     nullptr),
              comm_, "reduce_scatter");
        r.copyBack();
      }
    });
  }

  // -- alltoall --

  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outSplits,
                                                   std::vector<int64_t>& inSplits,
                                                   const c10d::AllToAllOptions& opts) override {
    const int n = getSize();
    const int64_t rows = input.dim() ? input.size(0) : 1;
    int64_t row = input.dim() ? (rows ? input.numel() / rows : 1) : 1;
    if (input.dim() && rows == 0) {
      row = 1;
      for (int64_t d = 1; d < input.dim(); ++d) row *= input.size(d);
    }
    bool ok = native(input) && native(output) && input.scalar_type() == output.scalar_type();
    std::vector<int64_t> splits = inSplits;
    if (ok && splits.empty()) {
      ok = rows % n == 0;
      splits.assign(size_t(n), rows / n);
    }
    int64_t sum = 0;
    for (auto s : splits) {
      ok = ok && s >= 0;
      sum += s;
    }
    ok = ok && splits.size() == size_t(n) && sum == rows &&
         (outSplits.empty() || outSplits.size() == size_t(n));
    if (!ok) {  // the fallback's checks and messages
      drain();
      return delegated(
          fallback("all_to_all_single")->alltoall_base(output, input, outSplits, inSplits, opts));
    }
    at::Tensor in = input, out = output;
    std::vector<int64_t> want = outSplits;
    bool even = inSplits.empty() && outSplits.empty() && output.numel() == input.numel();
    return run(
        c10d::OpType::ALLTOALL_BASE, {output}, input.nbytes(),
        [this, in, out, splits, want, row, n, even] {
          Staged s(in), o(out);
          if (even) {
            check(mtxcomm_alltoall(s.ptr(), o.ptr(), s.count() / size_t(n), dt(in), comm_, nullptr),
                  comm_, "all_to_all_single");
            o.copyBack();
            return;
          }
          // The counts (elements) travel by a small alltoall, then an alltoallv.
          const auto N = static_cast<size_t>(n);
          std::vector<int64_t> sendCounts(N), recvCounts(N);
          for (int j = 0; j < n; ++j) sendCounts[size_t(j)] = splits[size_t(j)] * row;
          check(mtxcomm_alltoall(sendCounts.data(), recvCounts.data(), 1, MTXCOMM_INT64, comm_,
                                 nullptr),
                comm_, "all_to_all_single");
          std::vector<size_t> sc(N), sd(N), rc(N), rd(N);
          size_t so = 0, ro = 0;
          bool fits = true;
          for (int j = 0; j < n; ++j) {
            size_t J = size_t(j);
            sc[J] = size_t(sendCounts[J]);
            rc[J] = size_t(recvCounts[J]);
            sd[J] = so;
            rd[J] = ro;
            so += sc[J];
            ro += rc[J];
            if (!want.empty() && recvCounts[J] != want[J] * row) fits = false;
          }
          if (ro != size_t(out.numel())) fits = false;
          // Every rank learns whether some rank's output does not fit what arrives there,
          // so that none writes past an output or waits for a rank that refused.
          int64_t bad = fits ? 0 : 1;
          check(mtxcomm_allreduce(&bad, &bad, 1, MTXCOMM_INT64, MTXCOMM_MAX, comm_, nullptr), comm_,
                "all_to_all_single");
          if (bad) {
            std::string got;
            for (int j = 0; j < n; ++j) {
              got += (j ? ", " : "") + std::to_string(recvCounts[size_t(j)] / (row ? row : 1));
            }
            TORCH_CHECK_VALUE(fits, "mtxcomm backend: all_to_all_single on rank ", getRank(),
                              ": the ranks sent [", got, "] rows (", ro,
                              " elements) but the output holds ", out.numel(),
                              " elements or output_split_sizes differ");
            TORCH_CHECK_VALUE(false,
                              "mtxcomm backend: all_to_all_single: another rank's "
                              "output does not hold what arrives there (its own error "
                              "names the sizes)");
          }
          check(mtxcomm_alltoallv(s.ptr(), sc.data(), sd.data(), o.ptr(), rc.data(), rd.data(),
                                  dt(in), comm_, nullptr),
                comm_, "all_to_all_single");
          o.copyBack();
        });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions& opts) override {
    return all_to_all_single(output, input, outSplits, inSplits, opts);
  }

  // -- barrier --

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    return run(c10d::OpType::BARRIER, {}, 0,
               [this] { check(mtxcomm_barrier(comm_), comm_, "barrier"); });
  }

  // -- point-to-point --

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return p2p(true, tensors, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return p2p(false, tensors, src, tag);
  }

  // -- everything else: the fallback, after the queued calls --

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    drain();
    return delegated(fallback("allreduce_coalesced")->allreduce_coalesced(tensors, opts));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    drain();
    return delegated(fallback("allreduce_sparse")->allreduce_sparse(tensors, opts));
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    drain();
    return delegated(fallback("allgather_coalesced")->allgather_coalesced(outputs, inputs, opts));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    drain();
    return delegated(fallback("gather")->gather(outputs, inputs, opts));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    drain();
    return delegated(fallback("scatter")->scatter(outputs, inputs, opts));
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    drain();
    return delegated(fallback("alltoall")->alltoall(outputs, inputs, opts));
  }

 private:
  using Fn = std::function<void()>;
  struct Item {
    c10::intrusive_ptr<MtxWork> work;
    Fn fn;
  };

  // A root outside the group: the C API refuses the call (which keeps this rank's call sequence
  // in step with the others'), and the caller gets a ValueError at once, as from the Python
  // backend.
  void checkRoot(int root, const char* what) const {
    TORCH_CHECK_VALUE(0 <= root && root < getSize(), "mtxcomm backend: ", what, ": root ", root,
                      " is not a rank of this group (size ", getSize(), ")");
  }

  c10::intrusive_ptr<c10d::Work> raiseIfBadRoot(c10::intrusive_ptr<c10d::Work> work, int root) {
    if (root < 0 || root >= getSize()) work->wait();  // throws checkRoot's error
    return work;
  }

  c10d::Backend* fallback(const char* what) {
    TORCH_CHECK(fallback_, "mtxcomm backend: ", what,
                " is not supported natively and this "
                "backend has no fallback");
    return fallback_.get();
  }

  // Runs fn on the communicator: inline when small and nothing is queued, else on the worker.
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType op, std::vector<at::Tensor> outputs, size_t bytes,
                                     Fn fn) {
    TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
    auto work = c10::make_intrusive<MtxWork>(getRank(), op, std::move(outputs));
    if (bytes <= inlineBytes_) {
      bool idle;
      {
        std::lock_guard<std::mutex> lock(qMutex_);
        idle = pending_ == 0;
      }
      if (idle) {
        work->complete(execute(fn));
        return work;
      }
    }
    enqueue(Item{work, std::move(fn)});
    return work;
  }

  std::exception_ptr execute(const Fn& fn) {
    std::lock_guard<std::mutex> lock(commMutex_);
    try {
      fn();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  void loop() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(qMutex_);
        more_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      auto error = execute(item.fn);
      auto work = std::move(item.work);
      item = Item{};  // the call's tensors are released before its Work completes
      {
        std::lock_guard<std::mutex> lock(qMutex_);
        --pending_;
      }
      idle_.notify_all();
      if (work) work->complete(error);
    }
  }

  // Waits until the worker has run every queued call (without the GIL: the worker may need it).
  void drain() {
    std::optional<py::gil_scoped_release> nogil;
    if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
    std::unique_lock<std::mutex> lock(qMutex_);
    idle_.wait(lock, [&] { return pending_ == 0; });
  }

  // A call delegated to the Python backend runs on the engine (or the group's communicator),
  // and its Work's copies into the caller's outputs are made when someone waits or at the
  // Python backend's next call. The worker waits for it (the Python keeper's settle): a
  // dropped Work still fills its outputs, and the calls made after it queue behind it.
  c10::intrusive_ptr<c10d::Work> delegated(c10::intrusive_ptr<c10d::Work> work) {
    enqueue(Item{nullptr, [] {
                   py::gil_scoped_acquire gil;
                   try {
                     py::module_::import("mtxcomm.torch._work").attr("keeper").attr("settle")();
                   } catch (py::error_already_set& e) {
                     e.discard_as_unraisable("mtxcomm backend: settling a delegated call");
                   }
                 }});
    return work;
  }

  void enqueue(Item item) {
    {
      std::lock_guard<std::mutex> lock(qMutex_);
      if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
      queue_.push_back(std::move(item));
      ++pending_;
    }
    more_.notify_one();
  }

  c10::intrusive_ptr<c10d::Work> p2p(bool isSend, std::vector<at::Tensor>& tensors, int peer,
                                     int tag) {
    const char* what = isSend ? "send" : "recv";
    if (tensors.size() != 1 || !native(tensors[0])) {
      drain();
      return delegated(isSend ? fallback(what)->send(tensors, peer, tag)
                              : fallback(what)->recv(tensors, peer, tag));
    }
    TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
    TORCH_CHECK_VALUE(0 <= tag && tag <= MTXCOMM_P2P_MAX_TAG, "mtxcomm backend: ", what, ": tag ",
                      tag, " is outside [0, ", MTXCOMM_P2P_MAX_TAG, "] (MPI's least tag bound)");
    TORCH_CHECK_VALUE(0 <= peer && peer < getSize(), "mtxcomm backend: ", what, ": peer ", peer,
                      " is not a rank of this group of ", getSize());
    const at::Tensor& t = tensors[0];
    Staged s(t);
    std::string label = std::string(what) + (isSend ? " to" : " from") + " rank " +
                        std::to_string(peer) + " tag " + std::to_string(tag);
    P2PWork::sweep();
    mtxcomm_request_t req = nullptr;
    int rc = isSend
                 ? mtxcomm_isend(s.ptr(), s.flat.nbytes(), MTXCOMM_UINT8, peer, tag, comm_, &req)
                 : mtxcomm_irecv(s.ptr(), s.flat.nbytes(), MTXCOMM_UINT8, peer, tag, comm_, &req);
    if (rc != MTXCOMM_SUCCESS) raise(rc, comm_, label.c_str());
    if (isSend) s = Staged(s.flat);  // nothing to copy back
    return c10::make_intrusive<P2PWork>(getRank(), isSend ? c10d::OpType::SEND : c10d::OpType::RECV,
                                        t, std::move(s), req, comm_, label);
  }

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
};

}  // namespace
}  // namespace mtxcomm_torch

PYBIND11_MODULE(_c10d, m) {
  namespace py = pybind11;
  using mtxcomm_torch::MtxcommBackend;
  m.doc() = "mtxcomm's torch.distributed backend in C++ (bindings/torch/c10d_backend.cc)";
  m.attr("TORCH_VERSION") = MTXCOMM_TORCH_VERSION;
  // The base class must be known to pybind11 first (torch's own module registers it).
  py::module_::import("torch._C._distributed_c10d");
  py::class_<MtxcommBackend, c10d::Backend, c10::intrusive_ptr<MtxcommBackend>>(m, "MtxcommBackend")
      .def(py::init([](int rank, int size, uintptr_t comm, py::object fallback,
                       double timeoutSeconds, int64_t inlineBytes) {
             return c10::make_intrusive<MtxcommBackend>(
                 rank, size, comm, std::move(fallback),
                 std::chrono::milliseconds(int64_t(timeoutSeconds * 1e3)), inlineBytes);
           }),
           py::arg("rank"), py::arg("size"), py::arg("comm"), py::arg("fallback"),
           py::arg("timeout_seconds"), py::arg("inline_bytes"))
      .def_property_readonly("inline_bytes", &MtxcommBackend::inlineBytes)
      .def_property_readonly("comm_address", &MtxcommBackend::commAddress)
      .def_property_readonly("fallback", &MtxcommBackend::fallbackObject)
      .def("pending", &MtxcommBackend::pending, py::call_guard<py::gil_scoped_release>())
      .def("close", &MtxcommBackend::close, py::call_guard<py::gil_scoped_release>());
}
