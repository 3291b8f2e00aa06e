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

The package, laid out as ``horovod.tensorflow``: ``basics.py`` (init, shutdown, rank, size...,
the build queries), ``_ops.py`` (the collectives, join, the reduction ops, their gradients),
``compression.py``, ``functions.py`` (Python objects, variables), ``optimizer.py``
(DistributedGradientTape, DistributedOptimizer), ``elastic.py``, ``sync_batch_norm.py`` and
``keras/``; ``_library.py`` loads the binding's shared object. What the bindings share is in
``mtxcomm.common``. This module only re-exports.
"""

from mtxcomm.tensorflow import elastic, util  # noqa: F401
from mtxcomm.tensorflow._ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    _resolve_op,
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    local_rank_op,
    local_size_op,
    rank_op,
    reducescatter,
    size_op,
)
from mtxcomm.tensorflow.basics import (  # noqa: F401
    _collective_count,
    _inline_cycle_count,
    ccl_built,
    cpu_share,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mlsl_built,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from mtxcomm.tensorflow.compression import Compression  # noqa: F401
from mtxcomm.tensorflow.functions import (  # noqa: F401
    _run,
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    is_homogeneous,
)
from mtxcomm.tensorflow.optimizer import (  # noqa: F401
    DistributedGradientTape,
    DistributedOptimizer,
    PartialDistributedGradientTape,
    _allreduce_gradients,
    _check_optimizer_options,
    _local_flags,
    _source_keys,
)
from mtxcomm.tensorflow.util import _executing_eagerly  # noqa: F401


def __getattr__(name):
    # Needs Keras: loaded on first use, so that a TensorFlow-only script does not import it.
    if name == "SyncBatchNormalization":
        from mtxcomm.tensorflow.sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


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
    "rank_op",
    "local_rank_op",
    "size_op",
    "local_size_op",
    "Sum",
    "Average",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "Compression",
    "allreduce",
    "grouped_allreduce",
    "broadcast",
    "broadcast_",
    "allgather",
    "grouped_allgather",
    "reducescatter",
    "grouped_reducescatter",
    "alltoall",
    "broadcast_variables",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "DistributedOptimizer",
    "join",
    "cpu_share",
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
    "is_homogeneous",
    "elastic",
]
