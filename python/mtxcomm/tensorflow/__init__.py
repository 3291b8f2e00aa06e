"""mtxcomm for TensorFlow 2: data-parallel training with a Horovod-compatible API.

``import mtxcomm.tensorflow as hvd`` runs a Horovod TensorFlow script unchanged but for the
import. Every rank holds a full model replica; gradients are averaged with an allreduce and
variables are kept identical with a broadcast from a root rank.

Ranks are the processes started by ``mpirun``/``mtxrun`` (or met through ``MTXCOMM_STORE``, see
the README). Collectives are issued by TensorFlow ops that run asynchronously on a background
engine which makes every rank run them in the same order (negotiation by tensor name, then
tensor fusion); see ``bindings/common/engine.h``.

Dtypes: int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32,
float64, bool (float16 and bfloat16 are reduced in float32 and rounded once; bool reductions are
logical: Sum and Max are OR, Product and Min are AND, Average is an error). Errors raise
``tf.errors.OpError`` subclasses, as Horovod's: ``FailedPreconditionError`` when ranks disagree
on a tensor's kind, op, root, dtype or shape (the message names the tensor and the ranks),
``InvalidArgumentError`` for a request wrong in itself (alltoall splits that do not add up, a
root out of range), ``AbortedError`` when a peer died or shut down,
``DeadlineExceededError`` after ``MTXCOMM_TIMEOUT`` seconds without an answer,
``FailedPreconditionError`` before ``init()``.
"""

import atexit
import contextlib
import functools
import threading

import tensorflow as tf

import mtxcomm as _mtxcomm
from mtxcomm.tensorflow import _library

_engine = _library.engine
_OVERLAP = threading.local()
# The op wrappers whose ops take the attr overlap (bindings/tensorflow/tf_ops.cc).
_OVERLAP_OPS = frozenset(("mtxcomm_allreduce", "mtxcomm_grouped_allreduce", "mtxcomm_broadcast",
                          "mtxcomm_allgather", "mtxcomm_grouped_allgather",
                          "mtxcomm_reducescatter", "mtxcomm_grouped_reducescatter",
                          "mtxcomm_alltoall"))


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


class _Ops:
    """The op library's wrappers, with overlap=True on the collectives made in _overlapping()."""

    def __getattr__(self, name):
        fn = getattr(_library.ops, name)
        if name in _OVERLAP_OPS and getattr(_OVERLAP, "on", False):
            return functools.partial(fn, overlap=True)
        return fn


_ops = _Ops()


def _in_backward(grad_fn):
    """A registered gradient function: its collectives overlap the backward pass."""
    @functools.wraps(grad_fn)
    def wrapped(*args, **kwargs):
        with _overlapping():
            return grad_fn(*args, **kwargs)
    return wrapped


_mtxcomm._end_job_on_uncaught_exception()

# Reduction ops, as the C API's mtxcomm_op_t.
Sum = 0
Product = 1
Min = 2
Max = 3
Average = 4
# Adaptive summation (Maleki et al., MLSys 2021), the library's MTXCOMM_ADASUM: allreduce of
# floating-point tensors only, each tensor combined on its own (never fused), no gradient.
Adasum = 5

_OP_NAMES = {Sum: "Sum", Product: "Product", Min: "Min", Max: "Max", Average: "Average",
             Adasum: "Adasum"}


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
    with an error naming the rank that shut down. Idempotent; also run at exit. Raises where
    the ranks disagreed on a call no later call checked (``mtxcomm.shutdown``); at exit that
    error is written to standard error and the process exits with status 1."""
    _mtxcomm._shutdown_or_exit(_engine.shutdown, at_exit=False)


atexit.register(lambda: _mtxcomm._shutdown_or_exit(_engine.shutdown, at_exit=True))


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


def _inline_cycle_count():
    """Engine cycles this rank's submitting threads ran themselves (tests, profiling)."""
    return int(_engine.inline_cycle_count())


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

