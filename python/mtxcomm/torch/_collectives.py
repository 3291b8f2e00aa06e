"""The other collectives of the Horovod-style API: allgather, grouped_allgather, broadcast,
alltoall, reducescatter and grouped_reducescatter (each with its ``_async`` form, and ``_``
in-place forms where Horovod has them), and the autograd Functions that make them
differentiable (``_ops.py`` holds the rules).
"""

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _handles, _tensors
from mtxcomm.torch._allreduce import (  # noqa: F401
    _compression,
    _scale_,
    _scaled,
    allreduce,
    allreduce_async,
    grouped_allreduce_async,
)
from mtxcomm.torch._calls import (  # noqa: F401
    _INT64,
    Average,
    Sum,
    _allgather_call,
    _check_present,
    _gather_inputs,
    _gathered,
    _presence,
    _start,
    _submit_by_dtype,
    _submitter,
    _took_slot,
    _two_step_names,
    allgather_async,
    grouped_allgather_async,
)
from mtxcomm.torch._handles import synchronize
from mtxcomm.torch.basics import rank, size

# ---- allgather --------------------------------------------------------------------------------


def _own_rows(grads, rows, process_set):
    """Horovod's gradient of allgather: the gradients averaged over the ranks, of which each
    rank keeps the rows it gave. rows: int64 [ranks, tensors] from the forward call."""
    me = rank() if process_set is None else process_set.rank()
    reduced = synchronize(
        grouped_allreduce_async(
            [g.contiguous() for g in grads], op=Average, process_set=process_set
        )
    )
    starts = rows[:me].sum(0).tolist()
    return tuple(g[s : s + int(n)] for g, s, n in zip(reduced, starts, rows[me].tolist()))


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        call = _allgather_call(list(tensors), name, "allgather", process_set)
        h = _handles.register(call, None, post=_gathered(call), name=call.key)
        outs = synchronize(h)
        ctx.rows = call.output[1]
        ctx.process_set = process_set
        ctx.scalar = [t.dim() == 0 for t in tensors]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        mine = _own_rows(grads, ctx.rows, ctx.process_set)
        mine = tuple(g.reshape(()) if s else g for g, s in zip(mine, ctx.scalar))
        return (None, None) + mine


def allgather(tensor, name=None, process_set=None):
    """Every rank's tensor concatenated along dimension 0, in rank order; differentiable (as
    Horovod: the gradient averaged over the ranks, each keeping its rows)."""
    return _AllgatherFn.apply(name, process_set, tensor)[0]


def grouped_allgather(tensors, name=None, process_set=None):
    """allgather of several tensors as one request (one per dtype); differentiable."""
    return list(_AllgatherFn.apply(name, process_set, *tensors))


# ---- broadcast --------------------------------------------------------------------------------


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """root_rank's tensor (a global rank, also with a process set) into tensor on every rank,
    asynchronously; returns a handle."""
    what = "broadcast"
    comm, key = _start(name, what, process_set)
    _tensors.check(tensor, what)
    ranks = list(range(size())) if comm is None else process_set.ranks
    if int(root_rank) not in ranks:
        raise ValueError(
            "mtxcomm.torch.broadcast: root_rank %d is not a rank of the process "
            "set (ranks %s)" % (root_rank, ranks)
        )
    b = _tensors.Buf(tensor.detach(), what, complex_ok=True)

    def finish(_):
        b.copy_back()

    if comm is not None:
        call = comm.broadcast(b, process_set.ranks.index(int(root_rank)), finish, what, name)
    else:
        p = _submitter.submit(
            _core.KIND_BROADCAST,
            [b.ptr()],
            b.code,
            [b.dims()],
            [b.ptr()],
            [b.dims()],
            root=int(root_rank),
            name=name,
        )
        work = _submitter.work(what, [p], [tensor], b, finish)
        present, check = _presence(name, what)
        call = _handles.Call([work, present], check=check)
    return _handles.register(call, tensor, name=key)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """root_rank's tensor as a new tensor on every rank, asynchronously; returns a handle."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = synchronize(
            allreduce_async(grad.contiguous(), op=Average, process_set=ctx.process_set)
        )
        if rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's tensor on every rank, as a new tensor; differentiable."""
    return _BroadcastFn.apply(tensor, root_rank, name, process_set)


