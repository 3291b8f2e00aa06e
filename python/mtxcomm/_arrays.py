"""mtxcomm's framework-neutral array API (``mtxcomm.allreduce`` and the others).

Collectives on host arrays of any framework: NumPy arrays, PyTorch CPU tensors, JAX CPU arrays,
any other object with ``__dlpack__`` (on the CPU) and any object with the buffer protocol
(``bytes``, ``bytearray``, ``array.array``, ``memoryview``). Every call runs through the same
engine as ``mtxcomm.tensorflow`` (``bindings/common/engine.h``, through the module
``mtxcomm._core``): one world communicator and one engine thread per process, whichever API
started it, so a script may use both.

Calls are collective and blocking: every rank makes the same calls in the same order (the k-th
array call of one rank pairs with the k-th of every other rank; ranks that disagree on the
collective, op, root, dtype or shape get an ``InvalidUsageError`` naming both calls, and the
next call works). The GIL is released while a call waits.

Zero copy: the input is handed to the engine as a view of the caller's memory (NumPy through
``np.asarray``/``np.from_dlpack``), never copied, unless it is not C-contiguous or not aligned
(a transposed or sliced array): then a contiguous copy is made and reduced. Results come back in
the caller's array type without a copy: NumPy (also for buffer-protocol and other DLPack inputs),
``torch.Tensor`` (``torch.from_dlpack`` of the result), JAX arrays (``jax.numpy.from_dlpack``;
bfloat16 is copied, since NumPy has no DLPack code for it). ``out=`` writes the result into a
caller's array and returns it.
"""

import atexit
import enum
import operator
import sys

import numpy as np

from mtxcomm import _core
from mtxcomm._buffers import (  # noqa: F401  (_torch_dtypes: for mtxcomm.torch)
    _Array,
    _check_overlap,
    _input,
    _output,
    _torch_dtypes,
    _wrap,
    _wrap_splits,
)
from mtxcomm._errors import (  # noqa: F401  (re-exported: mtxcomm.Error and the others)
    _INVALID_USAGE,
    Error,
    InvalidArgumentError,
    InvalidUsageError,
    RemoteError,
    TimeoutError,
    _error,
)
from mtxcomm.common import exit_handling

exit_handling.end_job_on_uncaught_exception()

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "allreduce",
    "broadcast",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "barrier",
    "ReduceOp",
    "SUM",
    "PROD",
    "MIN",
    "MAX",
    "AVG",
    "ADASUM",
    "Error",
    "InvalidArgumentError",
    "InvalidUsageError",
    "RemoteError",
    "TimeoutError",
]


# ---- reduction ops ---------------------------------------------------------------------------


class ReduceOp(enum.IntEnum):
    """Reduction ops, numbered as the C API's ``mtxcomm_op_t``."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    ADASUM = 5


SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX
AVG = ReduceOp.AVG
ADASUM = ReduceOp.ADASUM

_OP_BY_NAME = {
    "sum": SUM,
    "prod": PROD,
    "product": PROD,
    "min": MIN,
    "max": MAX,
    "avg": AVG,
    "average": AVG,
    "adasum": ADASUM,
}
_OP_WORDS = (
    "'sum', 'avg', 'min', 'max', 'prod' or 'adasum' (or mtxcomm.SUM, AVG, MIN, MAX, PROD, ADASUM)"
)


def _integer(v):
    """v as an int when it is an integer (int, NumPy integer, ...) other than a bool, else None."""
    if isinstance(v, (bool, np.bool_)):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _op(op, what):
    code = _integer(op)
    if isinstance(op, str):
        found = _OP_BY_NAME.get(op.lower())
        if found is not None:
            return found
    elif code is not None:
        if 0 <= code < len(ReduceOp):
            return ReduceOp(code)
    else:
        raise TypeError("mtxcomm.%s: op must be %s; got %s" % (what, _OP_WORDS, type(op).__name__))
    raise ValueError("mtxcomm.%s: unknown op %r; use %s" % (what, op, _OP_WORDS))


def _run(kind, x, what, op=SUM, root=0, splits=None, out=None):
    """One collective through the engine; returns (result or None, received splits or None)."""
    xb = x.array.reshape(-1).view(np.uint8)
    ob = None if out is None else out.array.reshape(-1).view(np.uint8)
    out_shape = [] if out is None else list(out.array.shape)
    code, message, result, shape, received = _core.run(
        kind, xb, x.code, list(x.array.shape), int(op), int(root), splits, ob, out_shape
    )
    if code:
        raise _error(code, message)
    if result is not None:
        result = result.view(x.array.dtype).reshape(shape)
    return result, received


def _finish(x, out, result):
    return out.obj if out is not None else _wrap(x, result)


# ---- process -------------------------------------------------------------------------------


def init():
    """Starts mtxcomm on every rank (collective): creates the world communicator from the
    environment (``mpirun``/``mtxrun``, or ``MTXCOMM_RANK``/``MTXCOMM_SIZE``/``MTXCOMM_STORE``;
    a lone process is a job of one rank) and the engine thread. A no-op while the engine runs,
    also when ``mtxcomm.tensorflow.init()`` started it: the two APIs share one engine.

    Raises ``mtxcomm.Error`` (a subclass by its code) with the library's message: a bad
    ``MTXCOMM_*`` value, peers that cannot be reached.
    """
    code, message = _core.init()
    if code:
        raise _error(code, message)


def shutdown():
    """Stops the engine on every rank and frees the communicator; calls still waiting, here or
    on other ranks, fail with an error naming this rank. Also ends ``mtxcomm.tensorflow``'s use
    of the engine (it is the same one). Idempotent; also run at exit.

    Raises ``mtxcomm.InvalidUsageError`` where the ranks disagreed on a call that returned
    before its peers entered it (a broadcast) and no later call found it; at exit that error
    is written to standard error and the process exits with status 1."""
    exit_handling.shutdown_or_exit(_core.shutdown, at_exit=False, error=_error)


atexit.register(lambda: exit_handling.shutdown_or_exit(_core.shutdown, at_exit=True, error=_error))


def is_initialized():
    """True between ``init()`` (of either API) and ``shutdown()`` or a communication failure."""
    return bool(_core.is_initialized())


def _fact(value, what):
    if value < 0:
        raise InvalidUsageError(
            "mtxcomm.%s(): mtxcomm is not initialised; call mtxcomm.init() first" % what,
            _INVALID_USAGE,
        )
    return int(value)


def rank():
    """This process's rank in [0, size()). InvalidUsageError before init()."""
    return _fact(_core.rank(), "rank")


