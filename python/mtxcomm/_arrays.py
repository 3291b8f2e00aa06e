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
import builtins
import enum
import operator
import sys

import numpy as np

from mtxcomm import _core
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


# ---- errors ----------------------------------------------------------------------------------

# The C API's mtxcomm_result_t.
_CODE_NAMES = {
    0: "MTXCOMM_SUCCESS",
    1: "MTXCOMM_INVALID_ARGUMENT",
    2: "MTXCOMM_INVALID_USAGE",
    3: "MTXCOMM_SYSTEM_ERROR",
    4: "MTXCOMM_REMOTE_ERROR",
    5: "MTXCOMM_TIMEOUT",
    6: "MTXCOMM_CUDA_ERROR",
    7: "MTXCOMM_INTERNAL_ERROR",
    8: "MTXCOMM_UNSUPPORTED",
}
_INVALID_ARGUMENT, _INVALID_USAGE, _REMOTE_ERROR, _TIMEOUT = 1, 2, 4, 5


class Error(RuntimeError):
    """A failure reported by mtxcomm. ``code`` is the C API's ``mtxcomm_result_t`` (an int),
    ``code_name`` its name (``"MTXCOMM_SYSTEM_ERROR"``); the message is the library's (it names
    this rank and the call). Raised as is for system, internal and unsupported errors; the
    subclasses below for the others."""

    def __init__(self, message, code=7):
        super().__init__(message)
        self.code = int(code)
        self.code_name = _CODE_NAMES.get(self.code, str(self.code))


class InvalidArgumentError(Error, ValueError):
    """MTXCOMM_INVALID_ARGUMENT: a request wrong in itself, refused on every rank (a root out of
    range, alltoall splits that do not add up, a scalar to gather, avg on bool, adasum on an
    integer); also a ``ValueError``."""


class InvalidUsageError(Error):
    """MTXCOMM_INVALID_USAGE: a call not allowed now: before ``init()`` or after ``shutdown()``,
    or ranks that disagree on a call (collective, op, root, dtype, shape); the message names the
    ranks and what each passed."""


class RemoteError(Error):
    """MTXCOMM_REMOTE_ERROR: a peer died, aborted or shut down before this call could run."""


class TimeoutError(builtins.TimeoutError):
    """MTXCOMM_TIMEOUT: a peer did not answer within ``MTXCOMM_TIMEOUT`` seconds, or a call
    waited longer than ``MTXCOMM_STALL_TIMEOUT`` for ranks that never made it. A subclass of the
    built-in ``TimeoutError`` (an ``OSError``, which cannot also be a ``RuntimeError``, so not
    an ``Error``); it has ``code`` and ``code_name`` as ``Error`` has."""

    def __init__(self, message, code=_TIMEOUT):
        super().__init__(message)
        self.code = int(code)
        self.code_name = _CODE_NAMES.get(self.code, str(self.code))


_ERROR_CLASSES = {
    _INVALID_ARGUMENT: InvalidArgumentError,
    _INVALID_USAGE: InvalidUsageError,
    _REMOTE_ERROR: RemoteError,
    _TIMEOUT: TimeoutError,
}


def _error(code, message):
    return _ERROR_CLASSES.get(code, Error)(message, code)


# ---- datatypes -------------------------------------------------------------------------------

# The C API's mtxcomm_datatype_t, by NumPy (kind, itemsize); bfloat16 (ml_dtypes) by name.
_NUMPY_CODES = {
    ("i", 1): 0,
    ("u", 1): 1,
    ("i", 4): 2,
    ("u", 4): 3,
    ("i", 8): 4,
    ("u", 8): 5,
    ("f", 2): 6,
    ("f", 4): 8,
    ("f", 8): 9,
    ("i", 2): 10,
    ("u", 2): 11,
    ("b", 1): 12,
}
_BFLOAT16, _BOOL = 7, 12
_SUPPORTED = (
    "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16 "
    "(ml_dtypes.bfloat16, torch.bfloat16), float32, float64, bool"
)


