"""mtxcomm.tensorflow's basics: init(), shutdown(), the process facts (rank(), size(),
local_rank(), local_size(), cross_rank(), cross_size(), cpu_share()) and Horovod's build queries
(mpi_built() and the others), over the engine in the binding's shared object (``_library.py``).

init() also sizes TensorFlow's thread pools to this rank's share of its node's cores. The
process facts raise ValueError before init(); rank(), size()... and the build queries are those
of ``mtxcomm.common`` (``basics.Basics``, ``build_flags.BuildFlags``) over this engine.
"""

import atexit

import tensorflow as tf

from mtxcomm.common import exit_handling
from mtxcomm.common.basics import Basics
from mtxcomm.common.build_flags import BuildFlags
from mtxcomm.tensorflow import _library

_engine = _library.engine

exit_handling.end_job_on_uncaught_exception()


def init(comm=None, process_sets=None):
    """Starts mtxcomm on every rank (collective): creates the world communicator from the
    environment (``mpirun``/``mtxrun``, or ``MTXCOMM_RANK``/``MTXCOMM_SIZE``/``MTXCOMM_STORE``;
    a lone process is a job of one rank) and the background engine. Calling it again is a
    no-op. ``comm`` and ``process_sets`` (Horovod's) are accepted only as None.

    Raises RuntimeError with the library's message (bad MTXCOMM_* value, unreachable peers).
    """
    if comm is not None or process_sets is not None:
        raise NotImplementedError(
            "mtxcomm.tensorflow.init: comm and process_sets are not "
            "supported; every rank of the job is one communicator"
        )
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
        (
            "TF_NUM_INTRAOP_THREADS",
            threading.get_intra_op_parallelism_threads,
            threading.set_intra_op_parallelism_threads,
            share,
        ),
        (
            "TF_NUM_INTEROP_THREADS",
            threading.get_inter_op_parallelism_threads,
            threading.set_inter_op_parallelism_threads,
            share,
        ),
    ):
        if os.environ.get(env) or getter() != 0:
            _log_info(
                "placement: %s kept as the user set it (%s)"
                % (env, os.environ.get(env) or getter())
            )
            continue
        try:
            setter(value)
            done.append("%s=%d" % (env, value))
        except RuntimeError:
            import warnings

            warnings.warn(
                "mtxcomm.tensorflow: TensorFlow's thread pools were created before "
                "init(), so they keep their size (every core of the node on every "
                "rank); call init() before running any TensorFlow op, or launch with "
                "mtxrun, which sets %s=%d" % (env, value),
                stacklevel=3,
            )
            return
    if done:
        _log_info("placement: this rank's share is %d core(s): %s" % (share, ", ".join(done)))


def shutdown():
    """Stops the engine on every rank: requests still waiting, here or on other ranks, fail
    with an error naming the rank that shut down. Idempotent; also run at exit. Raises where
    the ranks disagreed on a call no later call checked (``mtxcomm.shutdown``); at exit that
    error is written to standard error and the process exits with status 1."""
    exit_handling.shutdown_or_exit(_engine.shutdown, at_exit=False, error=_library_error)


def _library_error(code, message):
    """The exception for a C API code: the array API's (``mtxcomm.Error`` and its subclasses),
    which both APIs raise at shutdown; its module is loaded only to raise one."""
    from mtxcomm import _arrays

    return _arrays._error(code, message)


atexit.register(
    lambda: exit_handling.shutdown_or_exit(_engine.shutdown, at_exit=True, error=_library_error)
)


def is_initialized():
    """True between init() and shutdown() (and until a communication failure)."""
    return bool(_engine.is_initialized())


_basics = Basics(
    _engine,
    started=lambda: _engine.rank() >= 0,
    not_started="mtxcomm.tensorflow.%s(): mtxcomm has not been initialised; call hvd.init() first",
)
_check_init = _basics.check_init
rank = _basics.rank
size = _basics.size
local_rank = _basics.local_rank
local_size = _basics.local_size
cross_rank = _basics.cross_rank
cross_size = _basics.cross_size


def cpu_share():
    """This rank's share of its node's cores: the threads its work should use."""
    _check_init("cpu_share")
    return int(_engine.cpu_share())


def _collective_count():
    """Library collectives this rank's engine has run for submitted tensors (tests)."""
    return int(_engine.collective_count())


def _inline_cycle_count():
    """Engine cycles this rank's submitting threads ran themselves (tests, profiling)."""
    return int(_engine.inline_cycle_count())


# ---- what this build has (Horovod's build queries, answered for mtxcomm) ------------------

_build_flags = BuildFlags(
    _engine.build_feature, mpi_enabled_needs_launcher=True, mpi_threads_need_mpi=False
)
mpi_built = _build_flags.mpi_built
mpi_enabled = _build_flags.mpi_enabled
mpi_threads_supported = _build_flags.mpi_threads_supported
nccl_built = _build_flags.nccl_built
cuda_built = _build_flags.cuda_built
gloo_built = _build_flags.gloo_built
gloo_enabled = _build_flags.gloo_enabled
ccl_built = _build_flags.ccl_built
ddl_built = _build_flags.ddl_built
rocm_built = _build_flags.rocm_built
mlsl_built = _build_flags.mlsl_built
