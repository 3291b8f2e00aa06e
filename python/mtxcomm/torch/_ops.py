"""The collectives of the Horovod-style API (Horovod's ``horovod/torch/mpi_ops``): allreduce,
grouped_allreduce, allgather, broadcast, alltoall and reducescatter (each with its ``_async``
form, and ``_`` in-place forms where Horovod has them), the handles they return with ``poll``
and ``synchronize``, ``join`` and ``barrier``, the autograd Functions that make allreduce,
allgather, broadcast and alltoall differentiable, and the reduction ops (``Sum``,
``Average``...).

Every call is submitted through one ``_work.Submitter`` (``"hvd"``) to mtxcomm's engine, the
tensors made buffers by ``_tensors``; see the package's docstring for the contract.
"""

import threading

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _tensors, _work
from mtxcomm.torch.basics import need_init, rank, size

__all__ = [
    "Sum", "Average", "Adasum", "Min", "Max", "Product", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "synchronize", "poll", "join", "barrier",
]

# Reduction ops, as horovod.torch names them (mtxcomm's op numbers).
Sum = _arrays.SUM
Average = _arrays.AVG
Adasum = _arrays.ADASUM
Min = _arrays.MIN
Max = _arrays.MAX
Product = _arrays.PROD

_submitter = _work.Submitter("hvd")
_handles = {}
_handle_lock = threading.Lock()
_next_handle = [0]


# ---- handles ----------------------------------------------------------------------------------

class _Handle:
    def __init__(self, work, result, post=None):
        self.work = work
        self.result = result
        self.post = post


def _register(work, result, post=None):
    with _handle_lock:
        h = _next_handle[0]
        _next_handle[0] += 1
        _handles[h] = _Handle(work, result, post)
    return h


def poll(handle):
    """True when the asynchronous call of handle is done (synchronize then returns at once)."""
    with _handle_lock:
        entry = _handles.get(handle)
    if entry is None:
        raise ValueError("mtxcomm.torch.poll: unknown handle %r" % (handle,))
    return entry.work.is_completed()


def synchronize(handle):
    """Waits for the asynchronous call of handle; returns its output (raises its error)."""
    with _handle_lock:
        entry = _handles.pop(handle, None)
    if entry is None:
        raise ValueError("mtxcomm.torch.synchronize: unknown handle %r" % (handle,))
    entry.work.wait()
    return entry.post(entry.result) if entry.post else entry.result


