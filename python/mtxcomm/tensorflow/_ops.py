"""mtxcomm.tensorflow's collective ops: allreduce, grouped_allreduce, broadcast, broadcast_,
allgather, grouped_allgather, reducescatter, grouped_reducescatter, alltoall, join, the process
facts as graph ops (rank_op...), the reduction ops (Sum, Average...) and the gradients of the
collectives, over the op library that ``_library.py`` loads.

Each function converts its input to a tensor and calls an op of the library
(``bindings/tensorflow/tf_ops.cc``), which hands it to the engine; collectives made inside
``_overlapping()`` (a step's gradient allreduces, the gradients of collectives) overlap the rest
of the step. Errors are ``tf.errors.OpError`` subclasses (see the package's docstring).
"""

import contextlib
import functools
import threading

import tensorflow as tf

from mtxcomm.tensorflow import _library
from mtxcomm.tensorflow.basics import _check_init, size
from mtxcomm.tensorflow.compression import Compression

_engine = _library.engine
_OVERLAP = threading.local()
# The op wrappers whose ops take the attr overlap (bindings/tensorflow/tf_ops.cc).
_OVERLAP_OPS = frozenset(
    (
        "mtxcomm_allreduce",
        "mtxcomm_grouped_allreduce",
        "mtxcomm_broadcast",
        "mtxcomm_allgather",
        "mtxcomm_grouped_allgather",
        "mtxcomm_reducescatter",
        "mtxcomm_grouped_reducescatter",
        "mtxcomm_alltoall",
    )
)


@contextlib.contextmanager
def _overlapping():
    """Collectives traced inside (a step's gradient allreduces, the gradients of collectives)
    overlap the rest of the step: they get overlap=True and always run on the engine's thread,
    where those ready together fuse while the framework's thread computes on. Outside it a
    small collective whose peers are all there runs on the calling thread (no hand-over). Eager
    calls are left as they are (the caller waits for each)."""
    before = getattr(_OVERLAP, "on", False)
    _OVERLAP.on = before or not tf.executing_eagerly()
    try:
        yield
    finally:
        _OVERLAP.on = before


class _OpWrappers:
    """The op library's wrappers, with overlap=True on the collectives made in _overlapping()."""

    def __getattr__(self, name):
        fn = getattr(_library.ops, name)
        if name in _OVERLAP_OPS and getattr(_OVERLAP, "on", False):
            return functools.partial(fn, overlap=True)
        return fn


_wrappers = _OpWrappers()


def _in_backward(grad_fn):
    """A registered gradient function: its collectives overlap the backward pass."""

    @functools.wraps(grad_fn)
    def wrapped(*args, **kwargs):
        with _overlapping():
            return grad_fn(*args, **kwargs)

    return wrapped


# Reduction ops, as the C API's mtxcomm_op_t.
Sum = 0
Product = 1
Min = 2
Max = 3
Average = 4
# Adaptive summation (Maleki et al., MLSys 2021), the library's MTXCOMM_ADASUM: allreduce of
# floating-point tensors only, each tensor combined on its own (never fused), no gradient.
Adasum = 5

_OP_NAMES = {
    Sum: "Sum",
    Product: "Product",
    Min: "Min",
    Max: "Max",
    Average: "Average",
    Adasum: "Adasum",
}


# ---- ops -----------------------------------------------------------------------------------


def _resolve_op(op, average, what, adasum=True):
    if average is not None:
        if op is not None:
            raise ValueError("%s: give either op or the deprecated average, not both" % what)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise ValueError(
            "%s: op must be one of hvd.Sum, hvd.Average, hvd.Min, hvd.Max, "
            "hvd.Product, hvd.Adasum, got %r" % (what, op)
        )
    if op == Adasum and not adasum:
        raise NotImplementedError("%s: Adasum is an allreduce op only" % what)
    return op


def _tensor_name(name):
    return name or ""


def _is_one(factor):
    return isinstance(factor, (int, float)) and float(factor) == 1.0


def _scale(tensor, factor):
    """tensor * factor as Horovod computes it: in float64 for integer tensors (the product
    truncated toward zero), in float32 for float16 and bfloat16, in the tensor's own dtype for
    float32 and float64. Booleans cannot be scaled."""
    if _is_one(factor):
        return tensor
    dtype = tensor.dtype
    if dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * tf.cast(factor, tf.float64), dtype)
    if dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(tensor, tf.float32) * tf.cast(factor, tf.float32), dtype)
    if dtype.is_floating:
        return tensor * tf.cast(factor, dtype)
    raise ValueError(
        "prescale_factor/postscale_factor apply to numeric tensors, got %s" % dtype.name
    )


