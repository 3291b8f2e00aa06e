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


def exiting_on_error():
    """Says that this process is ending on an error (call it just before ``sys.exit(code)``
    with a non-zero code): its exit then skips the MPI_Finalize that would wait for every other
    rank of the job, so ``mpirun`` ends the job (the C API's ``mtxcomm_exiting_on_error``). An
    exception that ends the program does this by itself. No effect without MPI."""
    from mtxcomm import _core
    _core.exiting_on_error()


def _shutdown_or_exit(shutdown, at_exit):
    """Runs a binding's engine shutdown, which returns (code, message): the destroy of the
    communicator fails where a check an earlier call left pending finds the ranks disagreeing
    (a broadcast returns before every peer has entered it). Raises that error; at exit, where
    Python would only print it and exit with 0, writes it to standard error and ends the
    process with status 1 (skipping an MPI_Finalize that would wait for the other ranks)."""
    code, message = shutdown()
    if not code:
        return
    if not at_exit:
        from mtxcomm import _arrays
        raise _arrays._error(code, message)
    import os
    import sys
    sys.stderr.write("mtxcomm: error at exit: %s\n" % message)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream must not hide the exit status
            pass
    exiting_on_error()
    os._exit(1)


_exit_check = []


def _ended_the_program(sys):
    """Whether the exception Python last reported as unhandled went up to the top of the
    program: its traceback starts in the main module's top level (``python script.py``,
    ``-c``) or in runpy (``-m``). Python records one in ``sys.last_*`` before it prints the
    traceback of an exception that ends the program, but so do tools that show a traceback
    and go on (pytest for a failed or xfailed test, the code module, IPython); their
    tracebacks start inside them."""
    if hasattr(sys, "ps1"):  # an interactive session goes on after a traceback
        return False
    ended = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(ended, "__traceback__", None) or getattr(sys, "last_traceback", None)
    if ended is None or tb is None:
        return False
    frame = tb.tb_frame
    code = frame.f_code
    if code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
        return True
    return code.co_filename.endswith(("runpy.py", "<frozen runpy>"))


def _end_job_on_uncaught_exception():
    """At exit, after an exception that ended the program (_ended_the_program), tells the
    library (mtxcomm_exiting_on_error): the exit then skips the MPI_Finalize that would wait for
    every other rank, and the launcher ends the job, instead of this failed rank waiting as
    long as another one stays busy or hangs. Registered once, by whichever API loads the
    library."""
    if _exit_check:
        return
    import atexit
    import sys

    def check():
        if _ended_the_program(sys):
            exiting_on_error()

    _exit_check.append(check)
    atexit.register(check)


def __getattr__(name):
    if name in _ARRAY_API:
        from mtxcomm import _arrays
        value = getattr(_arrays, name)
        globals()[name] = value
        return value
    raise AttributeError("module 'mtxcomm' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | _ARRAY_API)
