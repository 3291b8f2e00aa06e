"""The collectives of the Horovod-style API (Horovod's ``horovod/torch/mpi_ops``): allreduce,
grouped_allreduce, sparse_allreduce_async, allgather, grouped_allgather, broadcast, alltoall,
reducescatter and grouped_reducescatter (each with its ``_async`` form, and ``_`` in-place forms
where Horovod has them), ``join`` and ``barrier``, the autograd Functions that make them
differentiable, and the reduction ops (``Sum``, ``Average``...). ``poll`` and ``synchronize``
(``_handles.py``) take the handles they return.

Every call of the global process set is submitted through one ``_work.Submitter`` (``"hvd"``) to
mtxcomm's engine, the tensors made buffers by ``_tensors``; a call on another process set runs
on that set's communicator (``process_sets.py``). The rules, as Horovod's:
- a named call pairs with the call of that name on every other rank, in any order; an unnamed
  one with the same-numbered unnamed call; a second call of a name still in flight on this rank
  raises ValueError;
- the engine checks that the ranks agree on each tensor's dtype and shape (all but dimension 0
  for allgather and alltoall), so ranks whose tensors merely have the same element count fail;
- integer tensors are scaled (prescale/postscale factors) in float64 and truncated toward zero;
- while a rank has joined (``join``), only allreduce runs: allgather, broadcast, alltoall and
  reducescatter raise on the ranks that called them. Each of those calls learns it from a
  one-element allreduce beside it that counts the ranks taking part (a joined rank stands in
  with 0; allgather's counts its own first step carries).

allgather and alltoall are two steps, the sizes then the data (``_handles.Call``): the call
returns at once, the data step is submitted as soon as the sizes are known.
"""

from mtxcomm import _arrays, _core
from mtxcomm.torch import process_sets
from mtxcomm.torch._allreduce import (  # noqa: F401
    _compression,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    sparse_allreduce_async,
)
from mtxcomm.torch._calls import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
)
from mtxcomm.torch._collectives import (  # noqa: F401
    _allgather_call,
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from mtxcomm.torch._handles import poll, synchronize
from mtxcomm.torch.basics import need_init

__all__ = [
    "Sum",
    "Average",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "synchronize",
    "poll",
    "join",
    "barrier",
]


# ---- join, barrier ----------------------------------------------------------------------------


def join(device=-1):
    """This rank has no more batches: until every rank has joined, the others' allreduces see
    zeros from it (their averages still divide by size()); their other collectives raise.
    Returns the last rank to join."""
    need_init("join")
    code, message, last = _core.join()
    if code:
        raise _arrays._error(code, message)
    return last


def barrier(process_set=None):
    """Returns once every rank of the process set (default: all) has called barrier."""
    need_init("barrier")
    comm = process_sets.communicator(process_set, "barrier")
    if comm is None:
        _arrays.barrier()
    else:
        comm.barrier()