def _dtype_code(dtype, what, name):
    dtype = np.dtype(dtype)
    code = None
    if dtype.isnative:
        code = _NUMPY_CODES.get((dtype.kind, dtype.itemsize))
        if code is None and dtype.name == "bfloat16" and dtype.itemsize == 2:
            code = _BFLOAT16
    if code is None:
        shown = str(dtype) if dtype.isnative else "%s (non-native byte order)" % dtype.str
        raise TypeError(
            "mtxcomm.%s: %s has dtype %s, which mtxcomm does not support; "
            "supported: %s" % (what, name, shown, _SUPPORTED)
        )
    return code


_torch_table = None


def _torch_dtypes(torch):
    """torch dtype -> (mtxcomm code, the dtype NumPy sees it as through DLPack, or None)."""
    global _torch_table
    if _torch_table is None:
        table = {
            torch.int8: (0, None),
            torch.uint8: (1, None),
            torch.int16: (10, None),
            torch.int32: (2, None),
            torch.int64: (4, None),
            torch.float16: (6, None),
            torch.float32: (8, None),
            torch.float64: (9, None),
            # NumPy has no bfloat16 and its DLPack bool support varies: same-size views.
            torch.bfloat16: (_BFLOAT16, torch.int16),
            torch.bool: (_BOOL, torch.uint8),
        }
        for name, code in (("uint16", 11), ("uint32", 3), ("uint64", 5)):
            if hasattr(torch, name):
                table[getattr(torch, name)] = (code, None)
        _torch_table = table
    return _torch_table


# ---- arrays in and out -----------------------------------------------------------------------

_DLPACK_DEVICES = {
    1: "CPU",
    2: "CUDA",
    3: "CUDA host",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm host",
    13: "CUDA managed",
    14: "oneAPI",
}


class _Array:
    """A caller's array as a NumPy view of host memory: ``array`` (C-contiguous and aligned
    unless for_out), ``code`` (mtxcomm dtype), ``family`` ("numpy", "torch" or "jax": the type
    results come back in), ``torch_dtype`` (a torch input's dtype), ``copied`` (the input was not
    contiguous: array is a copy)."""

    __slots__ = ("array", "code", "family", "torch_dtype", "copied", "obj")

    def __init__(self, array, code, family, obj, torch_dtype=None):
        self.array, self.code, self.family, self.obj = array, code, family, obj
        self.torch_dtype = torch_dtype
        self.copied = False


def _device_error(what, name, where):
    return ValueError(
        "mtxcomm.%s: %s is on a %s device; the array API takes host (CPU) memory "
        "only (the mtxcomm package is built for the CPU): copy it to the host "
        "first (e.g. tensor.cpu(), jax.device_get, cupy.asnumpy)" % (what, name, where)
    )