# ---- alltoall ---------------------------------------------------------------------------------


def _rows_input(tensor, what):
    """tensor, detached and checked, with a dimension 0 to scatter."""
    _tensors.check(tensor, what)
    t = tensor.detach()
    if t.dim() == 0:
        raise ValueError("mtxcomm.torch.%s: a scalar has no rows to scatter" % what)
    return t


def _splits_of(t, splits, n, what):
    if splits is None:
        if t.shape[0] % n:
            raise ValueError(
                "mtxcomm.torch.alltoall: %d rows do not split evenly over %d ranks "
                "(give splits)" % (t.shape[0], n)
            )
        return [t.shape[0] // n] * n
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    # This rank's own bad splits are raised before anything is sent.
    if len(splits) != n or min(splits) < 0 or sum(splits) != t.shape[0]:
        raise ValueError(
            "mtxcomm.torch.alltoall: splits %s do not split %d rows over %d ranks "
            "(%d non-negative counts adding up to dimension 0)" % (splits, t.shape[0], n, n)
        )
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Rank r sends rows [sum(splits[:j]), sum(splits[:j+1])) of dimension 0 to rank j,
    asynchronously; returns a handle whose result is (the rows received, in rank order, and
    an int32 tensor of the rows received from each rank)."""
    what = "alltoall"
    comm, key = _start(name, what, process_set)
    t = _rows_input(tensor, what)
    n = size() if comm is None else process_set.size()
    splits = _splits_of(t, splits, n, what)
    b = _tensors.Buf(t, what)
    if comm is not None:
        call = comm.alltoall(t, b, splits, what, name)
        return _handles.register(call, None, post=lambda _: call.output, name=key)
    sizes_name, data_name, slot = _two_step_names(name)
    # The first step: the rows each rank receives from each (a small alltoall), beside the
    # count of the ranks taking part.
    sp = torch.tensor(splits, dtype=torch.int64)
    recv = torch.empty(n, dtype=torch.int64)
    p0 = _submitter.submit(
        _core.KIND_ALLTOALL,
        [sp.data_ptr()],
        _INT64,
        [[n]],
        [recv.data_ptr()],
        [[n]],
        splits=[1] * n,
        name=sizes_name,
    )
    sizes = _submitter.work(what, [p0], [recv], (sp, recv))
    present, check = _presence(data_name, what)

    def then():
        check()
        out = torch.empty((int(recv.sum()),) + tuple(t.shape[1:]), dtype=t.dtype)
        o = _tensors.Buf(out, what)
        p = _submitter.submit(
            _core.KIND_ALLTOALL,
            [b.ptr()],
            b.code,
            [b.dims()],
            [o.ptr()],
            [o.dims()],
            splits=splits,
            name=data_name,
        )
        return [_submitter.work(what, [p], [out], (b, o))], (out, recv.to(torch.int32))

    call = _handles.Call([sizes, present], then=then)
    _took_slot(slot, call)
    return _handles.register(call, None, post=lambda _: call.output, name=key)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, recv = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = recv, process_set
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, _):
        back, _r = synchronize(
            alltoall_async(grad.contiguous(), ctx.received, process_set=ctx.process_set)
        )
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Rank r sends rows [sum(splits[:j]), sum(splits[:j+1])) of dimension 0 to rank j
    (splits: a list or tensor of one count per rank, default equal); returns the rows received
    in rank order, and with splits given also the counts received from each rank (as
    Horovod). Differentiable."""
    out, recv = _AlltoallFn.apply(tensor, splits, name, process_set)
    return (out, recv) if splits is not None else out


# ---- reducescatter ----------------------------------------------------------------------------


def _reducescatter_call(tensors, op, name, prescale, postscale, what, process_set):
    """One reduce-scatter of tensors (one request per dtype): a Call whose output is the list
    of this rank's rows of each reduction."""
    comm, key = _start(name, what, process_set)
    op = _arrays._op(op, what)
    ts = [_rows_input(t, what) for t in tensors]
    n, r = (size(), rank()) if comm is None else (process_set.size(), process_set.rank())
    srcs = [_scaled(t, prescale) if prescale != 1.0 else t for t in ts]
    bufs = [_tensors.Buf(s, what) for s in srcs]
    # Horovod's split: d0 // n rows each, one more on the first d0 % n ranks.
    outs = [
        torch.empty(
            (t.shape[0] // n + (1 if r < t.shape[0] % n else 0),) + tuple(t.shape[1:]),
            dtype=t.dtype,
        )
        for t in ts
    ]
    obufs = [_tensors.Buf(o, what) for o in outs]

    def finish(_):
        if postscale != 1.0:
            for o in outs:
                _scale_(o, postscale)

    if comm is not None:
        call = comm.reducescatter(bufs, obufs, op, finish, what, outs, name)
        call.key = key
        return call
    ps = _submit_by_dtype(_core.KIND_REDUCE_SCATTER, bufs, obufs, name, what, op)
    work = _submitter.work(what, ps, outs, (bufs, obufs, srcs), finish)
    present, check = _presence(name, what)
    call = _handles.Call([work, present], check=check, output=outs)
    call.key = key
    return call


def reducescatter_async(
    tensor, name=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0
):
    """reducescatter, asynchronously; returns a handle."""
    call = _reducescatter_call(
        [tensor], op, name, prescale_factor, postscale_factor, "reducescatter", process_set
    )
    return _handles.register(call, None, post=lambda _: call.output[0], name=call.key)


def grouped_reducescatter_async(
    tensors, name=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0
):
    """reducescatter of several tensors as one request (one per dtype), asynchronously; returns a
    handle whose result is the list of this rank's rows of each."""
    call = _reducescatter_call(
        list(tensors),
        op,
        name,
        prescale_factor,
        postscale_factor,
        "grouped_reducescatter",
        process_set,
    )
    return _handles.register(call, None, post=lambda _: list(call.output), name=call.key)


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(
            synchronize(
                grouped_reducescatter_async(tensors, name, op, process_set, prescale, postscale)
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        # As Horovod: the allgather of the gradients, times the set's size for Sum, times the
        # prescale and postscale factors.
        op, prescale, postscale, process_set = ctx.args
        factor = (
            prescale
            * postscale
            * ((size() if process_set is None else process_set.size()) if op == Sum else 1)
        )
        grads = [g * factor if factor != 1 else g for g in grads]
        gathered = grouped_allgather(grads, process_set=process_set)
        return (None, None, None, None, None) + tuple(gathered)


def reducescatter(
    tensor,
    name=None,
    compression=None,
    op=Average,
    process_set=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """The reduction of tensor (the same shape on every rank) over the ranks, of which rank r
    keeps its rows of dimension 0: d0 // size() rows, one more on the first d0 % size();
    differentiable (as Horovod: the allgather of the gradient, times size() for Sum)."""
    compression = _compression(compression)
    t, ctx = compression.compress(tensor)
    out = _ReducescatterFn.apply(op, name, prescale_factor, postscale_factor, process_set, t)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors,
    name=None,
    compression=None,
    op=Average,
    process_set=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """reducescatter of several tensors as one request (one per dtype); differentiable."""
    compression = _compression(compression)
    compressed = [compression.compress(t) for t in tensors]
    outs = _ReducescatterFn.apply(
        op, name, prescale_factor, postscale_factor, process_set, *[c[0] for c in compressed]
    )
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]