def _resolve_op(op, average, what, adasum=True):
    if average is not None:
        if op is not None:
            raise ValueError("%s: give either op or the deprecated average, not both" % what)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise ValueError("%s: op must be one of hvd.Sum, hvd.Average, hvd.Min, hvd.Max, "
                         "hvd.Product, hvd.Adasum, got %r" % (what, op))
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
    raise ValueError("prescale_factor/postscale_factor apply to numeric tensors, got %s"
                     % dtype.name)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
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
            raise NotImplementedError("allreduce of IndexedSlices supports Sum and Average, "
                                      "got %s (densify the gradients first: "
                                      "sparse_as_dense=True)" % _OP_NAMES[op])
        if not (_is_one(prescale_factor) and _is_one(postscale_factor)):
            raise NotImplementedError("allreduce of IndexedSlices does not support "
                                      "prescale_factor or postscale_factor")
        values = allgather(tensor.values, name=None if name is None else name + "/values")
        indices = allgather(tensor.indices, name=None if name is None else name + "/indices")
        if op == Average:
            values = values / tf.cast(size(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
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
    _no_process_set(process_set, "broadcast")
    return _ops.mtxcomm_broadcast(tf.convert_to_tensor(tensor), root_rank=int(root_rank),
                                  tensor_name=_tensor_name(name))


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In-place broadcast: assigns root_rank's value to each variable of ``variables`` (resource
    or reference variables, the same list on every rank) and returns their new values (tensors,
    in list order). One broadcast per variable, issued together."""
    _no_process_set(process_set, "broadcast_")
    variables = list(variables)
    out = []
    for i, v in enumerate(variables):
        value = broadcast(tf.convert_to_tensor(v), root_rank,
                          name=None if name is None else "%s/%d" % (name, i))
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
    return _ops.mtxcomm_allgather(tf.convert_to_tensor(tensor), tensor_name=_tensor_name(name))


def grouped_allgather(tensors, name=None, process_set=None, ignore_name_scope=False):
    """allgather() of every tensor of the list (dtypes may differ), negotiated as one request;
    returns the list of gathered tensors."""
    _no_process_set(process_set, "grouped_allgather")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    return list(_ops.mtxcomm_grouped_allgather(tensors, tensor_name=_tensor_name(name)))


def reducescatter(tensor, op=Average, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0, ignore_name_scope=False):
    """Reduces ``tensor`` (same shape [d0, ...] on every rank) over ranks, then rank r keeps its
    rows of dimension 0: d0 // size() rows, one more on the first d0 % size() ranks.
    op: hvd.Average (default), Sum, Min, Max, Product."""
    _no_process_set(process_set, "reducescatter")
    op = _resolve_op(op, None, "reducescatter", adasum=False)
    tensor = _scale(tf.convert_to_tensor(tensor), prescale_factor)
    out = _ops.mtxcomm_reducescatter(tensor, reduce_op=op, tensor_name=_tensor_name(name))
    return _scale(out, postscale_factor)


def grouped_reducescatter(tensors, op=Average, name=None, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0, ignore_name_scope=False):
    """reducescatter() of every tensor of the list, negotiated as one request; returns the list
    of this rank's shares."""
    _no_process_set(process_set, "grouped_reducescatter")
    op = _resolve_op(op, None, "grouped_reducescatter", adasum=False)
    tensors = [_scale(tf.convert_to_tensor(t), prescale_factor) for t in tensors]
    if not tensors:
        return []
    out = _ops.mtxcomm_grouped_reducescatter(tensors, reduce_op=op,
                                             tensor_name=_tensor_name(name))
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
            raise ValueError("alltoall: splits must be integers (int8 to int64), got %s"
                             % s.dtype.name)
        if s.dtype not in (tf.int32, tf.int64):
            s = tf.cast(s, tf.int64)  # exact: every other integer type fits
    out, received = _ops.mtxcomm_alltoall(tensor, s, tensor_name=_tensor_name(name))
    return out if splits is None else (out, received)


def _no_process_set(process_set, what):
    if process_set is not None:
        raise NotImplementedError("%s: process sets are not supported (every rank of the job "
                                  "is one communicator)" % what)


# ---- process facts as ops (evaluated when the graph runs) --------------------------------

def rank_op(name=None):
    """An int32 scalar op: this process's rank, read when the op runs."""
    return _ops.mtxcomm_process_info(info="rank", name=name)


def local_rank_op(name=None):
    """An int32 scalar op: this process's rank on its node, read when the op runs."""
    return _ops.mtxcomm_process_info(info="local_rank", name=name)


def size_op(process_set_id=0, name=None):
    """An int32 scalar op: the number of ranks, read when the op runs."""
    if process_set_id != 0:
        raise NotImplementedError("size_op: process sets are not supported")
    return _ops.mtxcomm_process_info(info="size", name=name)


def local_size_op(name=None):
    """An int32 scalar op: the number of ranks on this node, read when the op runs."""
    return _ops.mtxcomm_process_info(info="local_size", name=name)


tf.no_gradient("MtxcommProcessInfo")
tf.no_gradient("MtxcommJoin")


# ---- Python objects --------------------------------------------------------------------------

def _run(tensors, session=None):
    """The value of tensors as NumPy: eagerly, or through session (the default session, else a
    new one) in a graph."""
    if tf.executing_eagerly():
        return tf.nest.map_structure(lambda t: t.numpy(), tensors)
    sess = session or tf.compat.v1.get_default_session()
    if sess is None:
        with tf.compat.v1.Session() as own:
            return own.run(tensors)
    return sess.run(tensors)


def _pickled(obj):
    """(bytes as a uint8 array, None) or (None, the pickling error)."""
    import pickle
    import numpy as np
    try:
        return np.frombuffer(pickle.dumps(obj), dtype=np.uint8), None
    except Exception as e:  # every rank must still take part in the collectives
        return None, e


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Every rank gets root_rank's picklable Python object (eagerly, or in a graph through
    ``session`` / the default session). An object the root cannot pickle raises on every rank
    (the root's own error there, ValueError naming it elsewhere)."""
    import pickle
    import numpy as np
    _no_process_set(process_set, "broadcast_object")
    # The default name may not depend on obj: only the root's object is meaningful.
    name = name or "default"
    payload, error = _pickled(obj) if rank() == root_rank else (np.zeros([0], np.uint8), None)
    size = -1 if error is not None else payload.size
    n = int(_run(broadcast(tf.constant([size], dtype=tf.int64), root_rank,
                           name="broadcast_object/%s/size" % name), session)[0])
    if n < 0:
        if error is not None:
            raise error
        raise ValueError("broadcast_object: root rank %d could not pickle its object"
                         % root_rank)
    buf = payload if rank() == root_rank else np.zeros([n], dtype=np.uint8)
    data = _run(broadcast(tf.constant(buf), root_rank, name="broadcast_object/%s" % name),
                session)
    return obj if rank() == root_rank else pickle.loads(data.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=None):
    """A function obj -> broadcast_object(obj, root_rank, session, name): Horovod's form for
    TensorFlow 1 graphs."""
    def _bcast(obj):
        return broadcast_object(obj, root_rank, session=session, name=name,
                                process_set=process_set)
    return _bcast


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every rank's picklable Python object, as a list in rank order, on every rank. An object
    some rank cannot pickle raises on every rank (that rank's own error there, ValueError
    naming the ranks elsewhere)."""
    import pickle
    _no_process_set(process_set, "allgather_object")
    name = name or "default"  # the objects' types may differ between ranks
    payload, error = _pickled(obj)
    size = -1 if error is not None else payload.size
    sizes = _run(allgather(tf.constant([size], dtype=tf.int64),
                           name="allgather_object/%s/sizes" % name), session).tolist()
    bad = [r for r, n in enumerate(sizes) if n < 0]
    if bad:
        if error is not None:
            raise error
        raise ValueError("allgather_object: rank(s) %s could not pickle their object"
                         % ",".join(map(str, bad)))
    data = _run(allgather(tf.constant(payload), name="allgather_object/%s" % name), session)
    out, off = [], 0
    for n in sizes:
        out.append(pickle.loads(data[off:off + n].tobytes()))
        off += n
    return out


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assigns root_rank's value to each variable (tf.Variable or keras.Variable), on every
    rank, in list order. The variables must be in the same order on every rank. Eagerly the
    assignments are done on return; in a graph the returned op does them."""
    _no_process_set(process_set, "broadcast_variables")
    assigns = [v.assign(broadcast(tf.convert_to_tensor(v), root_rank)) for v in variables]
    if not tf.executing_eagerly():
        return tf.group(*assigns)
    return None


def broadcast_global_variables(root_rank):
    """Broadcasts every TensorFlow 1 global variable from root_rank (graph mode only: the op to
    run). Eagerly there are no global variables: raises RuntimeError; use
    broadcast_variables(model.variables, root_rank)."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() does not support eager execution: "
                           "there are no global variables; use "
                           "hvd.broadcast_variables(model.variables, root_rank=%d)" % root_rank)
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# ---- gradients -----------------------------------------------------------------------------
# As Horovod defines them (the reference for scripts moved from it): the gradient flowing into
# a collective from every rank is averaged, except that an allreduce passes its own op on, and
# a Sum reduce-scatter scales the gathered gradient by size().

def _allreduce_sum(t):
    return _ops.mtxcomm_allreduce(t, reduce_op=Sum)


def _allreduce_average(t):
    return _ops.mtxcomm_allreduce(t, reduce_op=Average)


@tf.RegisterGradient("MtxcommAllreduce")
@_in_backward
def _allreduce_grad(op, grad):
    """d/dx_r of the distributed loss sum_q L_q(y): the upstream gradients of every rank are
    summed (Sum) or averaged (Average); Min/Max route them to the ranks holding the extremum,
    Product scales them by y / x_r."""
    reduce_op = op.get_attr("reduce_op")
    if reduce_op in (Sum, Average):
        return _ops.mtxcomm_allreduce(grad, reduce_op=reduce_op)
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
    grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
             for g, x in zip(grads, op.inputs)]
    return _ops.mtxcomm_grouped_allreduce(grads, reduce_op=reduce_op)


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
    all_rows = _ops.mtxcomm_allgather(rows)
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
    return _ops.mtxcomm_allgather(grad)


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
    back, _ = _ops.mtxcomm_alltoall(tf.convert_to_tensor(grad), op.outputs[1])
    return [back, None]


# ---- gradient averaging for training -------------------------------------------------------

def _local_gradient(g, op):
    """A worker-local variable's gradient is not reduced; with Average it is divided by size()
    as the reduced ones are (Horovod's scale_local_gradients)."""
    if g is None or op != Average:
        return g
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values / tf.cast(size(), g.values.dtype), g.indices,
                                g.dense_shape)
    return g / tf.cast(size(), g.dtype)


def _allreduce_gradients(grads, op=Average, sparse_as_dense=False,
                         compression=Compression.none, scale=None, name=None, local=None):
    """Averages (op) a list of gradients with one grouped allreduce. None passes through;
    IndexedSlices are allgathered (or densified with sparse_as_dense). ``scale`` multiplies
    every gradient first (transparent mode weights uneven batch shares with it). ``local``:
    flags of the gradients of worker-local variables, which are not reduced."""
    grads = list(grads)
    out = list(grads)
    dense_idx = []
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if local is not None and local[i]:
            out[i] = _local_gradient(g, op)
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                if scale is not None:
                    g = tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices,
                                         g.dense_shape)
                with _overlapping():
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
            with _overlapping():
                reduced = [allreduce(g, op=op, compression=compression,
                                     name=None if name is None else "%s/%d" % (name, k))
                           for k, g in enumerate(dense)]
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


