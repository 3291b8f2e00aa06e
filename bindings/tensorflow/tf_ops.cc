// TensorFlow custom ops over the binding's engine: asynchronous kernels that hand the tensors'
// buffers to mtxcomm (no copy for a single allreduce, broadcast or evenly split allgather or
// reduce-scatter; fused allreduces are packed into one buffer). The ops are stateful so that
// tf.function keeps them even when their outputs are unused; the Python package registers them
// as order-insensitive (mtxcomm/tensorflow/_library.py), so that tf.function's automatic
// control dependencies do not chain them in program order: the collectives of one traced step
// start as their inputs become ready and the engine agrees on their order and fuses them.
//
// Ops (shapes: tensor of shape [d0, d1, ...], n ranks):
//   MtxcommAllreduce(tensor) -> same shape; reduce_op 0 sum, 1 prod, 2 min, 3 max, 4 avg.
//   MtxcommGroupedAllreduce(tensors: list) -> same shapes; one negotiation, fused.
//   MtxcommBroadcast(tensor, root_rank) -> root's tensor.
//   MtxcommAllgather(tensor [d0_r, ...]) -> [sum_r d0_r, ...], rank order.
//   MtxcommReducescatter(tensor [d0, ...]) -> [d0/n (+1 on the first d0%n ranks), ...].
//   MtxcommGroupedAllgather(tensors: list), MtxcommGroupedReducescatter(tensors: list): one
//     negotiation for the list, one collective per tensor in list order.
//   MtxcommAlltoall(tensor [d0, ...], splits int32[size] or int32[0]) -> (output
//     [sum_r rows from r, ...], received_splits int32[size]): rows splits[j] go to rank j
//     (an empty splits: d0 / size rows to each rank).
//   MtxcommJoin() -> int32 scalar: this rank has no more work; returns, once every rank has
//     joined, the last rank to join (bindings/common/engine.h).
//   MtxcommProcessInfo(info) -> int32 scalar: rank, local_rank, size or local_size when it runs.
// Every collective op has the attr overlap (default false): false, a small request whose peers
// are all there (or come within the collectives' spin) runs on the calling thread and completes
// inside ComputeAsync (Entry::mayRunInline); true, it always runs on the engine's thread (the
// gradients' allreduces of a training step, which overlap the backward pass and fuse).
// Errors come back as TF statuses: ranks that disagree on a tensor's kind, op, root, dtype or
// shape get FailedPrecondition naming the tensor and the ranks (as Horovod); a request wrong in
// itself (a root out of range, alltoall splits that do not add up) InvalidArgument; a dead or
// shut-down peer Aborted, or DeadlineExceeded (MTXCOMM_TIMEOUT).
#include <string>
#include <utility>
#include <vector>

#include "bindings/common/engine.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#if MTXCOMM_TF_DEVICE_KERNELS
#include "tensorflow/core/framework/device_base.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"
#endif