def _op_of(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError("mtxcomm.torch.%s: give op or average, not both" % what)
        return Average if average else Sum
    return Average if op is None else _arrays._op(op, what)


# ---- allreduce --------------------------------------------------------------------------------

def _allreduce_work(tensors, op, name, prescale, postscale, what, outputs):
    """Submits one allreduce of tensors (read) into outputs (written), one engine request."""
    need_init(what)
    for t in list(tensors) + list(outputs):
        _tensors.check(t, what)
    srcs = [t.detach() if prescale == 1.0 else _scaled(t.detach(), prescale) for t in tensors]
    ins = [_tensors.Buf(s, what) for s in srcs]
    bufs = [_tensors.Buf(o.detach(), what) for o in outputs]
    codes = {b.code for b in ins + bufs}
    if len(codes) != 1:
        raise TypeError("mtxcomm.torch.%s: tensors of several dtypes in one call" % what)
    shapes = [b.shape() for b in bufs]
    p = _submitter.submit(_core.KIND_ALLREDUCE, [b.ptr() for b in ins], bufs[0].code,
                          [b.shape() for b in ins], [b.ptr() for b in bufs], shapes, op=op,
                          name=name)

    def finish(_):
        for b, o in zip(bufs, outputs):
            b.copy_back()
            if postscale != 1.0:
                _scale_(o.detach(), postscale)
    return _submitter.work(what, [p], list(outputs), (ins, bufs), finish)


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


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Reduces tensor over all ranks in place, asynchronously; returns a handle."""
    op = _op_of(op, average, "allreduce_async_")
    w = _allreduce_work([tensor], op, name, prescale_factor, postscale_factor,
                        "allreduce", [tensor])
    return _register(w, tensor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Reduces a copy of tensor over all ranks, asynchronously; returns a handle."""
    op = _op_of(op, average, "allreduce_async")
    out = torch.empty_like(tensor.detach(), memory_format=torch.contiguous_format)
    w = _allreduce_work([tensor], op, name, prescale_factor, postscale_factor, "allreduce",
                        [out])
    return _register(w, out)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale, postscale):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return synchronize(allreduce_async(tensor, op=op, name=name, prescale_factor=prescale,
                                           postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad):
        return (synchronize(allreduce_async(grad.contiguous(), op=ctx.op,
                                            prescale_factor=ctx.prescale,
                                            postscale_factor=ctx.postscale)),
                None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """The reduction of tensor over all ranks (default: the average), as a new tensor of its
    shape and dtype; differentiable (the gradient is the same reduction of the gradient).
    compression: Compression.none or Compression.fp16."""
    op = _op_of(op, average, "allreduce")
    if not compression:
        # Compression is defined in the package's __init__, which imports this module:
        # imported when first needed.
        from mtxcomm.torch import Compression
        compression = Compression.none
    t, ctx = compression.compress(tensor)
    out = _AllreduceFn.apply(t, op, name, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """allreduce in place; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    op = _op_of(op, average, "grouped_allreduce_async")
    outs = [torch.empty_like(t.detach(), memory_format=torch.contiguous_format)
            for t in tensors]
    w = _allreduce_work(tensors, op, name, prescale_factor, postscale_factor,
                        "grouped_allreduce", outs)
    return _register(w, outs)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """allreduce of several tensors (one dtype) as one request: fused, one collective."""
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor))


# ---- allgather, broadcast, alltoall, reducescatter --------------------------------------------

def allgather_async(tensor, name=None, process_set=None):
    """Concatenation of every rank's tensor along dimension 0 (first dimensions may differ;
    the others must agree), asynchronously; returns a handle."""
    what = "allgather"
    need_init(what)
    t = tensor.detach()
    _tensors.check(t, what)
    t = t if t.dim() else t.reshape(1)
    b = _tensors.Buf(t, what)
    row = int(torch.Size(t.shape[1:]).numel())
    rows = torch.tensor([t.shape[0]], dtype=torch.int64)
    counts = torch.empty(size(), dtype=torch.int64)
    # The first dimensions first (small), then the data into a buffer of the right size.
    cp = _submitter.submit(_core.KIND_ALLGATHER, [rows.data_ptr()], _tensors.code(rows, what),
                           [[1]], [counts.data_ptr()], [[size()]],
                           name=None if name is None else name + ".rows")
    _submitter.work(what, [cp], [counts], (rows, counts)).wait()
    total = int(counts.sum())
    out = torch.empty((total,) + tuple(t.shape[1:]), dtype=t.dtype)
    o = _tensors.Buf(out, what)
    p = _submitter.submit(_core.KIND_ALLGATHER, [b.ptr()], b.code, [[t.numel()]], [o.ptr()],
                          [[total * row]], name=name)
    w = _submitter.work(what, [p], [out], (b, o))
    return _register(w, out)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.dim0 = tensor.shape[0] if tensor.dim() else 1
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        # Horovod: the gradient is averaged over ranks, then each keeps its rows.
        reduced = synchronize(allreduce_async(grad.contiguous(), op=Average))
        counts = synchronize(allgather_async(torch.tensor([ctx.dim0], dtype=torch.int64)))
        start = int(counts[:rank()].sum())
        return reduced[start:start + ctx.dim0], None


def allgather(tensor, name=None, process_set=None):
    return _AllgatherFn.apply(tensor, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    what = "broadcast"
    need_init(what)
    _tensors.check(tensor, what)
    if not 0 <= int(root_rank) < size():
        raise ValueError("mtxcomm.torch.broadcast: root_rank %d is not a rank (size %d)"
                         % (root_rank, size()))
    b = _tensors.Buf(tensor.detach(), what, complex_ok=True)
    p = _submitter.submit(_core.KIND_BROADCAST, [b.ptr()], b.code, [b.shape()], [b.ptr()],
                          [b.shape()], root=int(root_rank), name=name)

    def finish(_):
        b.copy_back()
    return _register(_submitter.work(what, [p], [tensor], b, finish), tensor)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        reduced = synchronize(allreduce_async(grad.contiguous(), op=Average))
        if rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's tensor on every rank, as a new tensor; differentiable."""
    return _BroadcastFn.apply(tensor, root_rank, name)


def _rows_input(tensor, what):
    """tensor, detached and checked, with a dimension 0 to scatter."""
    need_init(what)
    t = tensor.detach()
    _tensors.check(t, what)
    if t.dim() == 0:
        raise ValueError("mtxcomm.torch.%s: a scalar has no rows to scatter" % what)
    return t


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    what = "alltoall"
    t = _rows_input(tensor, what)
    n = size()
    if splits is None:
        if t.shape[0] % n:
            raise ValueError("mtxcomm.torch.alltoall: %d rows do not split evenly over %d ranks "
                             "(give splits)" % (t.shape[0], n))
        splits = [t.shape[0] // n] * n
    elif isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    # This rank's own bad splits are raised before anything is sent (the received counts are
    # learnt by a first alltoall, which a negative split would poison on the other ranks).
    if len(splits) != n or min(splits) < 0 or sum(splits) != t.shape[0]:
        raise ValueError("mtxcomm.torch.alltoall: splits %s do not split %d rows over %d ranks "
                         "(%d non-negative counts adding up to dimension 0)"
                         % (splits, t.shape[0], n, n))
    row = int(torch.Size(t.shape[1:]).numel())
    b = _tensors.Buf(t, what)
    holder = {}

    # The output's size is known once the ranks' splits are: the engine allocates through the
    # shapes it agreed on, so the received rows are first learnt by a small alltoall.
    sp = torch.tensor(splits, dtype=torch.int64)
    recv = torch.empty(n, dtype=torch.int64)
    ones = [1] * n
    spb, rvb = _tensors.Buf(sp, what), _tensors.Buf(recv, what)
    p0 = _submitter.submit(_core.KIND_ALLTOALL, [spb.ptr()], spb.code, [[n]], [rvb.ptr()],
                           [[n]], splits=ones, name=None if name is None else name + ".splits")
    _submitter.work(what, [p0], [recv], (spb, rvb)).wait()
    total = int(recv.sum())
    out = torch.empty((total,) + tuple(t.shape[1:]), dtype=t.dtype)
    o = _tensors.Buf(out, what)
    p = _submitter.submit(_core.KIND_ALLTOALL, [b.ptr()], b.code, [[t.numel()]], [o.ptr()],
                          [[total * row]], splits=[s * row for s in splits], name=name)
    holder["received"] = recv
    w = _submitter.work(what, [p], [out], (b, o))
    return _register(w, (out, recv))


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, recv = synchronize(alltoall_async(tensor, splits, name))
        ctx.received = recv
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, _):
        back, _r = synchronize(alltoall_async(grad.contiguous(), ctx.received))
        return back, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Rank r sends rows [sum(splits[:j]), sum(splits[:j+1])) of dimension 0 to rank j
    (splits: a list or tensor of size() counts, default equal); returns the rows received in
    rank order, and with splits given also the counts received from each rank (as Horovod)."""
    out, recv = _AlltoallFn.apply(tensor, splits, name)
    return (out, recv) if splits is not None else out


def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    what = "reducescatter"
    t = _rows_input(tensor, what)
    op = _arrays._op(op, what)
    n, r = size(), rank()
    rows = t.shape[0] // n + (1 if r < t.shape[0] % n else 0)
    src = _scaled(t, prescale_factor) if prescale_factor != 1.0 else t
    b = _tensors.Buf(src, what)
    out = torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype)
    o = _tensors.Buf(out, what)
    p = _submitter.submit(_core.KIND_REDUCE_SCATTER, [b.ptr()], b.code, [list(t.shape)],
                          [o.ptr()], [list(out.shape)], op=op, name=name)

    def finish(_):
        if postscale_factor != 1.0:
            _scale_(out, postscale_factor)
    return _register(_submitter.work(what, [p], [out], (b, o, src), finish), out)


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction of tensor (the same shape on every rank) over all ranks, of which rank r
    keeps its rows of dimension 0: d0 // size() rows, one more on the first d0 % size()."""
    return synchronize(reducescatter_async(tensor, name, op, None, prescale_factor,
                                           postscale_factor))


# ---- join, barrier ----------------------------------------------------------------------------

def join(device=-1):
    """This rank has no more batches: until every rank has joined, the others' allreduces see
    zeros from it (their averages still divide by size()). Returns the last rank to join."""
    need_init("join")
    code, message, last = _core.join()
    if code:
        raise _arrays._error(code, message)
    return last


def barrier(process_set=None):
    need_init("barrier")
    _arrays.barrier()
