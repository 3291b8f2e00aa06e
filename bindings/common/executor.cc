#include "bindings/common/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

namespace mtxcomm::binding {

// A call every rank refused before moving a byte (MTXCOMM_INVALID_ARGUMENT: the ranks agreed on
// its arguments, so they all refuse it, e.g. an op the datatype does not have) fails only its
// own entries; the communicator stays usable and the engine goes on.
bool OpExecutor::usable(const Status& st) { return st.code == MTXCOMM_INVALID_ARGUMENT; }

Status OpExecutor::libraryStatus(mtxcomm_result_t rc, const std::string& what) const {
  if (rc == MTXCOMM_SUCCESS) return {};
  return {rc, "mtxcomm " + what + " failed on rank " + std::to_string(rank_) + ": " +
                  mtxcomm_get_last_error(comm_)};
}

void OpExecutor::traceCall(const ReadyOp& op, const char* name,
                           std::chrono::steady_clock::time_point start,
                           std::chrono::steady_clock::time_point end, size_t bytes) {
  if (!timeline_ || !timeline_->enabled()) return;
  timeline_->complete(op.agreed.name, "QUEUE", op.agreedAt, start);
  timeline_->complete(op.agreed.name, name, start, end,
                      "\"algorithm\": \"" + jsonEscape(mtxcomm_comm_last_algorithm(comm_)) +
                          "\", \"bytes\": " + std::to_string(bytes));
}

// Allreduces of several entries (each with one or more tensors): tensors are bucketed by dtype
// in their agreed order, and each bucket is reduced in fusion-buffer sized pieces. A tensor
// larger than the fusion buffer, alone in its piece, or of at least kAloneBytes, is reduced
// straight from its input into its output. Op adasum is never fused: its result depends on the
// whole vector (the dot products of every pair), so each tensor is its own allreduce.
Status OpExecutor::runAllreduces(const std::vector<ReadyOp*>& group) {
  struct Piece {
    ReadyOp* op;
    size_t tensor;
    const void* in;
    void* out;
    size_t bytes;
    size_t count;
    bool device;   // a GPU tensor: never fused (the fusion buffer is host memory)
    void* stream;  // its stream
  };
  const mtxcomm_op_t op = group[0]->agreed.requests[0].op;
  std::map<ReadyOp*, Status> status;
  std::map<int, std::vector<Piece>> byDtype;
  std::vector<int> dtypeOrder;
  for (ReadyOp* r : group) {
    const Request& req = r->agreed.requests[0];
    for (size_t t = 0; t < req.tensors.size(); ++t) {
      const TensorMeta& m = req.tensors[t];
      std::string err;
      void* out = r->entry.allocate(t, m.shape, &err);
      if (!out && m.elements() > 0) {
        status[r] = {MTXCOMM_SYSTEM_ERROR, "mtxcomm allreduce '" + req.name + "': " + err};
      }
      if (!byDtype.count(m.dtype)) dtypeOrder.push_back(m.dtype);
      const bool device = req.device != kHostDevice;
      byDtype[m.dtype].push_back({r, t, r->entry.inputs[t], out, m.bytes(), m.elements(), device,
                                  device ? r->entry.stream : nullptr});
    }
  }
  // An allocation failure on one rank must not desynchronise the ranks: every piece is still
  // reduced (from a zero buffer if need be); only that entry reports the error.
  for (int dt : dtypeOrder) {
    auto dtype = static_cast<mtxcomm_datatype_t>(dt);
    const size_t esize = mtxcomm_datatype_size(dtype);
    std::vector<Piece>& pieces = byDtype[dt];
    size_t p = 0;
    while (p < pieces.size()) {
      size_t q = p, bytes = 0;
      while (q < pieces.size() &&
             (q == p || (op != MTXCOMM_ADASUM && !pieces[p].device && !pieces[q].device &&
                         pieces[p].bytes < kAloneBytes && pieces[q].bytes < kAloneBytes &&
                         bytes + pieces[q].bytes <= fusionBytes_))) {
        bytes += pieces[q].bytes;
        ++q;
      }
      Status st;
      if (q == p + 1) {
        Piece& pc = pieces[p];
        std::vector<char> scratch;
        void* out = pc.out;
        if (!out && pc.device) {
          out = const_cast<void*>(pc.in);  // in place: the entry fails, the ranks stay in step
        } else if (!out) {
          scratch.resize(pc.bytes);
          out = scratch.data();
        }
        const auto start = std::chrono::steady_clock::now();
        label(pc.op->agreed.requests[0].name);
        st = libraryStatus(mtxcomm_allreduce(pc.in, out, pc.count, dtype, op, comm_, pc.stream),
                           "allreduce '" + pc.op->agreed.requests[0].name + "'");
        traceCall(*pc.op, "ALLREDUCE", start, std::chrono::steady_clock::now(), pc.bytes);
      } else {
        if (fusion_.size() < bytes) fusion_.resize(bytes);
        const auto t0 = std::chrono::steady_clock::now();
        size_t off = 0;
        for (size_t k = p; k < q; ++k) {
          std::memcpy(fusion_.data() + off, pieces[k].in, pieces[k].bytes);
          off += pieces[k].bytes;
        }
        const auto t1 = std::chrono::steady_clock::now();
        label(pieces[p].op->agreed.requests[0].name + " +" + std::to_string(q - p - 1) + " fused");
        st = libraryStatus(mtxcomm_allreduce(fusion_.data(), fusion_.data(), bytes / esize, dtype,
                                             op, comm_, nullptr),
                           "allreduce of " + std::to_string(q - p) + " fused tensors (first '" +
                               pieces[p].op->agreed.requests[0].name + "')");
        const auto t2 = std::chrono::steady_clock::now();
        off = 0;
        for (size_t k = p; k < q; ++k) {
          if (pieces[k].out) std::memcpy(pieces[k].out, fusion_.data() + off, pieces[k].bytes);
          off += pieces[k].bytes;
        }
        const auto t3 = std::chrono::steady_clock::now();
        if (timeline_ && timeline_->enabled()) {
          const std::string fused = std::to_string(q - p);
          for (size_t k = p; k < q; ++k) {
            const std::string& track = pieces[k].op->agreed.name;
            timeline_->complete(track, "QUEUE", pieces[k].op->agreedAt, t0);
            timeline_->complete(track, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
            timeline_->complete(
                track, "ALLREDUCE", t1, t2,
                "\"algorithm\": \"" + jsonEscape(mtxcomm_comm_last_algorithm(comm_)) +
                    "\", \"bytes\": " + std::to_string(bytes) + ", \"fused_tensors\": " + fused);
            timeline_->complete(track, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
          }
        }
      }
      collectives_.fetch_add(1);
      for (size_t k = p; k < q; ++k) {
        if (!st.ok() && status[pieces[k].op].ok()) status[pieces[k].op] = st;
      }
      if (!st.ok() && !usable(st)) {
        // The communicator is poisoned: report to these entries; the engine stops everything.
        for (ReadyOp* r : group) r->entry.done(status[r].ok() ? st : status[r]);
        return st;
      }
      p = q;
    }
  }
  for (ReadyOp* r : group) r->entry.done(status[r]);
  return {};
}

// Tensor t's output buffer with the given shape; nullptr for an empty tensor or, with *err set,
// when the framework could not allocate it (the rank still takes part, from scratch memory).
void* OpExecutor::output(ReadyOp& op, size_t t, const std::vector<int64_t>& shape,
                         std::string* err) {
  size_t elems = 1;
  for (int64_t d : shape) elems *= static_cast<size_t>(d);
  std::string e;
  void* p = op.entry.allocate(t, shape, &e);
  if (!p && elems > 0 && err->empty()) *err = e.empty() ? "allocation failed" : e;
  return p;
}

namespace {

// Elements per row of dimension 0 (the whole tensor for a scalar).
size_t rowElements(const TensorMeta& m) {
  size_t rowElems = 1;
  for (size_t d = 1; d < m.shape.size(); ++d) rowElems *= static_cast<size_t>(m.shape[d]);
  return rowElems;
}

// Memory that stands in for an output the framework could not allocate.
void* orScratch(void* out, size_t bytes, std::vector<char>* scratch) {
  if (out || bytes == 0) return out;
  scratch->resize(bytes);
  return scratch->data();
}

}  // namespace

Status OpExecutor::broadcastOne(ReadyOp& op, size_t t, std::string* err) {
  label(op.agreed.requests[rank_].name);
  const Request& req = op.agreed.requests[rank_];
  const TensorMeta& m = req.tensors[t];
  const size_t esize = mtxcomm_datatype_size(m.dtype);
  std::vector<char> scratch;
  void* out = orScratch(output(op, t, m.shape, err), m.elements() * esize, &scratch);
  return libraryStatus(mtxcomm_broadcast(op.entry.inputs[t], out, m.elements(), m.dtype, req.root,
                                         comm_, op.entry.stream),
                       describe(op));
}

Status OpExecutor::allgatherOne(ReadyOp& op, size_t t, std::string* err) {
  label(op.agreed.requests[rank_].name);
  const int n = nranks_;
  const TensorMeta& m = op.agreed.requests[rank_].tensors[t];
  const size_t esize = mtxcomm_datatype_size(m.dtype);
  const size_t rowElems = rowElements(m);
  std::vector<size_t> rows(n);
  size_t total = 0, maxRows = 0;
  for (int r = 0; r < n; ++r) {
    rows[r] = static_cast<size_t>(op.agreed.requests[r].tensors[t].shape[0]);
    total += rows[r];
    maxRows = std::max(maxRows, rows[r]);
  }
  std::vector<int64_t> shape = m.shape;
  shape[0] = static_cast<int64_t>(total);
  std::vector<char> scratch;
  void* out = orScratch(output(op, t, shape, err), total * rowElems * esize, &scratch);
  const size_t block = maxRows * rowElems;  // elements each rank contributes, padded
  bool even = true;
  for (size_t r : rows) even = even && r == maxRows;
  if (even) {
    return libraryStatus(
        mtxcomm_allgather(op.entry.inputs[t], out, block, m.dtype, comm_, op.entry.stream),
        describe(op));
  }
  std::vector<char> send(block * esize, 0), recv(block * esize * n);
  if (rows[rank_] > 0) {
    std::memcpy(send.data(), op.entry.inputs[t], rows[rank_] * rowElems * esize);
  }
  Status st = libraryStatus(
      mtxcomm_allgather(send.data(), recv.data(), block, m.dtype, comm_, nullptr), describe(op));
  size_t off = 0;
  for (int r = 0; r < n && st.ok(); ++r) {
    const size_t len = rows[r] * rowElems * esize;
    if (len > 0) std::memcpy(static_cast<char*>(out) + off, recv.data() + r * block * esize, len);
    off += len;
  }
  return st;
}

Status OpExecutor::reduceScatterOne(ReadyOp& op, size_t t, std::string* err) {
  label(op.agreed.requests[rank_].name);
  // Rank r gets rows [start_r, start_r + rows_r) of the reduced tensor; the first
  // (dim0 % size) ranks get one extra row.
  const int n = nranks_;
  const Request& req = op.agreed.requests[rank_];
  const TensorMeta& m = req.tensors[t];
  const size_t esize = mtxcomm_datatype_size(m.dtype);
  const size_t rowElems = rowElements(m);
  const size_t dim0 = static_cast<size_t>(m.shape[0]);
  auto rowsOf = [&](int r) { return dim0 / n + (static_cast<size_t>(r) < dim0 % n ? 1 : 0); };
  const size_t block = rowsOf(0) * rowElems;
  std::vector<int64_t> shape = m.shape;
  shape[0] = static_cast<int64_t>(rowsOf(rank_));
  std::vector<char> scratch;
  void* out = orScratch(output(op, t, shape, err), block * esize, &scratch);
  if (dim0 % n == 0) {
    return libraryStatus(mtxcomm_reduce_scatter(op.entry.inputs[t], out, block, m.dtype, req.op,
                                                comm_, op.entry.stream),
                         describe(op));
  }
  std::vector<char> send(block * esize * n, 0), recv(block * esize);
  size_t start = 0;
  for (int r = 0; r < n; ++r) {
    const size_t len = rowsOf(r) * rowElems * esize;
    if (len > 0) {
      std::memcpy(send.data() + r * block * esize,
                  static_cast<const char*>(op.entry.inputs[t]) + start * rowElems * esize, len);
    }
    start += rowsOf(r);
  }
  Status st = libraryStatus(
      mtxcomm_reduce_scatter(send.data(), recv.data(), block, m.dtype, req.op, comm_, nullptr),
      describe(op));
  if (st.ok() && rowsOf(rank_) > 0) std::memcpy(out, recv.data(), rowsOf(rank_) * rowElems * esize);
  return st;
}

Status OpExecutor::alltoallOne(ReadyOp& op, std::string* err) {
  label(op.agreed.requests[rank_].name);
  const int n = nranks_;
  const TensorMeta& m = op.agreed.requests[rank_].tensors[0];
  const size_t esize = mtxcomm_datatype_size(m.dtype);
  const size_t rowElems = rowElements(m);
  // Rows rank src sends to rank dst (Negotiation::check validated every rank's splits).
  auto rows = [&](int src, int dst) -> size_t {
    const Request& q = op.agreed.requests[src];
    return static_cast<size_t>(q.splits.empty() ? q.tensors[0].shape[0] / n : q.splits[dst]);
  };
  std::vector<size_t> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  size_t sendOff = 0, recvOff = 0, recvRows = 0;
  for (int j = 0; j < n; ++j) {
    sendCounts[j] = rows(rank_, j) * rowElems;
    sendDispls[j] = sendOff;
    sendOff += sendCounts[j];
    recvCounts[j] = rows(j, rank_) * rowElems;
    recvDispls[j] = recvOff;
    recvOff += recvCounts[j];
    recvRows += rows(j, rank_);
  }
  std::vector<int64_t> shape = m.shape;
  shape[0] = static_cast<int64_t>(recvRows);
  std::vector<char> scratch;
  void* out = orScratch(output(op, 0, shape, err), recvOff * esize, &scratch);
  // Output 1: the rows received from each rank, int32[size] (Horovod's received_splits).
  if (auto* received = static_cast<int32_t*>(output(op, 1, {n}, err))) {
    for (int j = 0; j < n; ++j) received[j] = static_cast<int32_t>(rows(j, rank_));
  }
  return libraryStatus(
      mtxcomm_alltoallv(op.entry.inputs[0], sendCounts.data(), sendDispls.data(), out,
                        recvCounts.data(), recvDispls.data(), m.dtype, comm_, nullptr),
      describe(op));
}

void OpExecutor::label(const std::string& names) const {
  mtxcomm_comm_set_call_label(comm_, names.c_str());
}

std::string OpExecutor::describe(const ReadyOp& op) const {
  const Request& req = op.agreed.requests[rank_];
  return std::string(kindName(req.kind)) + " '" + req.name + "'";
}

Status OpExecutor::runOne(ReadyOp& op) {
  const Request& req = op.agreed.requests[rank_];
  std::string err;
  Status st;
  size_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  const char* trace = "?";
  // The tensors of a grouped request one after the other, in list order on every rank.
  for (size_t t = 0; t < req.tensors.size() && st.ok(); ++t) {
    bytes += req.tensors[t].bytes();
    switch (req.kind) {
      case Kind::kBroadcast:
        trace = "BROADCAST";
        st = broadcastOne(op, t, &err);
        break;
      case Kind::kAllgather:
        trace = "ALLGATHER";
        st = allgatherOne(op, t, &err);
        break;
      case Kind::kReduceScatter:
        trace = "REDUCESCATTER";
        st = reduceScatterOne(op, t, &err);
        break;
      case Kind::kAlltoall:
        trace = "ALLTOALL";
        st = alltoallOne(op, &err);
        break;
      case Kind::kAllreduce:
      case Kind::kJoin:
        break;  // runAllreduces; the engine
    }
    collectives_.fetch_add(1);
  }
  traceCall(op, trace, start, std::chrono::steady_clock::now(), bytes);
  if (!st.ok()) {
    op.entry.done(st);
    return usable(st) ? Status{} : st;
  }
  op.entry.done(err.empty() ? Status{}
                            : Status{MTXCOMM_SYSTEM_ERROR, "mtxcomm " + describe(op) + ": " + err});
  return {};
}

}  // namespace mtxcomm::binding
