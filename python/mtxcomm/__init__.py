"""mtxcomm: collective communication for data-parallel deep learning.

The C library (allreduce, broadcast, allgather, reduce-scatter, alltoall over shared memory, MPI
and TCP) is used from Python through:

- the array API, here: ``mtxcomm.init()``, ``mtxcomm.allreduce(x, op="sum")``,
  ``broadcast``, ``allgather``, ``reduce_scatter``, ``alltoall``, ``barrier``, ``rank()``,
  ``size()``... on NumPy arrays, PyTorch CPU tensors, JAX CPU arrays and buffer-protocol
  objects, zero-copy; results in the caller's array type (see ``mtxcomm._arrays`` and
  docs/arrays.md);
- ``mtxcomm.tensorflow`` and ``mtxcomm.tensorflow.keras``: a Horovod-compatible API for
  TensorFlow 2 / Keras 3 (``import mtxcomm.tensorflow.keras as hvd``), over the same engine
  (one communicator per process, whichever API initialised it);
- ``mtxrun``: launches N processes through Open MPI's ``mpirun``; with ``--transparent`` an
  unmodified Keras script trains data-parallel.

The array API is loaded on first use, so that ``mtxrun`` and ``import mtxcomm.tensorflow`` do
not load its module.
"""

from mtxcomm.common import exit_handling as _exit_handling

# This package's names for the exit handling (common/exit_handling.py).
exiting_on_error = _exit_handling.exiting_on_error
_ended_the_program = _exit_handling.ended_the_program
_end_job_on_uncaught_exception = _exit_handling.end_job_on_uncaught_exception

__version__ = "0.1.0"

_ARRAY_API = frozenset(
    (
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
    )
)


def _shutdown_or_exit(shutdown, at_exit):
    """``common.exit_handling.shutdown_or_exit`` raising the array API's errors
    (``mtxcomm.Error`` and its subclasses, by the C API's code)."""
    _exit_handling.shutdown_or_exit(shutdown, at_exit, _array_error)


def _array_error(code, message):
    """The array API's exception for a C API code; its module is loaded only to raise one."""
    from mtxcomm import _arrays

    return _arrays._error(code, message)


def __getattr__(name):
    if name in _ARRAY_API:
        from mtxcomm import _arrays

        value = getattr(_arrays, name)
        globals()[name] = value
        return value
    raise AttributeError("module 'mtxcomm' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | _ARRAY_API)
