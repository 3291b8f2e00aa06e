"""mtxcomm for TensorFlow 2: data-parallel training with a Horovod-compatible API.

``import mtxcomm.tensorflow as hvd`` runs a Horovod TensorFlow script unchanged but for the
import. Every rank holds a full model replica; gradients are averaged with an allreduce and
variables are kept identical with a broadcast from a root rank.

Ranks are the processes started by ``mpirun``/``mtxrun`` (or met through ``MTXCOMM_STORE``, see
the README). Collectives are issued by TensorFlow ops that run asynchronously on a background
engine which makes every rank run them in the same order (negotiation by tensor name, then
tensor fusion); see ``bindings/common/engine.h``.

Dtypes: int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64 (float16
and bfloat16 are reduced in float32 and rounded once). Errors raise ``tf.errors.OpError``
subclasses: ``InvalidArgumentError`` when ranks disagree on a tensor's dtype or shape (the
message names the tensor and the ranks), ``AbortedError`` when a peer died or shut down,
``DeadlineExceededError`` after ``MTXCOMM_TIMEOUT`` seconds without an answer,
``FailedPreconditionError`` before ``init()``.
"""

import atexit

import tensorflow as tf

from mtxcomm.tensorflow import _library

_ops = _library.ops
_engine = _library.engine

# Reduction ops, as the C API's mtxcomm_op_t.
Sum = 0
Product = 1
Min = 2
Max = 3
Average = 4
Adasum = 5  # not provided: passing it raises NotImplementedError (never a silent average)

_OP_NAMES = {Sum: "Sum", Product: "Product", Min: "Min", Max: "Max", Average: "Average"}