def _source_keys(v):
    """Identities of a gradient source: the object and, for a Keras variable, the TensorFlow
    variable it holds (either may be passed to register_local_source or as a source)."""
    keys = {id(v)}
    inner = getattr(v, "_value", None)
    if inner is not None:
        keys.add(id(inner))
    return keys


def _local_flags(variables, local_keys):
    return [bool(local_keys and _source_keys(v) & local_keys) for v in variables]


class _DistributedGradientTape:
    """Methods mixed into a copy of the user's GradientTape."""

    def _mtx_split(self, target, sources, output_gradients=None, **kwargs):
        """(flat sources, flat reduced gradients, is-local flags, structure of the grads)."""
        grads = super(self._mtx_base, self).gradient(target, sources, output_gradients,
                                                     **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads)
        local = _local_flags(flat_sources, self._mtx_local)
        if len(local) != len(flat):
            local = [False] * len(flat)
        out = _allreduce_gradients(flat, op=self._mtx_op,
                                   sparse_as_dense=self._mtx_sparse_as_dense,
                                   compression=self._mtx_compression, local=local)
        return flat_sources, out, local, grads

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        _, out, _, grads = self._mtx_split(target, sources, output_gradients, **kwargs)
        return tf.nest.pack_sequence_as(grads, out)

    def register_local_source(self, source):
        """The gradient of source is not reduced over ranks (a variable each rank has its own
        copy of, as in model parallelism); with op=Average it is divided by size()."""
        self._mtx_local |= _source_keys(source)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       **kwargs):
        """([(source, gradient)] of the local sources, [(source, gradient)] of the others),
        gradients as gradient() returns them."""
        flat_sources, out, local, _ = self._mtx_split(target, sources, output_gradients,
                                                      **kwargs)
        pairs = list(zip(flat_sources, out))
        return ([p for p, is_local in zip(pairs, local) if is_local],
                [p for p, is_local in zip(pairs, local) if not is_local])


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, local_sources=None):
    """Returns a tape whose gradient() averages (op) the gradients over ranks: one grouped
    allreduce per call; None gradients pass through; IndexedSlices are allgathered, or
    densified first with sparse_as_dense=True. Sources given in local_sources, or later to
    tape.register_local_source(), keep their own gradient (divided by size() for Average)."""
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError("DistributedGradientTape: gradient_predivide_factor is not "
                                  "supported; use allreduce's prescale_factor/postscale_factor")
    if process_set is not None or groups is not None:
        raise NotImplementedError("DistributedGradientTape: process sets and groups are not "
                                  "supported (all gradients go in one group)")
    base = type(gradtape)
    methods = {k: getattr(_DistributedGradientTape, k) for k in
               ("_mtx_split", "gradient", "register_local_source",
                "get_local_and_global_gradients")}
    cls = type(base.__name__, (base,), dict(methods, _mtx_base=None))
    cls._mtx_base = cls
    tape = base.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._mtx_op = _resolve_op(op, None, "DistributedGradientTape")
    tape._mtx_sparse_as_dense = sparse_as_dense
    tape._mtx_compression = compression
    tape._mtx_local = set()
    for v in local_sources or ():
        tape.register_local_source(v)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=None, local_layers=None):
    """DistributedGradientTape whose local sources are the trainable weights of local_layers
    (a Keras layer or a list of them)."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    local = [w for layer in local_layers for w in layer.trainable_weights]
    return DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, local_sources=local)


def _check_optimizer_options(process_set, groups, num_groups, gradient_predivide_factor):
    """Horovod options of DistributedOptimizer that mtxcomm does not provide."""
    if process_set is not None or groups is not None or num_groups:
        raise NotImplementedError("DistributedOptimizer: process sets and groups are not "
                                  "supported (all gradients go in one group)")
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError("DistributedOptimizer: gradient_predivide_factor is not "
                                  "supported")


class _LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer) whose compute_gradients averages
    the gradients over ranks."""

    def __init__(self, optimizer, name, use_locking, op, compression, sparse_as_dense):
        self._optimizer = optimizer
        self._mtx_op = op
        self._mtx_compression = compression
        self._mtx_sparse_as_dense = sparse_as_dense
        super().__init__(name=name or "Distributed" + type(optimizer).__name__,
                         use_locking=use_locking)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = _allreduce_gradients([g for g, _ in pairs], op=self._mtx_op,
                                     sparse_as_dense=self._mtx_sparse_as_dense,
                                     compression=self._mtx_compression)
        return list(zip(grads, [v for _, v in pairs]))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None):
    """An optimizer that averages (op) the gradients over ranks before applying them.

    A Keras 3 optimizer goes to mtxcomm.tensorflow.keras.DistributedOptimizer (every option);
    a TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer) is wrapped: its compute_gradients
    returns the averaged gradients (backward_passes_per_step must be 1 there)."""
    import keras
    if isinstance(optimizer, keras.optimizers.Optimizer):
        from mtxcomm.tensorflow import keras as _keras
        return _keras.DistributedOptimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients or
            backward_passes_per_step == 1, num_groups=num_groups, groups=groups,
            process_set=process_set)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError("DistributedOptimizer expects a Keras 3 optimizer or a "
                         "tf.compat.v1.train.Optimizer, got %r" % type(optimizer).__name__)
    _check_optimizer_options(process_set, groups, num_groups, gradient_predivide_factor)
    if backward_passes_per_step != 1:
        raise NotImplementedError("DistributedOptimizer: backward_passes_per_step > 1 is "
                                  "provided for Keras 3 optimizers only")
    return _LegacyDistributedOptimizer(optimizer, name, use_locking,
                                       _resolve_op(op, None, "DistributedOptimizer"),
                                       compression, sparse_as_dense)