namespace mtxcomm::binding {
namespace {

namespace tf = ::tensorflow;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

#define MTXCOMM_TF_TYPES                                                                       \
  "{int8, uint8, int16, uint16, int32, uint32, int64, uint64, half, bfloat16, float, double, " \
  "bool}"

bool toMtxcomm(tf::DataType t, mtxcomm_datatype_t* out) {
  static const std::pair<tf::DataType, mtxcomm_datatype_t> kTypes[] = {
      {tf::DT_INT8, MTXCOMM_INT8},         {tf::DT_UINT8, MTXCOMM_UINT8},
      {tf::DT_INT16, MTXCOMM_INT16},       {tf::DT_UINT16, MTXCOMM_UINT16},
      {tf::DT_BOOL, MTXCOMM_BOOL},         {tf::DT_INT32, MTXCOMM_INT32},
      {tf::DT_UINT32, MTXCOMM_UINT32},     {tf::DT_INT64, MTXCOMM_INT64},
      {tf::DT_UINT64, MTXCOMM_UINT64},     {tf::DT_HALF, MTXCOMM_FLOAT16},
      {tf::DT_BFLOAT16, MTXCOMM_BFLOAT16}, {tf::DT_FLOAT, MTXCOMM_FLOAT32},
      {tf::DT_DOUBLE, MTXCOMM_FLOAT64}};
  for (const auto& [tfType, type] : kTypes) {
    if (tfType == t) {
      *out = type;
      return true;
    }
  }
  return false;
}

absl::Status toTf(const Status& st) {
  switch (st.code) {
    case MTXCOMM_SUCCESS:
      return absl::OkStatus();
    case MTXCOMM_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(st.message);
    case MTXCOMM_INVALID_USAGE:
      return absl::FailedPreconditionError(st.message);
    case MTXCOMM_TIMEOUT:
      return absl::DeadlineExceededError(st.message);
    case MTXCOMM_REMOTE_ERROR:
      return absl::AbortedError(st.message);
    case MTXCOMM_UNSUPPORTED:
      return absl::UnimplementedError(st.message);
    default:
      return absl::InternalError(st.message);
  }
}

// Output i: dimension 0 unknown, the rest as input i's.
absl::Status firstDimUnknownAt(InferenceContext* c, int i) {
  ShapeHandle in = c->input(i);
  if (!c->RankKnown(in)) {
    c->set_output(i, c->UnknownShape());
    return absl::OkStatus();
  }
  if (c->Rank(in) == 0) return absl::InvalidArgumentError("the tensor must have rank >= 1");
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(i, out);
  return absl::OkStatus();
}

absl::Status firstDimUnknown(InferenceContext* c) { return firstDimUnknownAt(c, 0); }

// Every output: dimension 0 unknown (the grouped allgather and reduce-scatter).
absl::Status firstDimUnknownEach(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(firstDimUnknownAt(c, i));
  return absl::OkStatus();
}

absl::Status sameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

REGISTER_OP("MtxcommAllreduce")
    .Attr("T: " MTXCOMM_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(sameShapes)
    .Doc("Allreduce of tensor over all ranks (reduce_op: 0 sum, 1 prod, 2 min, 3 max, 4 avg).");

REGISTER_OP("MtxcommGroupedAllreduce")
    .Attr("T: list(" MTXCOMM_TF_TYPES ")")
    .Attr("reduce_op: int")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(sameShapes)
    .Doc("Allreduce of every tensor of the list, negotiated once and fused.");

REGISTER_OP("MtxcommBroadcast")
    .Attr("T: " MTXCOMM_TF_TYPES)
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(sameShapes)
    .Doc("Every rank receives root_rank's tensor.");

REGISTER_OP("MtxcommAllgather")
    .Attr("T: " MTXCOMM_TF_TYPES)
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(firstDimUnknown)
    .Doc("Concatenation of every rank's tensor along dimension 0, in rank order.");

REGISTER_OP("MtxcommReducescatter")
    .Attr("T: " MTXCOMM_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(firstDimUnknown)
    .Doc("Reduction over ranks, then rank r keeps its share of the rows of dimension 0.");

REGISTER_OP("MtxcommGroupedAllgather")
    .Attr("T: list(" MTXCOMM_TF_TYPES ")")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(firstDimUnknownEach)
    .Doc("Allgather of every tensor of the list, negotiated once.");

REGISTER_OP("MtxcommGroupedReducescatter")
    .Attr("T: list(" MTXCOMM_TF_TYPES ")")
    .Attr("reduce_op: int")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(firstDimUnknownEach)
    .Doc("Reduce-scatter of every tensor of the list, negotiated once.");

REGISTER_OP("MtxcommAlltoall")
    .Attr("T: " MTXCOMM_TF_TYPES)
    .Attr("Tsplits: {int32, int64} = DT_INT32")
    .Attr("tensor_name: string = ''")
    .Attr("overlap: bool = false")
    .Input("tensor: T")
    .Input("splits: Tsplits")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(firstDimUnknownAt(c, 0));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(
        "Rows splits[j] of dimension 0 go to rank j, in order (no splits: dimension 0 split "
        "evenly); returns the rows received from every rank, in rank order, and how many came "
        "from each.");

REGISTER_OP("MtxcommProcessInfo")
    .Attr("info: {'rank', 'local_rank', 'size', 'local_size'}")
    .Output("value: int32")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("This process's rank, local rank, the job's size or local size, when the op runs.");

REGISTER_OP("MtxcommJoin")
    .Output("last_joined: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Marks this rank as out of work until every rank has joined; returns the last rank to "
        "join.");

class MtxcommOp : public tf::AsyncOpKernel {
 public:
  MtxcommOp(tf::OpKernelConstruction* c, Kind kind) : AsyncOpKernel(c), kind_(kind) {
    std::string name;
    if (kind == Kind::kJoin) {
      name = "mtxcomm.join";
    } else {
      OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &name));
    }
    name_ = name.empty() ? this->name() : name;
    if (kind == Kind::kAllreduce || kind == Kind::kReduceScatter) {
      int op = 0;
      OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
      OP_REQUIRES(
          c, op >= 0 && op < MTXCOMM_NUM_OPS,
          absl::InvalidArgumentError("reduce_op must be in [0, " + std::to_string(MTXCOMM_NUM_OPS) +
                                     "), got " + std::to_string(op)));
      op_ = static_cast<mtxcomm_op_t>(op);
    }
    if (kind == Kind::kBroadcast) OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
    if (c->HasAttr("overlap")) OP_REQUIRES_OK(c, c->GetAttr("overlap", &overlap_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    Entry e;
    e.request.kind = kind_;
    e.request.name = name_;
    e.request.op = op_;
    e.request.root = root_;
#if MTXCOMM_TF_DEVICE_KERNELS
    if (onDevice_) {
      // The GPU kernel: the tensors are device memory on TensorFlow's compute stream, where
      // the engine enqueues the collective (stream-ordered after the ops that produced the
      // inputs, before those that read the outputs, which TensorFlow enqueues after done).
      auto* dc = ctx->op_device_context();
      auto* stream = dc ? dc->stream() : nullptr;
      OP_REQUIRES_ASYNC(ctx, stream != nullptr,
                        absl::InternalError("mtxcomm '" + name_ + "': no GPU stream for the op"),
                        done);
      e.request.device = stream->parent()->device_ordinal();
      e.stream = stream->platform_specific_handle().stream;
    }
#endif
    std::vector<tf::Tensor> keep;  // holds the inputs alive until done
    int dataInputs = ctx->num_inputs();
    if (kind_ == Kind::kAlltoall) {
      dataInputs = 1;
      const tf::Tensor& splits = ctx->input(1);
      OP_REQUIRES_ASYNC(ctx, splits.dims() == 1,
                        absl::InvalidArgumentError("mtxcomm alltoall '" + name_ +
                                                   "': splits must be a vector, got shape " +
                                                   splits.shape().DebugString()),
                        done);
      // Checked against dimension 0 on every rank by the engine (Negotiation::check).
      if (splits.dtype() == tf::DT_INT64) {
        const auto v = splits.vec<int64_t>();
        for (int64_t j = 0; j < v.size(); ++j) e.request.splits.push_back(v(j));
      } else {
        const auto v = splits.vec<int32_t>();
        for (int64_t j = 0; j < v.size(); ++j) e.request.splits.push_back(v(j));
      }
    }
    for (int i = 0; i < dataInputs; ++i) {
      const tf::Tensor& t = ctx->input(i);
      TensorMeta m;
      OP_REQUIRES_ASYNC(
          ctx, toMtxcomm(t.dtype(), &m.dtype),
          absl::InvalidArgumentError("mtxcomm: dtype " + tf::DataTypeString(t.dtype()) +
                                     " is not supported"),
          done);
      for (int d = 0; d < t.dims(); ++d) m.shape.push_back(t.dim_size(d));
      e.request.tensors.push_back(std::move(m));
      e.inputs.push_back(t.tensor_data().data());
      keep.push_back(t);
    }
    e.allocate = [ctx](size_t i, const std::vector<int64_t>& shape, std::string* err) -> void* {
      tf::TensorShape ts;
      for (int64_t d : shape) ts.AddDim(d);
      tf::Tensor* out = nullptr;
      absl::Status s = ctx->allocate_output(static_cast<int>(i), ts, &out);
      if (!s.ok()) {
        *err = std::string(s.message());
        return nullptr;
      }
      return const_cast<char*>(out->tensor_data().data());
    };
    e.done = [ctx, done, keep = std::move(keep)](const Status& st) {
      if (!st.ok()) ctx->SetStatus(toTf(st));
      done();
    };
    // An asynchronous kernel may complete inside ComputeAsync; one meant to overlap the step's
    // remaining work (a gradient's allreduce during the backward pass) always goes to the
    // engine's thread, where those ready together fuse and the framework's thread computes on.
    e.mayRunInline = !overlap_;
    enqueue(std::move(e));
  }

 protected:
  bool onDevice_ = false;  // the GPU kernel on device memory (MtxcommDeviceOp)

 private:
  Kind kind_;
  std::string name_;
  mtxcomm_op_t op_ = MTXCOMM_SUM;
  int root_ = 0;
  bool overlap_ = false;
};

template <Kind K>
class MtxcommKindOp : public MtxcommOp {
 public:
  explicit MtxcommKindOp(tf::OpKernelConstruction* c) : MtxcommOp(c, K) {}
};

// The GPU kernel of a collective whose tensors stay in device memory.
template <Kind K>
class MtxcommDeviceOp : public MtxcommOp {
 public:
  explicit MtxcommDeviceOp(tf::OpKernelConstruction* c) : MtxcommOp(c, K) { onDevice_ = true; }
};

REGISTER_KERNEL_BUILDER(Name("MtxcommAllreduce").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedAllreduce").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("MtxcommBroadcast").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kBroadcast>);
REGISTER_KERNEL_BUILDER(Name("MtxcommAllgather").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kAllgather>);
REGISTER_KERNEL_BUILDER(Name("MtxcommReducescatter").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kReduceScatter>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedAllgather").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kAllgather>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedReducescatter").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kReduceScatter>);
REGISTER_KERNEL_BUILDER(Name("MtxcommAlltoall").Device(tf::DEVICE_CPU),
                        MtxcommKindOp<Kind::kAlltoall>);
REGISTER_KERNEL_BUILDER(Name("MtxcommJoin").Device(tf::DEVICE_CPU), MtxcommKindOp<Kind::kJoin>);

class MtxcommProcessInfoOp : public tf::OpKernel {
 public:
  explicit MtxcommProcessInfoOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("info", &info_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int value = info_ == "rank"         ? rank()
                      : info_ == "local_rank" ? localRank()
                      : info_ == "size"       ? size()
                                              : localSize();
    OP_REQUIRES(ctx, value >= 0,
                absl::FailedPreconditionError("mtxcomm has not been initialised; call hvd.init() "
                                              "before running " +
                                              info_ + "_op()"));
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  std::string info_;
};

REGISTER_KERNEL_BUILDER(Name("MtxcommProcessInfo").Device(tf::DEVICE_CPU), MtxcommProcessInfoOp);

#if MTXCOMM_TF_DEVICE_KERNELS
// A libmtxcomm built with CUDA (registered whether or not this TensorFlow has CUDA: a CPU-only
// TensorFlow has no GPU device to place them on): the collectives' GPU kernels
// hand device memory and TensorFlow's compute stream to the engine (Request::device,
// Entry::stream), which runs them on the library's device paths (nccl, cuda_ipc,
// host_staging: docs/gpus.md); no staging through the host. Alltoall and join take host memory.
REGISTER_KERNEL_BUILDER(Name("MtxcommAllreduce").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedAllreduce").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("MtxcommBroadcast").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kBroadcast>);
REGISTER_KERNEL_BUILDER(Name("MtxcommAllgather").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kAllgather>);
REGISTER_KERNEL_BUILDER(Name("MtxcommReducescatter").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kReduceScatter>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedAllgather").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kAllgather>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedReducescatter").Device(tf::DEVICE_GPU),
                        MtxcommDeviceOp<Kind::kReduceScatter>);
#elif GOOGLE_CUDA
// A TensorFlow built with CUDA over a libmtxcomm without CUDA: the GPU kernels take host
// memory (TensorFlow stages the tensors through the host).
REGISTER_KERNEL_BUILDER(
    Name("MtxcommAllreduce").Device(tf::DEVICE_GPU).HostMemory("tensor").HostMemory("output"),
    MtxcommKindOp<Kind::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedAllreduce")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("tensors")
                            .HostMemory("outputs"),
                        MtxcommKindOp<Kind::kAllreduce>);
REGISTER_KERNEL_BUILDER(
    Name("MtxcommBroadcast").Device(tf::DEVICE_GPU).HostMemory("tensor").HostMemory("output"),
    MtxcommKindOp<Kind::kBroadcast>);
REGISTER_KERNEL_BUILDER(
    Name("MtxcommAllgather").Device(tf::DEVICE_GPU).HostMemory("tensor").HostMemory("output"),
    MtxcommKindOp<Kind::kAllgather>);
REGISTER_KERNEL_BUILDER(
    Name("MtxcommReducescatter").Device(tf::DEVICE_GPU).HostMemory("tensor").HostMemory("output"),
    MtxcommKindOp<Kind::kReduceScatter>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedAllgather")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("tensors")
                            .HostMemory("outputs"),
                        MtxcommKindOp<Kind::kAllgather>);
REGISTER_KERNEL_BUILDER(Name("MtxcommGroupedReducescatter")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("tensors")
                            .HostMemory("outputs"),
                        MtxcommKindOp<Kind::kReduceScatter>);
#endif
#if GOOGLE_CUDA || MTXCOMM_TF_DEVICE_KERNELS
REGISTER_KERNEL_BUILDER(Name("MtxcommJoin").Device(tf::DEVICE_GPU).HostMemory("last_joined"),
                        MtxcommKindOp<Kind::kJoin>);
REGISTER_KERNEL_BUILDER(Name("MtxcommAlltoall")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("tensor")
                            .HostMemory("splits")
                            .HostMemory("output")
                            .HostMemory("received_splits"),
                        MtxcommKindOp<Kind::kAlltoall>);
REGISTER_KERNEL_BUILDER(Name("MtxcommProcessInfo").Device(tf::DEVICE_GPU).HostMemory("value"),
                        MtxcommProcessInfoOp);
#endif

}  // namespace
}  // namespace mtxcomm::binding
