"""mtxcomm for Keras 3 (TensorFlow backend), Horovod-compatible.

``import mtxcomm.tensorflow.keras as hvd`` runs a Horovod Keras script unchanged but for the
import::

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)
"""

# Re-exported, as Horovod's keras module does (and the private names this module uses).
from mtxcomm.tensorflow import elastic  # noqa: F401
from mtxcomm.tensorflow._keras_optimizer import (  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
    _current_grad_scale,
    _step_state,
)
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
    allgather_object,
    broadcast_object,
    broadcast_variables,
)
from mtxcomm.tensorflow.keras import callbacks  # noqa: F401
from mtxcomm.tensorflow.optimizer import (  # noqa: F401
    DistributedGradientTape,
    PartialDistributedGradientTape,
    _allreduce_gradients,
    _check_optimizer_options,
    _local_flags,
    _source_keys,
)
from mtxcomm.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401


def broadcast_global_variables(root_rank):
    """Horovod's TF1 helper has no meaning without a global graph: use
    broadcast_variables(model.variables, root_rank) or BroadcastGlobalVariablesCallback."""
    raise NotImplementedError(
        "broadcast_global_variables: use "
        "hvd.broadcast_variables(model.variables, root_rank) or "
        "hvd.callbacks.BroadcastGlobalVariablesCallback"
    )


def load_model(filepath, custom_optimizers=None, custom_objects=None, compile=True):
    """keras.saving.load_model, then the optimizer made distributed (Horovod's load_model)."""
    import keras

    model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile)
    if compile and model.optimizer is not None:
        DistributedOptimizer(model.optimizer)
    return model