# ---- what this build has (Horovod's build queries, answered for mtxcomm) ------------------

def _built(feature):
    return bool(_engine.build_feature(feature))


def mpi_built():
    """True when this mtxcomm was built with its MPI bootstrap and transport."""
    return _built("mpi")


def mpi_enabled():
    """True when this job was started by an MPI launcher (mpirun, srun) and mtxcomm was built
    with MPI: the ranks bootstrap through MPI."""
    import os
    launched = any(os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                                "PMI_SIZE")) or \
        (os.environ.get("SLURM_PROCID") and os.environ.get("SLURM_STEP_ID"))
    return mpi_built() and bool(launched)


def nccl_built():
    """True when this build has mtxcomm's NCCL device path (the pip package does not)."""
    return _built("nccl")


def cuda_built():
    """True when this build takes CUDA device buffers (the pip package does not)."""
    return _built("cuda")


def gloo_built():
    """mtxcomm has no Gloo: its own TCP and shared-memory transports take that role."""
    return False


def gloo_enabled():
    return False


def ccl_built():
    """mtxcomm has no oneCCL."""
    return False


def ddl_built():
    return False


def rocm_built():
    return False


def mlsl_built():
    return False


def is_homogeneous():
    """True when every node runs the same number of ranks."""
    _check_init("is_homogeneous")
    return size() % local_size() == 0 and \
        len(set(allgather_object(local_size(), name="mtxcomm.is_homogeneous"))) == 1


def _executing_eagerly():
    return tf.executing_eagerly()


from mtxcomm.tensorflow import elastic, util  # noqa: E402,F401


def __getattr__(name):
    # Needs Keras: loaded on first use, so that a TensorFlow-only script does not import it.
    if name == "SyncBatchNormalization":
        from mtxcomm.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "rank_op", "local_rank_op", "size_op", "local_size_op",
    "Sum", "Average", "Min", "Max", "Product", "Adasum", "Compression",
    "allreduce", "grouped_allreduce", "broadcast", "broadcast_", "allgather",
    "grouped_allgather", "reducescatter", "grouped_reducescatter", "alltoall",
    "broadcast_variables", "broadcast_global_variables", "broadcast_object",
    "broadcast_object_fn", "allgather_object", "DistributedGradientTape",
    "PartialDistributedGradientTape", "DistributedOptimizer", "join", "cpu_share",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "cuda_built",
    "gloo_built", "gloo_enabled", "ccl_built", "ddl_built", "rocm_built", "mlsl_built",
    "is_homogeneous", "elastic",
]