def size():
    """The number of ranks. InvalidUsageError before init()."""
    return _fact(_core.size(), "size")


def local_rank():
    """This process's rank among the ranks of its node. InvalidUsageError before init()."""
    return _fact(_core.local_rank(), "local_rank")


def local_size():
    """The number of ranks on this process's node. InvalidUsageError before init()."""
    return _fact(_core.local_size(), "local_size")


# ---- collectives ----------------------------------------------------------------------------

_COMMON_DOC = """
    Arrays: NumPy arrays, PyTorch CPU tensors, JAX CPU arrays, other CPU ``__dlpack__``
    objects, buffer-protocol objects (``bytes``, ``bytearray``, ``array.array``). The input is
    read in place (no copy) unless it is not C-contiguous or not aligned: then a contiguous copy
    is made first. The result comes back in the input's type (NumPy for buffer-protocol and other
    DLPack inputs) over memory mtxcomm allocated, with no further copy.

    Dtypes: int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16
    (``ml_dtypes.bfloat16``, ``torch.bfloat16``), float32, float64, bool. Anything else:
    ``TypeError`` naming the dtype. A tensor on a GPU or other device: ``ValueError`` (the
    package takes host memory only).

    Errors: ``ValueError`` for this rank's own bad arguments, raised before anything is sent
    (the other ranks then wait for this call until ``MTXCOMM_STALL_TIMEOUT``);
    ``InvalidArgumentError`` (a ``ValueError``) for a request the engine finds wrong on every
    rank; ``InvalidUsageError`` before ``init()`` or when ranks disagree on the call (every rank
    gets the message naming the ranks and their calls; the next call works);
    ``RemoteError`` when a peer died or shut down; ``TimeoutError`` after ``MTXCOMM_TIMEOUT``
    or ``MTXCOMM_STALL_TIMEOUT``.
"""


def _doc(text):
    def apply(f):
        f.__doc__ = text + _COMMON_DOC
        return f

    return apply


@_doc("""Reduces x over all ranks; every rank gets the same result.

    x: an array of any shape, the same shape and dtype on every rank. op: "sum", "avg", "min",
    "max", "prod" or "adasum" (or mtxcomm.SUM, AVG, MIN, MAX, PROD, ADASUM; any case), the same
    on every rank. Integer sum and prod wrap; integer avg truncates toward zero; float16 and
    bfloat16 accumulate in float32 and round once; bool reduces logically (sum and max: or; prod
    and min: and; avg is an InvalidArgumentError on every rank). adasum is the library's
    adaptive summation (floating dtypes only; include/mtxcomm/mtxcomm.h has its tree and
    numbers).

    out: None (a new array is returned), or a writable C-contiguous array of x's shape and
    dtype that receives the result and is returned; ``out=x`` reduces in place. A read-only
    out (a JAX array, bytes, a read-only NumPy view) is never written: ValueError; so is an out
    that overlaps x other than exactly.
""")
def allreduce(x, op="sum", out=None):
    what = "allreduce"
    code = _op(op, what)
    xv = _input(x, what)
    ov = _output(out, xv, what, shape=xv.array.shape)
    _check_overlap(xv, ov, what, in_place_ok=True)
    result, _ = _run(_core.KIND_ALLREDUCE, xv, what, op=code, out=ov)
    return _finish(xv, ov, result)


