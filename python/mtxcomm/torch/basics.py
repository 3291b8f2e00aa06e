"""The process facts of the Horovod-style API: ``init``, ``shutdown``, ``is_initialized``,
``rank``, ``size``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size`` (Horovod's
``horovod/torch/basics``), and ``need_init``, the check the other modules of the API make first.
"""

import os

import torch.distributed as dist

from mtxcomm import _arrays, _core
from mtxcomm.common.build_flags import BuildFlags
from mtxcomm.torch import _bootstrap, backend
from mtxcomm.torch import process_sets as _process_sets
from mtxcomm.torch._bootstrap import need_init

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "need_init",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "cuda_built",
    "gloo_built",
    "gloo_enabled",
    "ccl_built",
    "ddl_built",
    "rocm_built",
    "mlsl_built",
]


def init(comm=None, process_sets=None):
    """Starts mtxcomm (collective): under mtxrun/mpirun or with MTXCOMM_STORE its own bootstrap;
    under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set) through
    ``torch.distributed.init_process_group("mtxcomm")``, so the default process group is this
    job too. Idempotent. process_sets (Horovod's): ProcessSets (or lists of ranks) to add
    (add_process_set) once started. comm (an MPI communicator): only None."""
    if comm is not None:
        raise NotImplementedError(
            "mtxcomm.torch.init: comm is not supported (mtxcomm runs "
            "the whole world; use process sets for subsets)"
        )
    _start()
    for ps in process_sets or ():
        _process_sets.add_process_set(ps)


def _start():
    if _core.is_initialized():
        return
    launched = _bootstrap.launched()
    torchrun = all(os.environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    if not launched and torchrun and not dist.is_initialized():
        dist.init_process_group(backend.BACKEND_NAME)
    else:
        _arrays.init()


def shutdown():
    """Frees the process sets' communicators, then stops mtxcomm on every rank."""
    _process_sets.close_all()
    _arrays.shutdown()


def is_initialized():
    return _core.is_initialized()


def _fact(value, what):
    need_init(what)
    return value()


def rank():
    return _fact(_core.rank, "rank")


def size():
    return _fact(_core.size, "size")


def local_rank():
    return _fact(_core.local_rank, "local_rank")


def local_size():
    return _fact(_core.local_size, "local_size")


def cross_size():
    """Nodes of the job (ranks per node being equal)."""
    return size() // local_size()


def cross_rank():
    return rank() // local_size()


# What this build has: Horovod's build queries (common/build_flags.py). torch's mpi_enabled and
# mpi_threads_supported answer mpi_built() (TensorFlow's differ, see there).
_build_flags = BuildFlags(
    _core.build_feature, mpi_enabled_needs_launcher=False, mpi_threads_need_mpi=True
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
