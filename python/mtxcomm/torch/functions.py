"""Helpers of the Horovod-style API built on its collectives (Horovod's
``horovod/torch/functions``): ``broadcast_object``, ``allgather_object`` (any picklable object),
``broadcast_parameters`` and ``broadcast_optimizer_state`` (a model's and an optimizer's state
from one rank to all).
"""

import io
import pickle

import torch

from mtxcomm.torch import _handles
from mtxcomm.torch._ops import _allgather_call, broadcast_, broadcast_async_, synchronize
from mtxcomm.torch.basics import need_init, rank

__all__ = [
    "broadcast_object",
    "allgather_object",
    "broadcast_parameters",
    "broadcast_optimizer_state",
]


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's obj (pickled) on every rank of the process set (root_rank: a global rank).
    Unnamed, its two broadcasts take the next unnamed numbers (the ranks' objects may be of
    different types, so no name is derived from them)."""
    need_init("broadcast_object")
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    base = name or "broadcast_object"
    broadcast_(
        length, root_rank, name=None if name is None else base + ".len", process_set=process_set
    )
    if rank() != root_rank:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    broadcast_(
        data, root_rank, name=None if name is None else base + ".data", process_set=process_set
    )
    if rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's obj (pickled), in rank order (of the process set's ranks): one allgather,
    named name or "allgather_object" (so that it pairs even where earlier unnamed calls of
    some ranks only, during a join, left the ranks' unnamed numbers apart)."""
    need_init("allgather_object")
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    call = _allgather_call([data], name or "allgather_object", "allgather_object", process_set)
    synchronize(_handles.register(call, None, name=call.key))
    gathered, rows = call.output
    out, offset = [], 0
    for n in rows[:, 0].tolist():
        out.append(pickle.loads(gathered[0][offset : offset + n].numpy().tobytes()))
        offset += n
    return out


def broadcast_parameters(params, root_rank):
    """Sets every rank's parameters to root_rank's, in place. params: a state_dict, an
    iterable of (name, tensor) pairs (named_parameters()) or of tensors."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [("param.%d" % i, p) for i, p in enumerate(items)]
    handles = []
    for n, p in items:
        if not isinstance(p, torch.Tensor):
            continue
        handles.append(
            broadcast_async_(p.data if p.requires_grad else p, root_rank, name="broadcast.%s" % n)
        )
    for h in handles:
        synchronize(h)


def _zero_grads_and_step(optimizer):
    """Creates a new optimizer's state (as Horovod does before broadcasting it): a zero
    gradient (sparse for SparseAdam) for every parameter that requires one, then one local
    step, without the DistributedOptimizer's reduction."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p.detach())
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    local_step = getattr(optimizer, "_local_step", None)
    (local_step or optimizer.step)()


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=None):
    """Sets every rank's optimizer state (state and param_groups, e.g. momentum buffers and
    the learning rate) to root_rank's. An optimizer without state yet gets it first, as in
    Horovod: zero gradients and one local step (which leaves those zero gradients)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(
            "mtxcomm.torch.broadcast_optimizer_state: cannot broadcast the state "
            "of torch.optim.LBFGS"
        )
    if not optimizer.state_dict()["state"]:
        _zero_grads_and_step(optimizer)
    state = broadcast_object(optimizer.state_dict(), root_rank, process_set=process_set)
    if rank() != root_rank:
        optimizer.load_state_dict(state)
