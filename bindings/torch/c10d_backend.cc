// The "mtxcomm" backend of torch.distributed in C++, its collectives (c10d_backend.h declares
// the backend; c10d_work.cc holds its Work classes, its life and its worker's queue): each call
// either runs natively on the group's communicator (inline or queued, through run) or, when the
// C API cannot take it, goes to the Python fallback after the queued calls (drain, delegated).
// Also the roots' checks and the point-to-point posts.

#include "c10d_backend.h"

namespace mtxcomm_torch {

// ---- the collectives ------------------------------------------------------------------------

// -- allreduce, broadcast, reduce --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  auto op = opOf(opts.reduceOp);
  if (!op || !native(tensors)) {
    hostOnly("allreduce", tensors);
    drain();
    return delegated(fallback("allreduce")->allreduce(tensors, opts));
  }
  auto ts = tensors;
  mtxcomm_op_t o = *op;
  auto device = cudaDeviceOf(tensors, "allreduce");
  return run(
      c10d::OpType::ALLREDUCE, tensors, bytesOf(tensors),
      [this, ts, o](void* stream) {
        for (const auto& t : ts) {
          Staged s(t);
          check(mtxcomm_allreduce(s.ptr(), s.ptr(), s.count(), dt(t), o, comm_, stream), comm_,
                "allreduce");
          s.copyBack();
        }
      },
      device, isWaited(opts));
}

void MtxcommBackend::allreduceDirect(at::Tensor& t, int op) {
  TORCH_CHECK_VALUE(nativeHost(t) && t.is_contiguous(),
                    "mtxcomm.torch.direct_all_reduce: the tensor must be a contiguous dense CPU "
                    "tensor of a dtype mtxcomm has, got ",
                    t.toString(), (t.is_contiguous() ? "" : " (not contiguous)"));
  TORCH_CHECK_VALUE(MTXCOMM_SUM <= op && op <= MTXCOMM_AVG, "mtxcomm.torch.direct_all_reduce: op ",
                    op, " is not an mtxcomm_op_t");
  if (pending() != 0) drain();  // calls reach the communicator in the order they are made
  std::lock_guard<std::mutex> lock(commMutex_);
  TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
  check(mtxcomm_allreduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), dt(t), mtxcomm_op_t(op),
                          comm_, nullptr),
        comm_, "direct_all_reduce");
}

double MtxcommBackend::benchAllreduce(at::Tensor& t, int64_t iters) {
  TORCH_CHECK_VALUE(nativeHost(t) && t.is_contiguous() && iters > 0,
                    "bench_allreduce: a contiguous dense CPU tensor and iters > 0, got ",
                    t.toString(), " and ", iters);
  if (pending() != 0) drain();
  std::lock_guard<std::mutex> lock(commMutex_);
  TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
  void* p = t.data_ptr();
  const size_t n = size_t(t.numel());
  const mtxcomm_datatype_t type = dt(t);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    check(mtxcomm_allreduce(p, p, n, type, MTXCOMM_SUM, comm_, nullptr), comm_, "bench_allreduce");
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         double(iters);
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                         const c10d::BroadcastOptions& opts) {
  if (!native(tensors) || opts.rootTensor != 0) {
    hostOnly("broadcast", tensors);
    drain();
    return delegated(fallback("broadcast")->broadcast(tensors, opts));
  }
  auto ts = tensors;
  int root = int(opts.rootRank);
  auto device = cudaDeviceOf(tensors, "broadcast");
  if (device) checkRoot(root, "broadcast");  // a CUDA call is not queued: refused here
  auto work = run(
      c10d::OpType::BROADCAST, tensors, bytesOf(tensors),
      [this, ts, root](void* stream) {
        for (const auto& t : ts) {
          Staged s(t);
          int rc = mtxcomm_broadcast(s.ptr(), s.ptr(), s.count(), dt(t), root, comm_, stream);
          checkRoot(root, "broadcast");
          check(rc, comm_, "broadcast");
          s.copyBack();
        }
      },
      device, isWaited(opts));
  return raiseIfBadRoot(work, root);
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::reduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::ReduceOptions& opts) {
  auto op = opOf(opts.reduceOp);
  if (!op || !native(tensors) || opts.rootTensor != 0) {
    hostOnly("reduce", tensors);
    drain();
    return delegated(fallback("reduce")->reduce(tensors, opts));
  }
  auto ts = tensors;
  int root = int(opts.rootRank);
  mtxcomm_op_t o = *op;
  bool isRoot = root == getRank();
  auto device = cudaDeviceOf(tensors, "reduce");
  if (device) checkRoot(root, "reduce");  // a CUDA call is not queued: refused here
  auto work = run(
      c10d::OpType::REDUCE, tensors, bytesOf(tensors),
      [this, ts, root, o, isRoot](void* stream) {
        for (const auto& t : ts) {
          Staged s(t);
          // The root reduces in place; the others' tensors keep their values.
          int rc = mtxcomm_reduce(s.ptr(), isRoot ? s.ptr() : nullptr, s.count(), dt(t), o, root,
                                  comm_, stream);
          checkRoot(root, "reduce");
          check(rc, comm_, "reduce");
          if (isRoot) s.copyBack();
        }
      },
      device, isWaited(opts));
  return raiseIfBadRoot(work, root);
}

