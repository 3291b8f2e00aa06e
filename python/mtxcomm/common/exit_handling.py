"""How a process of an mtxcomm job ends: on an error it ends the whole job, and the engine's
shutdown at exit reports what the ranks disagreed on.

An MPI job whose rank exits waits in MPI_Finalize for every other rank; one rank ending on an
error would leave the job waiting as long as another rank stays busy or hangs. Telling the
library first (``exiting_on_error``, the C API's ``mtxcomm_exiting_on_error``) skips that
MPI_Finalize, and ``mpirun`` ends the job. Every API that loads the library (the array API,
``mtxcomm.tensorflow``) calls ``end_job_on_uncaught_exception()`` once and shuts its engine down
at exit through ``shutdown_or_exit``.
"""

import atexit
import os
import sys


def exiting_on_error():
    """Says that this process is ending on an error (call it just before ``sys.exit(code)``
    with a non-zero code): its exit then skips the MPI_Finalize that would wait for every other
    rank of the job, so ``mpirun`` ends the job (the C API's ``mtxcomm_exiting_on_error``). An
    exception that ends the program does this by itself. No effect without MPI."""
    from mtxcomm import _core  # the C extension, loaded only on this path

    _core.exiting_on_error()


def shutdown_or_exit(shutdown, at_exit, error):
    """Runs a binding's engine shutdown, which returns (code, message): the destroy of the
    communicator fails where a check an earlier call left pending finds the ranks disagreeing
    (a broadcast returns before every peer has entered it). Raises ``error(code, message)``
    (the binding's exception for the C API's ``mtxcomm_result_t`` code); at exit, where Python
    would only print it and exit with 0, writes the message to standard error and ends the
    process with status 1 (skipping an MPI_Finalize that would wait for the other ranks)."""
    code, message = shutdown()
    if not code:
        return
    if not at_exit:
        raise error(code, message)
    sys.stderr.write("mtxcomm: error at exit: %s\n" % message)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream must not hide the exit status
            pass
    exiting_on_error()
    os._exit(1)


_exit_check = []


def ended_the_program(sys):
    """Whether the exception Python last reported as unhandled went up to the top of the
    program: its traceback starts in the main module's top level (``python script.py``,
    ``-c``) or in runpy (``-m``). Python records one in ``sys.last_*`` before it prints the
    traceback of an exception that ends the program, but so do tools that show a traceback
    and go on (pytest for a failed or xfailed test, the code module, IPython); their
    tracebacks start inside them. ``sys`` is the ``sys`` module (a stand-in in tests)."""
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


def end_job_on_uncaught_exception():
    """At exit, after an exception that ended the program (ended_the_program), tells the
    library (mtxcomm_exiting_on_error): the exit then skips the MPI_Finalize that would wait for
    every other rank, and the launcher ends the job, instead of this failed rank waiting as
    long as another one stays busy or hangs. Registered once, by whichever API loads the
    library."""
    if _exit_check:
        return

    def check():
        if ended_the_program(sys):
            exiting_on_error()

    _exit_check.append(check)
    atexit.register(check)