def allreduce(
    tensor,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=None,
    ignore_name_scope=False,
):
    """Reduces ``tensor`` over all ranks; every rank gets the result.

    Args:
      tensor: tf.Tensor or tf.Variable of any shape, or tf.IndexedSlices (then values and
        indices are allgathered and, for Average, values divided by size(); only Sum and
        Average).
      op: hvd.Average (default), hvd.Sum, hvd.Min, hvd.Max, hvd.Product, or hvd.Adasum
        (floating tensors; the library's adaptive summation, docs/algorithms.md#adasum; no
        gradient). Integer Average
        divides by size() truncating toward zero.
      prescale_factor, postscale_factor: multiply (floating tensors) before / after.
      name: the tensor's name for negotiation: the same call must have the same name on every
        rank (default: the op's node name in a graph, or the op type in eager mode; calls of one
        name pair up in order).
      compression: Compression.none or Compression.fp16.
    Returns: a tensor of the same shape and dtype (IndexedSlices for IndexedSlices).
    Raises: tf.errors.InvalidArgumentError when ranks pass different shapes or dtypes.
    """
    if process_set is not None:
        raise NotImplementedError("allreduce: process sets are not supported")
    op = _resolve_op(op, average, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Sum, Average):
            raise NotImplementedError(
                "allreduce of IndexedSlices supports Sum and Average, "
                "got %s (densify the gradients first: "
                "sparse_as_dense=True)" % _OP_NAMES[op]
            )
        if not (_is_one(prescale_factor) and _is_one(postscale_factor)):
            raise NotImplementedError(
                "allreduce of IndexedSlices does not support prescale_factor or postscale_factor"
            )
        values = allgather(tensor.values, name=None if name is None else name + "/values")
        indices = allgather(tensor.indices, name=None if name is None else name + "/indices")
        if op == Average:
            values = values / tf.cast(size(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(_scale(tensor, prescale_factor))
    reduced = _wrappers.mtxcomm_allreduce(compressed, reduce_op=op, tensor_name=_tensor_name(name))
    return _scale(compression.decompress(reduced, ctx), postscale_factor)


def grouped_allreduce(
    tensors,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=None,
):
    """Allreduces a list of tensors (any dtypes and shapes) as one request: one negotiation,
    and the tensors of one dtype fused into one collective, in list order on every rank.
    Returns the list of reduced tensors. IndexedSlices are reduced as in allreduce()."""
    if process_set is not None:
        raise NotImplementedError("grouped_allreduce: process sets are not supported")
    op = _resolve_op(op, average, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out = [None] * len(tensors)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = allreduce(
                t,
                op=op,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                name=None if name is None else "%s/%d" % (name, i),
            )
    if dense_idx:
        comp = [
            compression.compress(_scale(tf.convert_to_tensor(tensors[i]), prescale_factor))
            for i in dense_idx
        ]
        reduced = _wrappers.mtxcomm_grouped_allreduce(
            [c[0] for c in comp], reduce_op=op, tensor_name=_tensor_name(name)
        )
        for i, r, c in zip(dense_idx, reduced, comp):
            out[i] = _scale(compression.decompress(r, c[1]), postscale_factor)
    return out


def broadcast(tensor, root_rank, name=None, process_set=None, ignore_name_scope=False):
    """Every rank gets root_rank's ``tensor`` (same shape and dtype on every rank)."""
    _no_process_set(process_set, "broadcast")
    return _wrappers.mtxcomm_broadcast(
        tf.convert_to_tensor(tensor), root_rank=int(root_rank), tensor_name=_tensor_name(name)
    )


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In-place broadcast: assigns root_rank's value to each variable of ``variables`` (resource
    or reference variables, the same list on every rank) and returns their new values (tensors,
    in list order). One broadcast per variable, issued together."""
    _no_process_set(process_set, "broadcast_")
    variables = list(variables)
    out = []
    for i, v in enumerate(variables):
        value = broadcast(
            tf.convert_to_tensor(v), root_rank, name=None if name is None else "%s/%d" % (name, i)
        )
        assigned = v.assign(value)
        if tf.executing_eagerly():
            out.append(tf.convert_to_tensor(v))
        else:
            with tf.control_dependencies([assigned]):
                out.append(tf.identity(v))
    return out


def allgather(tensor, name=None, process_set=None, ignore_name_scope=False):
    """Concatenates every rank's ``tensor`` along dimension 0, in rank order. Dimension 0 may
    differ between ranks, the other dimensions may not. Rank >= 1."""
    _no_process_set(process_set, "allgather")
    return _wrappers.mtxcomm_allgather(tf.convert_to_tensor(tensor), tensor_name=_tensor_name(name))


def grouped_allgather(tensors, name=None, process_set=None, ignore_name_scope=False):
    """allgather() of every tensor of the list (dtypes may differ), negotiated as one request;
    returns the list of gathered tensors."""
    _no_process_set(process_set, "grouped_allgather")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    return list(_wrappers.mtxcomm_grouped_allgather(tensors, tensor_name=_tensor_name(name)))


def reducescatter(
    tensor,
    op=Average,
    name=None,
    process_set=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    ignore_name_scope=False,
):
    """Reduces ``tensor`` (same shape [d0, ...] on every rank) over ranks, then rank r keeps its
    rows of dimension 0: d0 // size() rows, one more on the first d0 % size() ranks.
    op: hvd.Average (default), Sum, Min, Max, Product."""
    _no_process_set(process_set, "reducescatter")
    op = _resolve_op(op, None, "reducescatter", adasum=False)
    tensor = _scale(tf.convert_to_tensor(tensor), prescale_factor)
    out = _wrappers.mtxcomm_reducescatter(tensor, reduce_op=op, tensor_name=_tensor_name(name))
    return _scale(out, postscale_factor)


def grouped_reducescatter(
    tensors,
    op=Average,
    name=None,
    process_set=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    ignore_name_scope=False,
):
    """reducescatter() of every tensor of the list, negotiated as one request; returns the list
    of this rank's shares."""
    _no_process_set(process_set, "grouped_reducescatter")
    op = _resolve_op(op, None, "grouped_reducescatter", adasum=False)
    tensors = [_scale(tf.convert_to_tensor(t), prescale_factor) for t in tensors]
    if not tensors:
        return []
    out = _wrappers.mtxcomm_grouped_reducescatter(
        tensors, reduce_op=op, tensor_name=_tensor_name(name)
    )
    return [_scale(t, postscale_factor) for t in out]


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Scatters the rows (dimension 0) of ``tensor`` to the ranks and gathers what every rank
    sent to this one, in rank order (mtxcomm_alltoallv).

    Args:
      tensor: [d0, ...], any supported dtype; the dimensions after the first must agree on
        every rank, d0 may differ.
      splits: integer vector (int32 or int64, never truncated) of size() entries (rows sent
        to each rank, summing to d0), or None to
        send d0 / size() rows to every rank (d0 must then be a multiple of size()).
    Returns: the gathered tensor [sum of rows received, ...]; with splits given, the pair
      (gathered tensor, received_splits), received_splits an int32 vector of the rows received
      from each rank.
    Raises: tf.errors.InvalidArgumentError for splits that do not match d0 (on every rank,
      naming the rank); FailedPreconditionError when the ranks disagree on dtype or the other
      dimensions.
    """
    _no_process_set(process_set, "alltoall")
    tensor = tf.convert_to_tensor(tensor)
    if splits is None:
        s = tf.zeros([0], tf.int32)
    else:
        s = tf.convert_to_tensor(splits)
        if not s.dtype.is_integer or s.dtype == tf.uint64:
            raise ValueError(
                "alltoall: splits must be integers (int8 to int64), got %s" % s.dtype.name
            )
        if s.dtype not in (tf.int32, tf.int64):
            s = tf.cast(s, tf.int64)  # exact: every other integer type fits
    out, received = _wrappers.mtxcomm_alltoall(tensor, s, tensor_name=_tensor_name(name))
    return out if splits is None else (out, received)


def _no_process_set(process_set, what):
    if process_set is not None:
        raise NotImplementedError(
            "%s: process sets are not supported (every rank of the job is one communicator)" % what
        )


# ---- process facts as ops (evaluated when the graph runs) --------------------------------


def rank_op(name=None):
    """An int32 scalar op: this process's rank, read when the op runs."""
    return _wrappers.mtxcomm_process_info(info="rank", name=name)


def local_rank_op(name=None):
    """An int32 scalar op: this process's rank on its node, read when the op runs."""
    return _wrappers.mtxcomm_process_info(info="local_rank", name=name)


def size_op(process_set_id=0, name=None):
    """An int32 scalar op: the number of ranks, read when the op runs."""
    if process_set_id != 0:
        raise NotImplementedError("size_op: process sets are not supported")
    return _wrappers.mtxcomm_process_info(info="size", name=name)


def local_size_op(name=None):
    """An int32 scalar op: the number of ranks on this node, read when the op runs."""
    return _wrappers.mtxcomm_process_info(info="local_size", name=name)


# ---- join ----------------------------------------------------------------------------------


def join():
    """Tells the other ranks that this rank has no more data (Horovod's join): until every rank
    has joined, the allreduces the others submit proceed with this rank contributing zeros
    (reducescatter: zeros; allgather: no rows; broadcast: received and dropped, a joined root
    is an error). Average still divides by size(): to average over the ranks that contributed,
    use op=Sum and divide by their number (for instance an allreduce of 1.0 per active rank).
    Returns, on every rank, the last rank to join (an int eagerly, an int32 tensor in a graph).
    Collective: every rank must call it."""
    _check_init("join")
    last = _wrappers.mtxcomm_join()
    return int(last.numpy()) if tf.executing_eagerly() else last


tf.no_gradient("MtxcommProcessInfo")
tf.no_gradient("MtxcommJoin")


# ---- gradients -----------------------------------------------------------------------------
# As Horovod defines them (the reference for scripts moved from it): the gradient flowing into
# a collective from every rank is averaged, except that an allreduce passes its own op on, and
# a Sum reduce-scatter scales the gathered gradient by size().


def _allreduce_sum(t):
    return _wrappers.mtxcomm_allreduce(t, reduce_op=Sum)


def _allreduce_average(t):
    return _wrappers.mtxcomm_allreduce(t, reduce_op=Average)


@tf.RegisterGradient("MtxcommAllreduce")
@_in_backward
def _allreduce_grad(op, grad):
    """d/dx_r of the distributed loss sum_q L_q(y): the upstream gradients of every rank are
    summed (Sum) or averaged (Average); Min/Max route them to the ranks holding the extremum,
    Product scales them by y / x_r."""
    reduce_op = op.get_attr("reduce_op")
    if reduce_op in (Sum, Average):
        return _wrappers.mtxcomm_allreduce(grad, reduce_op=reduce_op)
    if reduce_op == Adasum:
        raise NotImplementedError("the gradient of an allreduce with op=Adasum is not provided")
    x, y = op.inputs[0], op.outputs[0]
    if reduce_op in (Min, Max):
        return _allreduce_sum(grad) * tf.cast(tf.equal(x, y), grad.dtype)
    return tf.math.divide_no_nan(_allreduce_sum(grad * y), x)


@tf.RegisterGradient("MtxcommGroupedAllreduce")
@_in_backward
def _grouped_allreduce_grad(op, *grads):
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Sum, Average):
        raise NotImplementedError("the gradient of grouped_allreduce supports Sum and Average")
    grads = [
        tf.zeros_like(x) if g is None else tf.convert_to_tensor(g) for g, x in zip(grads, op.inputs)
    ]
    return _wrappers.mtxcomm_grouped_allreduce(grads, reduce_op=reduce_op)


@tf.RegisterGradient("MtxcommBroadcast")
@_in_backward
def _broadcast_grad(op, grad):
    """Only the root's input reaches the output: it gets the average of every rank's
    gradient, the other ranks zero."""
    reduced = _allreduce_average(grad)
    if _engine.rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


def _own_rows(grad, x):
    """This rank's rows of a gradient gathered along dimension 0 (x: this rank's input)."""
    rows = tf.shape(x, out_type=tf.int64)[0:1]
    all_rows = _wrappers.mtxcomm_allgather(rows)
    return tf.split(grad, all_rows, axis=0, num=_engine.size())[_engine.rank()]


@tf.RegisterGradient("MtxcommAllgather")
@_in_backward
def _allgather_grad(op, grad):
    """Average the gradients of the gathered tensor over ranks, then keep this rank's rows."""
    return _own_rows(_allreduce_average(grad), op.inputs[0])


@tf.RegisterGradient("MtxcommGroupedAllgather")
@_in_backward
def _grouped_allgather_grad(op, *grads):
    out = []
    for g, x, y in zip(grads, op.inputs, op.outputs):
        g = tf.zeros_like(y) if g is None else tf.convert_to_tensor(g)
        out.append(_own_rows(_allreduce_average(g), x))
    return out


def _reducescatter_input_grad(grad, reduce_op):
    if reduce_op not in (Sum, Average):
        raise NotImplementedError("the gradient of reducescatter supports Sum and Average")
    if reduce_op == Sum:
        grad = grad * tf.cast(_engine.size(), grad.dtype)
    return _wrappers.mtxcomm_allgather(grad)


@tf.RegisterGradient("MtxcommReducescatter")
@_in_backward
def _reducescatter_grad(op, grad):
    """Each rank's input reached every rank's output rows: gather them back (times size() for
    Sum)."""
    return _reducescatter_input_grad(grad, op.get_attr("reduce_op"))


@tf.RegisterGradient("MtxcommGroupedReducescatter")
@_in_backward
def _grouped_reducescatter_grad(op, *grads):
    reduce_op = op.get_attr("reduce_op")
    out = []
    for g, y in zip(grads, op.outputs):
        g = tf.zeros_like(y) if g is None else tf.convert_to_tensor(g)
        out.append(_reducescatter_input_grad(g, reduce_op))
    return out


@tf.RegisterGradient("MtxcommAlltoall")
@_in_backward
def _alltoall_grad(op, grad, _received_splits_grad):
    """The rows go back where they came from: an alltoall of the gradient with the received
    splits."""
    if grad is None:
        grad = tf.zeros_like(op.outputs[0])
    back, _ = _wrappers.mtxcomm_alltoall(tf.convert_to_tensor(grad), op.outputs[1])
    return [back, None]