// -- allgather --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::all_gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  if (!native({output, input}) || output.scalar_type() != input.scalar_type() ||
      output.numel() != input.numel() * getSize()) {
    hostOnly("all_gather_into_tensor", {output, input});
    drain();
    return delegated(fallback("all_gather_into_tensor")->_allgather_base(output, input, opts));
  }
  at::Tensor in = input, out = output;
  return run(
      c10d::OpType::_ALLGATHER_BASE, {output}, output.nbytes(),
      [this, in, out](void* stream) {
        Staged s(in), o(out);
        check(mtxcomm_allgather(s.ptr(), o.ptr(), s.count(), dt(in), comm_, stream), comm_,
              "all_gather_into_tensor");
        o.copyBack();
      },
      cudaDeviceOf({output, input}, "all_gather_into_tensor"), isWaited(opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::_allgather_base(at::Tensor& output,
                                                               at::Tensor& input,
                                                               const c10d::AllgatherOptions& opts) {
  return all_gather_single(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> every = inputs;
  for (const auto& outs : outputs) every.insert(every.end(), outs.begin(), outs.end());
  bool ok = native(every) && outputs.size() == inputs.size();
  for (size_t i = 0; ok && i < inputs.size(); ++i) {
    ok = outputs[i].size() == size_t(getSize());
    for (size_t r = 0; ok && r < outputs[i].size(); ++r) {
      ok = outputs[i][r].numel() == inputs[i].numel() &&
           outputs[i][r].scalar_type() == inputs[i].scalar_type();
    }
  }
  if (!ok) {  // uneven sizes, a wrong list: the fallback (and its messages)
    hostOnly("allgather", every);
    drain();
    return delegated(fallback("allgather")->allgather(outputs, inputs, opts));
  }
  std::vector<at::Tensor> flatOut;
  for (const auto& outs : outputs) flatOut.insert(flatOut.end(), outs.begin(), outs.end());
  auto ins = inputs;
  auto outs = outputs;
  int n = getSize();
  return run(
      c10d::OpType::ALLGATHER, flatOut, bytesOf(flatOut),
      [this, ins, outs, n](void* stream) {
        for (size_t i = 0; i < ins.size(); ++i) {
          Staged s(ins[i]);
          auto flat = at::empty({int64_t(s.count()) * n}, ins[i].options());
          check(mtxcomm_allgather(s.ptr(), flat.data_ptr(), s.count(), dt(ins[i]), comm_, stream),
                comm_, "allgather");
          auto parts = flat.chunk(n);
          for (int r = 0; r < n; ++r) outs[i][r].copy_(parts[r].view(outs[i][r].sizes()));
        }
      },
      cudaDeviceOf(every, "allgather"), isWaited(opts));
}

// -- reduce-scatter --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  auto op = opOf(opts.reduceOp);
  if (!op || !native({output, input}) || output.scalar_type() != input.scalar_type() ||
      input.numel() != output.numel() * getSize()) {
    hostOnly("reduce_scatter_tensor", {output, input});
    drain();
    return delegated(fallback("reduce_scatter_tensor")->_reduce_scatter_base(output, input, opts));
  }
  at::Tensor in = input, out = output;
  mtxcomm_op_t o = *op;
  return run(
      c10d::OpType::_REDUCE_SCATTER_BASE, {output}, input.nbytes(),
      [this, in, out, o](void* stream) {
        Staged s(in), r(out);
        check(mtxcomm_reduce_scatter(s.ptr(), r.ptr(), r.count(), dt(out), o, comm_, stream), comm_,
              "reduce_scatter_tensor");
        r.copyBack();
      },
      cudaDeviceOf({output, input}, "reduce_scatter_tensor"), isWaited(opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_single(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto op = opOf(opts.reduceOp);
  std::vector<at::Tensor> every = outputs;
  for (const auto& ins : inputs) every.insert(every.end(), ins.begin(), ins.end());
  bool ok = op.has_value() && native(every) && outputs.size() == inputs.size();
  for (size_t i = 0; ok && i < outputs.size(); ++i) {
    ok = inputs[i].size() == size_t(getSize());
    for (size_t r = 0; ok && r < inputs[i].size(); ++r) {
      ok = inputs[i][r].numel() == outputs[i].numel() &&
           inputs[i][r].scalar_type() == outputs[i].scalar_type();
    }
  }
  if (!ok) {
    hostOnly("reduce_scatter", every);
    drain();
    return delegated(fallback("reduce_scatter")->reduce_scatter(outputs, inputs, opts));
  }
  auto outs = outputs;
  auto ins = inputs;
  mtxcomm_op_t o = *op;
  size_t bytes = 0;
  for (const auto& l : inputs) bytes += bytesOf(l);
  return run(
      c10d::OpType::REDUCE_SCATTER, outputs, bytes,
      [this, outs, ins, o](void* stream) {
        for (size_t i = 0; i < outs.size(); ++i) {
          std::vector<at::Tensor> flat;
          for (const auto& t : ins[i]) flat.push_back(t.reshape({-1}));
          auto cat = at::cat(flat);
          Staged r(outs[i]);
          check(mtxcomm_reduce_scatter(cat.data_ptr(), r.ptr(), r.count(), dt(outs[i]), o, comm_,
                                       stream),
                comm_, "reduce_scatter");
          r.copyBack();
        }
      },
      cudaDeviceOf(every, "reduce_scatter"), isWaited(opts));
}

// -- alltoall --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::all_to_all_single(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outSplits,
    std::vector<int64_t>& inSplits, const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  const int64_t rows = input.dim() ? input.size(0) : 1;
  int64_t row = input.dim() ? (rows ? input.numel() / rows : 1) : 1;
  if (input.dim() && rows == 0) {
    row = 1;
    for (int64_t d = 1; d < input.dim(); ++d) row *= input.size(d);
  }
  hostOnly("all_to_all_single", {output, input});  // the C API's alltoall: host memory
  bool ok = nativeHost(input) && nativeHost(output) && input.scalar_type() == output.scalar_type();
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
      [this, in, out, splits, want, row, n, even](void*) {
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
      },
      std::nullopt, isWaited(opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                             std::vector<int64_t>& outSplits,
                                                             std::vector<int64_t>& inSplits,
                                                             const c10d::AllToAllOptions& opts) {
  return all_to_all_single(output, input, outSplits, inSplits, opts);
}

// -- barrier --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::barrier(const c10d::BarrierOptions& opts) {
  return run(
      c10d::OpType::BARRIER, {}, 0,
      [this](void*) { check(mtxcomm_barrier(comm_), comm_, "barrier"); }, std::nullopt,
      isWaited(opts));
}

// -- point-to-point --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                    int tag) {
  return p2p(true, tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                    int tag) {
  return p2p(false, tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                             int tag) {
  return p2p(false, tensors, MTXCOMM_ANY_SOURCE, tag);
}

// -- everything else: the fallback, after the queued calls --

c10::intrusive_ptr<c10d::Work> MtxcommBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  hostOnly("allreduce_coalesced", tensors);
  drain();
  return delegated(fallback("allreduce_coalesced")->allreduce_coalesced(tensors, opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  hostOnly("allreduce_sparse", tensors);
  drain();
  return delegated(fallback("allreduce_sparse")->allreduce_sparse(tensors, opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  hostOnly("allgather_coalesced", inputs);
  drain();
  return delegated(fallback("allgather_coalesced")->allgather_coalesced(outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::GatherOptions& opts) {
  hostOnly("gather", inputs);
  drain();
  return delegated(fallback("gather")->gather(outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ScatterOptions& opts) {
  hostOnly("scatter", outputs);
  drain();
  return delegated(fallback("scatter")->scatter(outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllToAllOptions& opts) {
  hostOnly("alltoall", inputs);
  drain();
  return delegated(fallback("alltoall")->alltoall(outputs, inputs, opts));
}

// ---- the collectives' helpers ---------------------------------------------------------------

// A root outside the group: the C API refuses the call (which keeps this rank's call sequence
// in step with the others'), and the caller gets a ValueError at once, as from the Python
// backend.
void MtxcommBackend::checkRoot(int root, const char* what) const {
  TORCH_CHECK_VALUE(0 <= root && root < getSize(), "mtxcomm backend: ", what, ": root ", root,
                    " is not a rank of this group (size ", getSize(), ")");
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::raiseIfBadRoot(c10::intrusive_ptr<c10d::Work> work,
                                                              int root) {
  if (work && (root < 0 || root >= getSize())) work->wait();  // throws checkRoot's error
  return work;
}

void MtxcommBackend::hostOnly(const char* what, const std::vector<at::Tensor>& ts) const {
  for (const auto& t : ts) {
    if (!t.defined() || !t.device().is_cuda()) continue;
    TORCH_CHECK_VALUE(cudaBuilt(), "mtxcomm backend: ", what, " on ", t.device().str(),
                      ": this libmtxcomm was built without CUDA (mtxcomm_info says so); build "
                      "it with CUDA, or use init_process_group(\"cpu:mtxcomm,cuda:nccl\")");
    TORCH_CHECK_VALUE(false, "mtxcomm backend: ", what, " is not supported on CUDA tensors (got ",
                      t.device().str(),
                      "); on CUDA tensors mtxcomm runs allreduce, broadcast, reduce, and the "
                      "allgathers and reduce-scatters of equal sizes (SUM, AVG, MIN, MAX, "
                      "PRODUCT)");
  }
}

c10d::Backend* MtxcommBackend::fallback(const char* what) {
  TORCH_CHECK(fallback_, "mtxcomm backend: ", what,
              " is not supported natively and this "
              "backend has no fallback");
  return fallback_.get();
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::p2p(bool isSend, std::vector<at::Tensor>& tensors,
                                                   int peer, int tag) {
  const bool any = peer == MTXCOMM_ANY_SOURCE && !isSend;
  const char* what = isSend ? "send" : (any ? "recv from any source" : "recv");
  hostOnly(what, tensors);  // the C API's point-to-point: host memory
  if (tensors.size() != 1 || !nativeHost(tensors[0])) {
    drain();
    return delegated(isSend ? fallback(what)->send(tensors, peer, tag)
                     : any  ? fallback(what)->recvAnysource(tensors, tag)
                            : fallback(what)->recv(tensors, peer, tag));
  }
  TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
  TORCH_CHECK_VALUE(0 <= tag && tag < kMonitorTag, "mtxcomm backend: ", what, ": tag ", tag,
                    " is outside [0, ", kMonitorTag - 1, "] (MPI's least tag bound; ", kMonitorTag,
                    " is the backend's own, for monitored_barrier)");
  TORCH_CHECK_VALUE(any || (0 <= peer && peer < getSize()), "mtxcomm backend: ", what, ": peer ",
                    peer, " is not a rank of this group of ", getSize());
  const at::Tensor& t = tensors[0];
  Staged s(t);
  std::string label = std::string(isSend ? "send to rank " : "recv from ") +
                      (any ? std::string("any rank") : std::to_string(peer)) + " tag " +
                      std::to_string(tag);
  P2PWork::sweep();
  mtxcomm_request_t req = nullptr;
  int rc = isSend ? mtxcomm_isend(s.ptr(), s.flat.nbytes(), MTXCOMM_UINT8, peer, tag, comm_, &req)
                  : mtxcomm_irecv(s.ptr(), s.flat.nbytes(), MTXCOMM_UINT8, peer, tag, comm_, &req);
  if (rc != MTXCOMM_SUCCESS) raise(rc, comm_, label.c_str());
  if (isSend) s = Staged(s.flat);  // nothing to copy back
  const auto op = isSend ? c10d::OpType::SEND
                  : any  ? c10d::OpType::RECVANYSOURCE
                         : c10d::OpType::RECV;
  return c10::make_intrusive<P2PWork>(getRank(), op, t, std::move(s), req, comm_, label,
                                      options_->timeout);
}

}  // namespace mtxcomm_torch