@_doc("""Every rank gets root's x.

    x: an array of the same shape and dtype on every rank (only root's values are read). root:
    a rank in [0, size()), the same on every rank (else InvalidArgumentError on every rank).

    out: None, or a writable C-contiguous array of x's shape and dtype that receives the result
    and is returned; ``out=x`` broadcasts in place. A read-only out is a ValueError.
""")
def broadcast(x, root=0, out=None):
    what = "broadcast"
    if _integer(root) is None:
        raise TypeError("mtxcomm.broadcast: root must be an int, got %s" % type(root).__name__)
    root = _integer(root)
    xv = _input(x, what)
    ov = _output(out, xv, what, shape=xv.array.shape)
    _check_overlap(xv, ov, what, in_place_ok=True)
    result, _ = _run(_core.KIND_BROADCAST, xv, what, root=root, out=ov)
    return _finish(xv, ov, result)


@_doc("""Concatenation of every rank's x along dimension 0, in rank order.

    x: shape (d0_r, *rest) on rank r; d0 may differ between ranks, rest and the dtype may not;
    at least one dimension (a scalar is an InvalidArgumentError on every rank). Result: shape
    (sum over r of d0_r, *rest) on every rank.

    out: None, or a writable C-contiguous array of the result's shape and x's dtype, not
    overlapping x (no in place). Its dimension 0 is checked once the ranks' sizes are known: a
    wrong one is a ValueError after the collective has run (the ranks stay in step; out is then
    left as it was).
""")
def allgather(x, out=None):
    what = "allgather"
    xv = _input(x, what)
    ov = _output(out, xv, what)
    if ov is not None and (
        ov.array.ndim != xv.array.ndim or ov.array.shape[1:] != xv.array.shape[1:]
    ):
        raise ValueError(
            "mtxcomm.allgather: out has shape %s but the result has shape "
            "(N,) + %s (N: the sum of dimension 0 over the ranks)"
            % (tuple(ov.array.shape), tuple(xv.array.shape[1:]))
        )
    _check_overlap(xv, ov, what, in_place_ok=False)
    result, _ = _run(_core.KIND_ALLGATHER, xv, what, out=ov)
    return _finish(xv, ov, result)


def _rows(d0, n, r):
    return d0 // n + (1 if r < d0 % n else 0)


@_doc("""Reduces x over all ranks, then rank r keeps its rows of dimension 0.

    x: shape (d0, *rest), the same on every rank, at least one dimension. Rank r gets rows
    [start_r, start_r + rows_r) of the reduced array, rows_r = d0 // size() plus one on the
    first d0 % size() ranks (so shape (rows_r, *rest); ranks past d0 get 0 rows). op as for
    allreduce, but not adasum (InvalidArgumentError on every rank).

    out: None, or a writable C-contiguous array of shape (rows_r, *rest) and x's dtype, not
    overlapping x (no in place).
""")
def reduce_scatter(x, op="sum", out=None):
    what = "reduce_scatter"
    code = _op(op, what)
    xv = _input(x, what)
    shape = None
    if out is not None and xv.array.ndim >= 1:
        shape = (_rows(xv.array.shape[0], size(), rank()),) + tuple(xv.array.shape[1:])
    ov = _output(out, xv, what, shape=shape)
    _check_overlap(xv, ov, what, in_place_ok=False)
    result, _ = _run(_core.KIND_REDUCE_SCATTER, xv, what, op=code, out=ov)
    return _finish(xv, ov, result)


def _splits(splits):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(splits, torch.Tensor):
        splits = splits.detach().cpu().numpy()
    a = np.asarray(splits)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise TypeError(
            "mtxcomm.alltoall: splits must be a 1-d sequence of ints (rows of x to "
            "send to each rank), got %r" % (splits,)
        )
    return [int(v) for v in a]


@_doc("""Rows of dimension 0 scattered to the ranks: rows splits[j] of x go to rank j, in order.

    x: shape (d0, *rest), rest and the dtype the same on every rank. splits: None (d0 split
    evenly: d0 must be a multiple of size()) or size() non-negative ints summing to d0 (a list,
    a NumPy or torch int array); splits may differ between ranks. A wrong one is an
    InvalidArgumentError on every rank, naming the rank.

    Returns the rows received from every rank, in rank order (shape (sum of rows received,
    *rest)); with splits given, ``(result, received_splits)``, received_splits an int32 array
    (in the input's family) of the rows received from each rank. No out: the result's size is
    known only once every rank's splits are.
""")
def alltoall(x, splits=None):
    what = "alltoall"
    xv = _input(x, what)
    s = None if splits is None else _splits(splits)
    result, received = _run(_core.KIND_ALLTOALL, xv, what, splits=s)
    out = _wrap(xv, result)
    return out if splits is None else (out, _wrap_splits(xv, received))


def barrier():
    """Returns on each rank once every rank has called it (an engine call like the others: one
    byte allreduced). Errors as for the collectives."""
    one = _Array(np.zeros(1, np.uint8), 1, "numpy", None)
    _run(_core.KIND_ALLREDUCE, one, "barrier", op=MAX)