def _view(x, what, name):
    """An _Array over x's memory (no copy)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise _device_error(what, name, str(x.device))
        if x.layout != torch.strided:
            raise TypeError(
                "mtxcomm.%s: %s is a %s torch tensor; only dense (strided) tensors "
                "are supported" % (what, name, x.layout)
            )
        found = _torch_dtypes(torch).get(x.dtype)
        if found is None:
            raise TypeError(
                "mtxcomm.%s: %s has dtype %s, which mtxcomm does not support; "
                "supported: %s" % (what, name, x.dtype, _SUPPORTED)
            )
        code, as_dtype = found
        t = x.detach()
        if as_dtype is not None:
            t = t.view(as_dtype)
        return _Array(np.from_dlpack(t), code, "torch", x, torch_dtype=x.dtype)
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        platforms = {d.platform for d in x.devices()}
        if platforms != {"cpu"}:
            raise _device_error(what, name, "/".join(sorted(platforms)))
        try:
            a = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError):
            a = np.asarray(x)  # bfloat16: NumPy has no DLPack code for it (ml_dtypes view)
        if a.flags.writeable:
            a = a.view()
            a.flags.writeable = False  # JAX arrays are immutable
        return _Array(a, _dtype_code(a.dtype, what, name), "jax", x)
    if isinstance(x, np.ndarray):
        return _Array(x, _dtype_code(x.dtype, what, name), "numpy", x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device = x.__dlpack_device__()
        kind = int(device[0])
        if kind != 1:
            raise _device_error(
                what, name, "%s (DLPack device %d)" % (_DLPACK_DEVICES.get(kind, "non-CPU"), kind)
            )
        a = np.from_dlpack(x)
        return _Array(a, _dtype_code(a.dtype, what, name), "numpy", x)
    try:
        mv = memoryview(x)
    except TypeError:
        raise TypeError(
            "mtxcomm.%s: %s must be an array: an object with __dlpack__ (a NumPy "
            "array, a PyTorch CPU tensor, a JAX CPU array) or with the buffer "
            "protocol (bytes, bytearray, array.array); got %s" % (what, name, type(x).__name__)
        ) from None
    a = np.asarray(mv)
    return _Array(a, _dtype_code(a.dtype, what, name), "numpy", x)


def _input(x, what):
    """The input x, C-contiguous and aligned (a copy only when it is not)."""
    v = _view(x, what, "x")
    a = v.array
    if not (a.flags.c_contiguous and a.flags.aligned):
        v.array = np.ascontiguousarray(a)
        if not v.array.flags.aligned:
            v.array = v.array.copy()
        v.copied = True
    return v


def _output(out, x, what, shape=None):
    """out as a writable _Array of x's dtype (and of shape, when given); ValueError or TypeError
    naming the problem. Nothing is written before the call runs."""
    if out is None:
        return None
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(out, jax.Array):
        raise ValueError(
            "mtxcomm.%s: out is a JAX array; JAX arrays are immutable, so mtxcomm "
            "never writes them: omit out and use the returned array" % what
        )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor) and out.requires_grad:
        raise ValueError(
            "mtxcomm.%s: out requires grad; writing it in place would bypass "
            "autograd: pass a tensor that does not require grad (or out.detach())" % what
        )
    o = _view(out, what, "out")
    a = o.array
    if not a.flags.writeable:
        raise ValueError(
            "mtxcomm.%s: out is read-only (%s); mtxcomm never writes memory its "
            "producer does not allow writing: pass a writable array, or omit out"
            % (what, type(out).__name__)
        )
    if not (a.flags.c_contiguous and a.flags.aligned):
        raise ValueError(
            "mtxcomm.%s: out must be C-contiguous and aligned (got strides %s); "
            "omit out, or pass a contiguous array" % (what, a.strides)
        )
    if o.code != x.code:
        raise TypeError(
            "mtxcomm.%s: out has dtype %s but x has dtype %s"
            % (what, _shown_dtype(o), _shown_dtype(x))
        )
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(
            "mtxcomm.%s: out has shape %s but the result has shape %s"
            % (what, tuple(a.shape), tuple(shape))
        )
    return o


def _shown_dtype(v):
    return str(v.torch_dtype) if v.torch_dtype is not None else str(v.array.dtype)


def _span(a):
    start = a.__array_interface__["data"][0]
    return start, start + a.nbytes


def _check_overlap(x, o, what, in_place_ok):
    """in place (out is x's memory, exactly) where allowed; any other overlap is an error."""
    if o is None or x.array.nbytes == 0 or o.array.nbytes == 0:
        return
    xs, os_ = _span(x.array), _span(o.array)
    if xs[0] >= os_[1] or os_[0] >= xs[1]:
        return
    if in_place_ok and xs == os_:
        return
    raise ValueError(
        "mtxcomm.%s: out overlaps x%s; pass a separate out%s"
        % (
            what,
            "" if not in_place_ok else " without being exactly x's memory",
            "" if not in_place_ok else ", or out=x for in place",
        )
    )


def _framework(name):
    """A framework's module, which the caller's array already loaded (this module imports no
    framework of its own: tools/check_layers.py)."""
    return sys.modules[name]


def _wrap(v, array):
    """The result array (NumPy, over memory the engine filled) in v's family."""
    if v.family == "torch":
        t = _framework("torch").from_dlpack(array)
        return t.view(v.torch_dtype) if t.dtype != v.torch_dtype else t
    if v.family == "jax":
        jnp = _framework("jax.numpy")
        try:
            return jnp.from_dlpack(array)
        except (BufferError, TypeError, RuntimeError, ValueError):
            return jnp.asarray(array)  # bfloat16 (no DLPack code in NumPy): a copy
    return array


def _wrap_splits(v, received):
    a = np.asarray(received, dtype=np.int32)
    if v.family == "torch":
        return _framework("torch").from_numpy(a)
    if v.family == "jax":
        return _framework("jax.numpy").asarray(a)
    return a


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