# ---- basics --------------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Starts mtxcomm on every rank (collective): creates the world communicator from the
    environment (``mpirun``/``mtxrun``, or ``MTXCOMM_RANK``/``MTXCOMM_SIZE``/``MTXCOMM_STORE``;
    a lone process is a job of one rank) and the background engine. Calling it again is a
    no-op. ``comm`` and ``process_sets`` (Horovod's) are accepted only as None.

    Raises RuntimeError with the library's message (bad MTXCOMM_* value, unreachable peers).
    """
    if comm is not None or process_sets is not None:
        raise NotImplementedError("mtxcomm.tensorflow.init: comm and process_sets are not "
                                  "supported; every rank of the job is one communicator")
    _engine.init()
    _size_thread_pools()


def _log_info(msg):
    import os
    if os.environ.get("MTXCOMM_LOG_LEVEL", "").upper() in ("INFO", "DEBUG", "TRACE"):
        import sys
        sys.stderr.write("[mtxcomm rank %d] INFO %s\n" % (_engine.rank(), msg))


_pools_sized = False


def _size_thread_pools():
    """TensorFlow's intra-op and inter-op pools sized to this rank's share of its node's cores
    (mtxcomm_comm_cpu_share; the README's "Placement"), so that the ranks of a node do not run
    more busy threads than it has cores. A value the user set wins: TF_NUM_INTRAOP_THREADS /
    TF_NUM_INTEROP_THREADS in the environment, or tf.config.threading called before init().
    TensorFlow fixes its pools when it runs its first op: after that they stay as they are (one
    warning says so; mtxrun sets the variables before TensorFlow starts)."""
    global _pools_sized
    import os
    if _pools_sized:
        return
    _pools_sized = True
    share = int(_engine.cpu_share())
    if share < 1:
        return
    threading = tf.config.threading
    done = []
    for env, getter, setter, value in (
            ("TF_NUM_INTRAOP_THREADS", threading.get_intra_op_parallelism_threads,
             threading.set_intra_op_parallelism_threads, share),
            ("TF_NUM_INTEROP_THREADS", threading.get_inter_op_parallelism_threads,
             threading.set_inter_op_parallelism_threads, share)):
        if os.environ.get(env) or getter() != 0:
            _log_info("placement: %s kept as the user set it (%s)"
                      % (env, os.environ.get(env) or getter()))
            continue
        try:
            setter(value)
            done.append("%s=%d" % (env, value))
        except RuntimeError:
            import warnings
            warnings.warn("mtxcomm.tensorflow: TensorFlow's thread pools were created before "
                          "init(), so they keep their size (every core of the node on every "
                          "rank); call init() before running any TensorFlow op, or launch with "
                          "mtxrun, which sets %s=%d" % (env, value))
            return
    if done:
        _log_info("placement: this rank's share is %d core(s): %s" % (share, ", ".join(done)))


def shutdown():
    """Stops the engine on every rank: requests still waiting, here or on other ranks, fail
    with an error naming the rank that shut down. Idempotent; also run at exit."""
    _engine.shutdown()


atexit.register(shutdown)


def is_initialized():
    """True between init() and shutdown() (and until a communication failure)."""
    return bool(_engine.is_initialized())


def _check_init(what):
    if _engine.rank() < 0:
        raise ValueError("mtxcomm.tensorflow.%s(): mtxcomm has not been initialised; call "
                         "hvd.init() first" % what)


def rank():
    """This process's rank in [0, size())."""
    _check_init("rank")
    return _engine.rank()


def size():
    """The number of ranks."""
    _check_init("size")
    return _engine.size()


def local_rank():
    """This process's index among the ranks on its node (ordered by rank)."""
    _check_init("local_rank")
    return _engine.local_rank()


def local_size():
    """The number of ranks on this node."""
    _check_init("local_size")
    return _engine.local_size()


def cross_rank():
    """Index of this node among the nodes (ranks are assumed packed by node, as mpirun does)."""
    return rank() // local_size()


def cross_size():
    """Number of nodes (ranks packed by node)."""
    return size() // local_size()


def mpi_threads_supported():
    return True


def cpu_share():
    """This rank's share of its node's cores: the threads its work should use."""
    _check_init("cpu_share")
    return int(_engine.cpu_share())


def join():
    """Tells the other ranks that this rank has no more data (Horovod's join): until every rank
    has joined, the allreduces the others submit proceed with this rank contributing zeros
    (reducescatter: zeros; allgather: no rows; broadcast: received and dropped, a joined root
    is an error). Average still divides by size(): to average over the ranks that contributed,
    use op=Sum and divide by their number (for instance an allreduce of 1.0 per active rank).
    Returns, on every rank, the last rank to join (an int eagerly, an int32 tensor in a graph).
    Collective: every rank must call it."""
    _check_init("join")
    last = _ops.mtxcomm_join()
    return int(last.numpy()) if tf.executing_eagerly() else last


def _collective_count():
    """Library collectives this rank's engine has run for submitted tensors (tests)."""
    return int(_engine.collective_count())


# ---- compression (Horovod's Compression.none / Compression.fp16) ---------------------------

class _NoneCompressor:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compressor:
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """Gradient compression for the wire: ``none`` or ``fp16`` (float tensors sent as float16)."""
    none = _NoneCompressor
    fp16 = _FP16Compressor


# ---- ops -----------------------------------------------------------------------------------

def _resolve_op(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError("%s: give either op or the deprecated average, not both" % what)
        return Average if average else Sum
    if op is not None and op == Adasum:
        raise NotImplementedError("%s: Adasum is not provided by mtxcomm" % what)
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise ValueError("%s: op must be one of hvd.Sum, hvd.Average, hvd.Min, hvd.Max, "
                         "hvd.Product, got %r" % (what, op))
    return op


def _tensor_name(name):
    return name or ""


def _scale(tensor, factor):
    if factor == 1.0:
        return tensor
    if not tensor.dtype.is_floating:
        raise ValueError("prescale_factor/postscale_factor apply to floating-point tensors, "
                         "got %s" % tensor.dtype.name)
    return tensor * tf.cast(factor, tensor.dtype)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
    """Reduces ``tensor`` over all ranks; every rank gets the result.

    Args:
      tensor: tf.Tensor or tf.Variable of any shape, or tf.IndexedSlices (then values and
        indices are allgathered and, for Average, values divided by size(); only Sum and
        Average).
      op: hvd.Average (default), hvd.Sum, hvd.Min, hvd.Max or hvd.Product. Integer Average
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
            raise NotImplementedError("allreduce of IndexedSlices supports Sum and Average, "
                                      "got %s" % _OP_NAMES[op])
        values = allgather(_scale(tensor.values, prescale_factor),
                           name=None if name is None else name + "/values")
        indices = allgather(tensor.indices, name=None if name is None else name + "/indices")
        if op == Average:
            values = values / tf.cast(size(), values.dtype)
        return tf.IndexedSlices(_scale(values, postscale_factor), indices,
                                dense_shape=tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(_scale(tensor, prescale_factor))
    reduced = _ops.mtxcomm_allreduce(compressed, reduce_op=op, tensor_name=_tensor_name(name))
    return _scale(compression.decompress(reduced, ctx), postscale_factor)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, name=None, process_set=None):
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
            out[i] = allreduce(t, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor,
                               name=None if name is None else "%s/%d" % (name, i))
    if dense_idx:
        comp = [compression.compress(_scale(tf.convert_to_tensor(tensors[i]), prescale_factor))
                for i in dense_idx]
        reduced = _ops.mtxcomm_grouped_allreduce([c[0] for c in comp], reduce_op=op,
                                                 tensor_name=_tensor_name(name))
        for i, r, c in zip(dense_idx, reduced, comp):
            out[i] = _scale(compression.decompress(r, c[1]), postscale_factor)
    return out


def broadcast(tensor, root_rank, name=None, process_set=None, ignore_name_scope=False):
    """Every rank gets root_rank's ``tensor`` (same shape and dtype on every rank)."""
    if process_set is not None:
        raise NotImplementedError("broadcast: process sets are not supported")
    return _ops.mtxcomm_broadcast(tf.convert_to_tensor(tensor), root_rank=int(root_rank),
                                  tensor_name=_tensor_name(name))


def allgather(tensor, name=None, process_set=None, ignore_name_scope=False):
    """Concatenates every rank's ``tensor`` along dimension 0, in rank order. Dimension 0 may
    differ between ranks, the other dimensions may not. Rank >= 1."""
    if process_set is not None:
        raise NotImplementedError("allgather: process sets are not supported")
    return _ops.mtxcomm_allgather(tf.convert_to_tensor(tensor), tensor_name=_tensor_name(name))


def reducescatter(tensor, op=Average, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` (same shape [d0, ...] on every rank) over ranks, then rank r keeps its
    rows of dimension 0: d0 // size() rows, one more on the first d0 % size() ranks.
    op: hvd.Average (default), Sum, Min, Max, Product."""
    if process_set is not None:
        raise NotImplementedError("reducescatter: process sets are not supported")
    op = _resolve_op(op, None, "reducescatter")
    tensor = _scale(tf.convert_to_tensor(tensor), prescale_factor)
    out = _ops.mtxcomm_reducescatter(tensor, reduce_op=op, tensor_name=_tensor_name(name))
    return _scale(out, postscale_factor)


def broadcast_object(obj, root_rank=0, name=None):
    """Every rank gets root_rank's picklable Python object."""
    import pickle
    import numpy as np
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if rank() == root_rank else \
        np.zeros([0], dtype=np.uint8)
    n = broadcast(tf.constant([payload.size], dtype=tf.int64), root_rank,
                  name=None if name is None else name + "/size")
    buf = np.zeros([int(n.numpy()[0])], dtype=np.uint8)
    if rank() == root_rank:
        buf = payload
    data = broadcast(tf.constant(buf), root_rank, name=name)
    return pickle.loads(data.numpy().tobytes())


def broadcast_variables(variables, root_rank):
    """Assigns root_rank's value to each variable (tf.Variable or keras.Variable), on every
    rank, in list order. The variables must be in the same order on every rank."""
    for v in variables:
        v.assign(broadcast(tf.convert_to_tensor(v), root_rank))


# ---- gradients -----------------------------------------------------------------------------

def _allreduce_sum(t):
    return _ops.mtxcomm_allreduce(t, reduce_op=Sum)


@tf.RegisterGradient("MtxcommAllreduce")
def _allreduce_grad(op, grad):
    """d/dx_r of the distributed loss sum_q L_q(y): the upstream gradients of every rank are
    summed (Sum) or averaged (Average); Min/Max route them to the ranks holding the extremum,
    Product scales them by y / x_r."""
    reduce_op = op.get_attr("reduce_op")
    if reduce_op in (Sum, Average):
        return _ops.mtxcomm_allreduce(grad, reduce_op=reduce_op)
    x, y = op.inputs[0], op.outputs[0]
    if reduce_op in (Min, Max):
        return _allreduce_sum(grad) * tf.cast(tf.equal(x, y), grad.dtype)
    return tf.math.divide_no_nan(_allreduce_sum(grad * y), x)


@tf.RegisterGradient("MtxcommGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Sum, Average):
        raise NotImplementedError("the gradient of grouped_allreduce supports Sum and Average")
    grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
             for g, x in zip(grads, op.inputs)]
    return _ops.mtxcomm_grouped_allreduce(grads, reduce_op=reduce_op)


@tf.RegisterGradient("MtxcommBroadcast")
def _broadcast_grad(op, grad):
    """Only the root's input reaches the output: it gets the sum of every rank's gradient."""
    reduced = _allreduce_sum(grad)
    if _engine.rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


@tf.RegisterGradient("MtxcommAllgather")
def _allgather_grad(op, grad):
    """Sum the gradients of the gathered tensor, then keep this rank's rows."""
    grad = _allreduce_sum(grad)
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[0:1]
    all_rows = _ops.mtxcomm_allgather(rows)
    splits = tf.split(grad, all_rows, axis=0, num=_engine.size())
    return splits[_engine.rank()]


@tf.RegisterGradient("MtxcommReducescatter")
def _reducescatter_grad(op, grad):
    """Each rank's input reached every rank's output rows: gather them back."""
    gathered = _ops.mtxcomm_allgather(grad)
    if op.get_attr("reduce_op") == Average:
        gathered = gathered / tf.cast(_engine.size(), gathered.dtype)
    elif op.get_attr("reduce_op") != Sum:
        raise NotImplementedError("the gradient of reducescatter supports Sum and Average")
    return gathered


# ---- gradient averaging for training -------------------------------------------------------

def _allreduce_gradients(grads, op=Average, sparse_as_dense=False,
                         compression=Compression.none, scale=None, name=None):
    """Averages (op) a list of gradients with one grouped allreduce. None passes through;
    IndexedSlices are allgathered (or densified with sparse_as_dense). ``scale`` multiplies
    every gradient first (transparent mode weights uneven batch shares with it)."""
    grads = list(grads)
    out = list(grads)
    dense_idx = []
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                if scale is not None:
                    g = tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices,
                                         g.dense_shape)
                out[i] = allreduce(g, op=op)
                continue
        if scale is not None:
            g = g * tf.cast(scale, g.dtype)
        dense_idx.append(i)
        dense.append(g)
    if dense:
        if tf.executing_eagerly():
            # Eagerly every op waits for its result: one request for all of them.
            reduced = grouped_allreduce(dense, op=op, compression=compression, name=name)
        else:
            # In a graph (tf.function, Keras' train_step) one op per gradient, not chained: each
            # starts as soon as its gradient exists, so the allreduce of a late layer overlaps
            # the backward pass of the earlier ones; the engine fuses those ready together.
            reduced = [allreduce(g, op=op, compression=compression,
                                 name=None if name is None else "%s/%d" % (name, k))
                       for k, g in enumerate(dense)]
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


class _DistributedGradientTape:
    """Methods mixed into a copy of the user's GradientTape."""

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super(self._mtx_base, self).gradient(target, sources, output_gradients,
                                                     **kwargs)
        flat = tf.nest.flatten(grads)
        reduced = _allreduce_gradients(flat, op=self._mtx_op,
                                       sparse_as_dense=self._mtx_sparse_as_dense,
                                       compression=self._mtx_compression)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None):
    """Returns a tape whose gradient() averages (op) the gradients over ranks: one grouped
    allreduce per call; None gradients pass through; IndexedSlices are allgathered, or
    densified first with sparse_as_dense=True."""
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError("DistributedGradientTape: gradient_predivide_factor is not "
                                  "supported; use allreduce's prescale_factor/postscale_factor")
    if process_set is not None or groups is not None:
        raise NotImplementedError("DistributedGradientTape: process sets and groups are not "
                                  "supported (all gradients go in one group)")
    base = type(gradtape)
    cls = type(base.__name__, (base,), {"gradient": _DistributedGradientTape.gradient,
                                        "_mtx_base": None})
    cls._mtx_base = cls
    tape = base.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._mtx_op = _resolve_op(op, None, "DistributedGradientTape")
    tape._mtx_sparse_as_dense = sparse_as_dense
    tape._mtx_compression = compression
    return tape


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "Sum", "Average", "Min", "Max", "Product", "Compression",
    "allreduce", "grouped_allreduce", "broadcast", "allgather", "reducescatter",
    "broadcast_variables", "broadcast_object", "DistributedGradientTape", "join", "cpu_share",
]
