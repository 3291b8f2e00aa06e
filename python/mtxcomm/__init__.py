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

__version__ = "0.1.0"

_ARRAY_API = frozenset((
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "barrier",
    "ReduceOp", "SUM", "PROD", "MIN", "MAX", "AVG", "ADASUM",
    "Error", "InvalidArgumentError", "InvalidUsageError", "RemoteError", "TimeoutError",
))


def _end_job_on_uncaught_exception(exiting_on_error):
    """Chains sys.excepthook so that an exception ending the program tells the library first
    (mtxcomm_exiting_on_error): the exit then skips the MPI_Finalize that would wait for every
    other rank, and the launcher ends the job, instead of this failed rank waiting as long as
    another one stays busy or hangs. Installed once, by whichever API loads the library."""
    import sys
    if getattr(sys.excepthook, "_mtxcomm", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            if not hasattr(sys, "ps1"):  # (in an interactive session the program goes on)
                exiting_on_error()
        finally:
            previous(kind, value, tb)

    hook._mtxcomm = True
    sys.excepthook = hook


def __getattr__(name):
    if name in _ARRAY_API:
        from mtxcomm import _arrays
        value = getattr(_arrays, name)
        globals()[name] = value
        return value
    raise AttributeError("module 'mtxcomm' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | _ARRAY_API)
