"""Horovod's build queries (``hvd.mpi_built()``, ``hvd.nccl_built()``...), answered for mtxcomm.

A binding makes one ``BuildFlags`` over its engine module's ``build_feature`` (the C API's
``mtxcomm_get_build_feature``: "mpi", "ucx", "cuda", "nccl", "hwloc") and exports its bound
methods under Horovod's names::

    _flags = BuildFlags(_engine.build_feature)
    mpi_built = _flags.mpi_built

Two answers differ between the bindings, as they did before they shared this module; each
binding chooses its own with the constructor's keywords:

- ``mpi_enabled()``: TensorFlow says whether this job was started by an MPI launcher *and*
  mtxcomm was built with MPI (``mpi_enabled_needs_launcher=True``, the default); torch says
  whether mtxcomm was built with MPI (``mpi_enabled_needs_launcher=False``).
- ``mpi_threads_supported()``: TensorFlow answers True (``mpi_threads_need_mpi=False``, the
  default); torch answers ``mpi_built()`` (``mpi_threads_need_mpi=True``).

Backends mtxcomm does not have (Gloo, oneCCL, DDL, ROCm, MLSL) are always False.
"""

import os

# The environment of a process started by an MPI launcher: Open MPI's mpirun, PMIx and PMI
# launchers (MPICH's hydra, Slurm with --mpi), or srun inside a job step.
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def launched_by_mpi():
    """True when this process was started by an MPI launcher (mpirun, srun)."""
    return any(os.environ.get(v) for v in _MPI_LAUNCHER_VARS) or bool(
        os.environ.get("SLURM_PROCID") and os.environ.get("SLURM_STEP_ID")
    )


class BuildFlags:
    """The build queries of one binding.

    Args:
      build_feature: the binding's engine function feature (str) -> bool.
      mpi_enabled_needs_launcher: mpi_enabled() also requires an MPI launcher (TensorFlow's
        answer); False: mpi_enabled() is mpi_built() (torch's).
      mpi_threads_need_mpi: mpi_threads_supported() is mpi_built() (torch's answer); False:
        always True (TensorFlow's).
    """

    def __init__(self, build_feature, mpi_enabled_needs_launcher=True, mpi_threads_need_mpi=False):
        self._build_feature = build_feature
        self._mpi_enabled_needs_launcher = mpi_enabled_needs_launcher
        self._mpi_threads_need_mpi = mpi_threads_need_mpi

    def _built(self, feature):
        return bool(self._build_feature(feature))

    def mpi_built(self):
        """True when this mtxcomm was built with its MPI bootstrap and transport."""
        return self._built("mpi")

    def mpi_enabled(self):
        """True when mtxcomm was built with MPI and (TensorFlow's answer) this job was started
        by an MPI launcher (mpirun, srun): the ranks bootstrap through MPI."""
        if self._mpi_enabled_needs_launcher:
            return self.mpi_built() and launched_by_mpi()
        return self.mpi_built()

    def mpi_threads_supported(self):
        """Horovod's question whether MPI supports multi-threading: TensorFlow's binding
        answers True, torch's answers mpi_built() (each binding's answer from before they
        shared this module)."""
        if self._mpi_threads_need_mpi:
            return self.mpi_built()
        return True

    def nccl_built(self):
        """As Horovod's: NCCL_VERSION_CODE (e.g. 23007 for 2.30.7) when this build has mtxcomm's
        NCCL device path and NCCL loads (mtxcomm loads it at run time), else 0."""
        if not self._built("nccl"):
            return 0
        from mtxcomm import _core

        return int(_core.nccl_version())

    def cuda_built(self):
        """True when this build takes CUDA device buffers (nvcc found at install)."""
        return self._built("cuda")

    @staticmethod
    def gloo_built():
        """mtxcomm has no Gloo: its own TCP and shared-memory transports take that role."""
        return False

    @staticmethod
    def gloo_enabled():
        """mtxcomm has no Gloo (gloo_built)."""
        return False

    @staticmethod
    def ccl_built():
        """mtxcomm has no oneCCL."""
        return False

    @staticmethod
    def ddl_built():
        """mtxcomm has no IBM DDL."""
        return False

    @staticmethod
    def rocm_built():
        """mtxcomm has no ROCm device path."""
        return False

    @staticmethod
    def mlsl_built():
        """mtxcomm has no Intel MLSL."""
        return False
