"""mtxcomm for PyTorch: the ``"mtxcomm"`` torch.distributed backend and a Horovod-style API.

``import mtxcomm.torch`` registers the backend (``mtxcomm/torch/backend.py``)::

    import mtxcomm.torch
    torch.distributed.init_process_group("mtxcomm")   # torchrun / env:// / mtxrun
    model = torch.nn.parallel.DistributedDataParallel(model)

``direct_all_reduce(tensor, op, group)`` is the C++ backend's in-place allreduce without
torch.distributed's dispatch (for tensor-parallel inference). ``import mtxcomm.torch`` is also
a drop-in for ``horovod.torch`` (``import mtxcomm.torch as hvd``): ``init``, ``rank``,
``size``, ``local_rank``, ``local_size``, ``allreduce``/``allreduce_``/``allreduce_async``/
``allreduce_async_``, ``grouped_allreduce`` (and ``_``/``_async`` forms),
``sparse_allreduce_async``, ``allgather``, ``grouped_allgather``, ``broadcast``/``broadcast_``,
``alltoall``, ``reducescatter``, ``grouped_reducescatter``, ``synchronize``/``poll``, ``join``,
``barrier``, ``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object``, ``DistributedOptimizer``, ``Compression``, process sets
(``ProcessSet``, ``global_process_set``, ``add_process_set``, ``remove_process_set``) and
Horovod's exception classes.

A call of the global process set runs on mtxcomm's engine, as the backend's and TensorFlow's
do; a named call (``name="..."``) pairs with the call of the same name on every other rank
whatever the order (Horovod's contract), an unnamed one with the same-numbered unnamed call.
A call of another process set runs on that set's own communicator. Tensors: CPU, dense (sparse
for allreduce), any dtype mtxcomm has. Results are new tensors (the ``_`` variants write in
place); allreduce, allgather, broadcast, alltoall and reducescatter have gradients, as in
Horovod.

The package, laid out as ``horovod.torch``: ``basics.py`` (init, rank, size, build queries),
``_ops.py`` (the rules, join, barrier) over ``_calls.py``, ``_allreduce.py`` and
``_collectives.py`` (the collectives and their gradients), ``_handles.py`` (calls in flight,
handles, names), ``functions.py`` (objects, parameters and optimizer state), ``optimizer.py``
(DistributedOptimizer), ``process_sets.py`` and ``_setcomm.py`` (process sets and their
communicators), ``compression.py``, ``exceptions.py``; under them and the backend
(``backend.py`` with ``_lists.py``, ``_p2p.py``, ``_sparse.py``, ``_group.py`` and ``_native.py``:
the C++ backend's choice), ``_bootstrap.py``, ``_tensors.py`` and ``_work.py``. This
module only re-exports.
"""

from mtxcomm.torch import backend  # noqa: F401  (registers the backend)
from mtxcomm.torch._native import direct_all_reduce  # noqa: F401
from mtxcomm.torch._ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from mtxcomm.torch.backend import MtxcommBackend, Work  # noqa: F401
from mtxcomm.torch.basics import (  # noqa: F401
    ccl_built,
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
from mtxcomm.torch.compression import Compression  # noqa: F401
from mtxcomm.torch.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from mtxcomm.torch.functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from mtxcomm.torch.optimizer import DistributedOptimizer  # noqa: F401
from mtxcomm.torch.process_sets import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)

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
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "allgather",
    "allgather_async",
    "broadcast",
    "grouped_allreduce_",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "synchronize",
    "poll",
    "join",
    "barrier",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "DistributedOptimizer",
    "Compression",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "mpi_built",
    "mpi_enabled",
    "nccl_built",
    "gloo_built",
    "cuda_built",
    "rocm_built",
    "mpi_threads_supported",
    "gloo_enabled",
    "ccl_built",
    "ddl_built",
    "mlsl_built",
    "direct_all_reduce",
]
