"""allreduce of the Horovod-style API: ``allreduce``, ``allreduce_``, ``grouped_allreduce``
(each with its ``_async`` forms), ``sparse_allreduce_async``, prescale/postscale factors, and
the autograd Functions that make them differentiable (``_ops.py`` holds the rules).
"""

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _handles, _tensors
from mtxcomm.torch._calls import (  # noqa: F401
    Average,
    Sum,
    _op_of,
    _start,
    _submit_by_dtype,
    _submitter,
    allgather_async,
)
from mtxcomm.torch._handles import synchronize
from mtxcomm.torch.basics import size
from mtxcomm.torch.compression import Compression

# ---- allreduce --------------------------------------------------------------------------------


def _scaled(t, factor):
    """t * factor. Integers, as Horovod scales them: in float64, the product truncated toward
    zero (a C cast: 0.9 * -7 -> -6)."""
    if t.is_floating_point() or t.is_complex():
        return t * factor
    return (t.to(torch.float64) * factor).to(t.dtype)


def _scale_(t, factor):
    """t *= factor in place (integers as _scaled)."""
    if t.is_floating_point() or t.is_complex():
        t.mul_(factor)
    else:
        t.copy_((t.to(torch.float64) * factor).to(t.dtype))


def _allreduce_call(tensors, outputs, op, name, prescale, postscale, what, process_set):
    """One allreduce request of tensors (read) into outputs (written): a Call."""
    comm, key = _start(name, what, process_set)
    for t in list(tensors) + list(outputs):
        _tensors.check(t, what)
    srcs = [t.detach() if prescale == 1.0 else _scaled(t.detach(), prescale) for t in tensors]
    ins = [_tensors.Buf(s, what) for s in srcs]
    bufs = [_tensors.Buf(o.detach(), what) for o in outputs]

    def finish(_):
        for b, o in zip(bufs, outputs):
            b.copy_back()
            if postscale != 1.0:
                _scale_(o.detach(), postscale)

    if comm is not None:
        call = comm.allreduce(ins, bufs, op, finish, what, name)
    else:
        ps = _submit_by_dtype(_core.KIND_ALLREDUCE, ins, bufs, name, what, op)
        call = _handles.Call([_submitter.work(what, ps, list(outputs), (ins, bufs), finish)])
    call.key = key
    return call


def _empty_like(t):
    return torch.empty_like(t.detach(), memory_format=torch.contiguous_format)


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """Reduces tensor over the ranks in place, asynchronously; returns a handle."""
    op = _op_of(op, average, "allreduce_async_")
    call = _allreduce_call(
        [tensor], [tensor], op, name, prescale_factor, postscale_factor, "allreduce", process_set
    )
    return _handles.register(call, tensor, name=call.key)


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """Reduces a copy of tensor over the ranks, asynchronously; returns a handle."""
    op = _op_of(op, average, "allreduce_async")
    out = _empty_like(tensor)
    call = _allreduce_call(
        [tensor], [out], op, name, prescale_factor, postscale_factor, "allreduce", process_set
    )
    return _handles.register(call, out, name=call.key)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return synchronize(
            allreduce_async(
                tensor,
                op=op,
                name=name,
                prescale_factor=prescale,
                postscale_factor=postscale,
                process_set=process_set,
            )
        )

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (
            synchronize(
                allreduce_async(
                    grad.contiguous(),
                    op=op,
                    prescale_factor=prescale,
                    postscale_factor=postscale,
                    process_set=process_set,
                )
            ),
            None,
            None,
            None,
            None,
            None,
        )


def _compression(compression):
    if compression:
        return compression
    return Compression.none


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """The reduction of tensor over the ranks (default: the average), as a new tensor of its
    shape and dtype; differentiable (the gradient is the same reduction of the gradient).
    compression: Compression.none or Compression.fp16. A sparse tensor is reduced as
    sparse_allreduce_async does (not differentiable)."""
    op = _op_of(op, average, "allreduce")
    if isinstance(tensor, torch.Tensor) and tensor.is_sparse:
        return sparse_allreduce_async(tensor, name, op, process_set)()
    compression = _compression(compression)
    t, ctx = compression.compress(tensor)
    out = _AllreduceFn.apply(t, op, name, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """allreduce in place; returns tensor."""
    return synchronize(
        allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """Reduces copies of tensors over the ranks as one request per dtype,
    asynchronously; returns a handle whose result is the list of reduced tensors."""
    op = _op_of(op, average, "grouped_allreduce_async")
    outs = [_empty_like(t) for t in tensors]
    call = _allreduce_call(
        list(tensors),
        outs,
        op,
        name,
        prescale_factor,
        postscale_factor,
        "grouped_allreduce",
        process_set,
    )
    return _handles.register(call, outs, name=call.key)


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """grouped_allreduce_async in place."""
    op = _op_of(op, average, "grouped_allreduce_async_")
    tensors = list(tensors)
    call = _allreduce_call(
        tensors,
        tensors,
        op,
        name,
        prescale_factor,
        postscale_factor,
        "grouped_allreduce",
        process_set,
    )
    return _handles.register(call, tensors, name=call.key)


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(
            synchronize(
                grouped_allreduce_async(
                    tensors,
                    op=op,
                    name=name,
                    prescale_factor=prescale,
                    postscale_factor=postscale,
                    process_set=process_set,
                )
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = synchronize(
            grouped_allreduce_async(
                [g.contiguous() for g in grads],
                op=op,
                prescale_factor=prescale,
                postscale_factor=postscale,
                process_set=process_set,
            )
        )
        return (None, None, None, None, None) + tuple(reduced)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """allreduce of several tensors as one request (one per dtype): fused, one collective;
    differentiable (each gradient the same reduction of its gradient)."""
    op = _op_of(op, average, "grouped_allreduce")
    compression = _compression(compression)
    compressed = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduceFn.apply(
        op, name, prescale_factor, postscale_factor, process_set, *[c[0] for c in compressed]
    )
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """grouped_allreduce in place; returns the list of tensors."""
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=None):
    """The reduction (Sum or Average) of a sparse COO tensor over the ranks, as Horovod makes
    it: an allgather of every rank's indices and one of its values, the values divided by the
    number of ranks for Average. Returns a function of no argument that waits and returns the
    result, a sparse tensor of tensor's size with every rank's entries (duplicates not summed
    until coalesced)."""
    op = _arrays._op(op, "sparse_allreduce_async")
    if op not in (Sum, Average):
        raise ValueError("mtxcomm.torch.sparse_allreduce_async: op must be Sum or Average")
    if not (isinstance(tensor, torch.Tensor) and tensor.layout == torch.sparse_coo):
        raise TypeError("mtxcomm.torch.sparse_allreduce_async: expected a sparse COO tensor")
    t = tensor.detach()
    # allgather concatenates dimension 0: the indices travel as (nnz, ndim) rows.
    idx = allgather_async(
        t._indices().t().contiguous(),
        name=None if name is None else "%s.indices" % name,
        process_set=process_set,
    )
    val = allgather_async(
        t._values().contiguous(),
        name=None if name is None else "%s.values" % name,
        process_set=process_set,
    )
    n = size() if process_set is None else process_set.size()

    def result():
        values = synchronize(val)
        indices = synchronize(idx)
        if op == Average:
            values = values / n
        # The indices are every rank's valid ones: no invariant check (and no warning that
        # torch skips it by default).
        return torch.sparse_coo_tensor(
            indices.t(), values, t.size(), dtype=values.dtype, check_invariants=False
        )

    return result
