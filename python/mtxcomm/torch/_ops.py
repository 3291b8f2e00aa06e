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

import threading

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _handles, _tensors, _work, process_sets
from mtxcomm.torch._handles import poll, synchronize  # noqa: F401  (poll: re-exported)
from mtxcomm.torch.basics import need_init, rank, size

__all__ = [
    "Sum", "Average", "Adasum", "Min", "Max", "Product", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "synchronize", "poll", "join", "barrier",
]

# Reduction ops, as horovod.torch names them (mtxcomm's op numbers).
Sum = _arrays.SUM
Average = _arrays.AVG
Adasum = _arrays.ADASUM
Min = _arrays.MIN
Max = _arrays.MAX
Product = _arrays.PROD

_submitter = _work.Submitter("hvd")
_INT32 = _tensors.code(torch.empty(0, dtype=torch.int32), "hvd")
_INT64 = _tensors.code(torch.empty(0, dtype=torch.int64), "hvd")


def _op_of(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError("mtxcomm.torch.%s: give op or average, not both" % what)
        return Average if average else Sum
    return Average if op is None else _arrays._op(op, what)


def _start(name, what, process_set):
    """The checks every call makes first; returns (the process set's communicator, or None for
    the global set (the engine); the key under which the call's name is in flight)."""
    need_init(what)
    comm = process_sets.communicator(process_set, what)
    key = None if name is None else name if comm is None else (comm.id, name)
    _handles.claim_name(key, what)
    return comm, key


def _by_dtype(bufs, name):
    """The requests of one call of several tensors: [(request name, indices of its tensors)],
    one request per dtype (in the order the dtypes first appear), named name (one dtype) or
    "name.K" (several; unnamed: the next auto names, in that order on every rank)."""
    groups = {}
    for i, b in enumerate(bufs):
        groups.setdefault(b.code, []).append(i)
    if len(groups) == 1:
        return [(name, list(range(len(bufs))))]
    return [(None if name is None else "%s.%d" % (name, k), idx)
            for k, idx in enumerate(groups.values())]


def _submit_by_dtype(kind, ins, outs, name, what, op=_arrays.SUM):
    """Submits one request per dtype of ins (read) into outs (written); returns the pendings."""
    pendings = []
    for req, idx in _by_dtype(ins, name):
        pendings.append(_submitter.submit(
            kind, [ins[i].ptr() for i in idx], ins[idx[0]].code, [ins[i].dims() for i in idx],
            [outs[i].ptr() for i in idx], [outs[i].dims() for i in idx], op=op, name=req))
    return pendings


# ---- names of two-step calls, and the check for joined ranks -----------------------------------

_STEPS_WINDOW = 64
_steps_lock = threading.Lock()
_steps_seq = [0]
_steps_slots = [None] * _STEPS_WINDOW


def _two_step_names(name):
    """(first step's name, second step's name, slot) of a two-step call. A named call's steps
    are "NAME.sizes" and NAME; an unnamed call takes the next of 64 slots "hvd.steps.K" (the
    ranks make the same unnamed calls in the same order, so K agrees), first waiting for the
    call that had the slot 64 calls ago (a name is never in flight twice)."""
    if name is not None:
        return name + ".sizes", name, None
    with _steps_lock:
        slot = _steps_seq[0] % _STEPS_WINDOW
        _steps_seq[0] += 1
        previous = _steps_slots[slot]
    if previous is not None:
        try:
            previous.wait()
        except BaseException:  # noqa: BLE001 - its own synchronize raises it
            pass
    base = "hvd.steps.%d" % slot
    return base + ".sizes", base, slot


def _took_slot(slot, call):
    if slot is not None:
        with _steps_lock:
            _steps_slots[slot] = call


def _check_present(present, what):
    if present < size():
        raise _arrays.InvalidUsageError(
            "mtxcomm.torch.%s on rank %d: %d of %d ranks have joined (join()); as in Horovod, "
            "only allreduce runs while a rank has joined" % (what, rank(), size() - present,
                                                             size()), 2)


def _presence(name, what):
    """Submits the allreduce that counts the ranks taking part in this call (a joined rank
    stands in with 0); returns (its Work, the check to run once the call is done)."""
    one = torch.ones(1, dtype=torch.int32)
    count = torch.empty(1, dtype=torch.int32)
    p = _submitter.submit(_core.KIND_ALLREDUCE, [one.data_ptr()], _INT32, [[1]],
                          [count.data_ptr()], [[1]], op=Sum,
                          name=None if name is None else name + ".present")
    return (_submitter.work(what, [p], [count], (one, count)),
            lambda: _check_present(int(count[0]), what))


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


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Reduces tensor over the ranks in place, asynchronously; returns a handle."""
    op = _op_of(op, average, "allreduce_async_")
    call = _allreduce_call([tensor], [tensor], op, name, prescale_factor, postscale_factor,
                           "allreduce", process_set)
    return _handles.register(call, tensor, name=call.key)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Reduces a copy of tensor over the ranks, asynchronously; returns a handle."""
    op = _op_of(op, average, "allreduce_async")
    out = _empty_like(tensor)
    call = _allreduce_call([tensor], [out], op, name, prescale_factor, postscale_factor,
                           "allreduce", process_set)
    return _handles.register(call, out, name=call.key)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return synchronize(allreduce_async(tensor, op=op, name=name, prescale_factor=prescale,
                                           postscale_factor=postscale, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (synchronize(allreduce_async(grad.contiguous(), op=op, prescale_factor=prescale,
                                            postscale_factor=postscale,
                                            process_set=process_set)),
                None, None, None, None, None)


def _compression(compression):
    if compression:
        return compression
    # Compression is defined in the package's __init__, which imports this module: imported
    # when first needed.
    from mtxcomm.torch import Compression
    return Compression.none


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
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


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """allreduce in place; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Reduces copies of tensors over the ranks as one request per dtype,
    asynchronously; returns a handle whose result is the list of reduced tensors."""
    op = _op_of(op, average, "grouped_allreduce_async")
    outs = [_empty_like(t) for t in tensors]
    call = _allreduce_call(list(tensors), outs, op, name, prescale_factor, postscale_factor,
                           "grouped_allreduce", process_set)
    return _handles.register(call, outs, name=call.key)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """grouped_allreduce_async in place."""
    op = _op_of(op, average, "grouped_allreduce_async_")
    tensors = list(tensors)
    call = _allreduce_call(tensors, tensors, op, name, prescale_factor, postscale_factor,
                           "grouped_allreduce", process_set)
    return _handles.register(call, tensors, name=call.key)


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(synchronize(grouped_allreduce_async(
            tensors, op=op, name=name, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = synchronize(grouped_allreduce_async(
            [g.contiguous() for g in grads], op=op, prescale_factor=prescale,
            postscale_factor=postscale, process_set=process_set))
        return (None, None, None, None, None) + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """allreduce of several tensors as one request (one per dtype): fused, one collective;
    differentiable (each gradient the same reduction of its gradient)."""
    op = _op_of(op, average, "grouped_allreduce")
    compression = _compression(compression)
    compressed = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduceFn.apply(op, name, prescale_factor, postscale_factor, process_set,
                                     *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """grouped_allreduce in place; returns the list of tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


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
    idx = allgather_async(t._indices().t().contiguous(),
                          name=None if name is None else "%s.indices" % name,
                          process_set=process_set)
    val = allgather_async(t._values().contiguous(),
                          name=None if name is None else "%s.values" % name,
                          process_set=process_set)
    n = size() if process_set is None else process_set.size()

    def result():
        values = synchronize(val)
        indices = synchronize(idx)
        if op == Average:
            values = values / n
        # The indices are every rank's valid ones: no invariant check (and no warning that
        # torch skips it by default).
        return torch.sparse_coo_tensor(indices.t(), values, t.size(), dtype=values.dtype,
                                       check_invariants=False)
    return result


# ---- allgather --------------------------------------------------------------------------------

def _gather_inputs(tensors, what):
    """The tensors to gather, detached and checked, scalars as one row."""
    out = []
    for tensor in tensors:
        _tensors.check(tensor, what)
        t = tensor.detach()
        out.append(t if t.dim() else t.reshape(1))
    return out


def _allgather_call(tensors, name, what, process_set):
    """One allgather of tensors (one request per dtype): a Call whose output is (the gathered
    tensors, the rows each rank gave, an int64 tensor [ranks, tensors])."""
    comm, key = _start(name, what, process_set)
    ts = _gather_inputs(tensors, what)
    bufs = [_tensors.Buf(t, what) for t in ts]
    if comm is not None:
        call = comm.allgather(ts, bufs, what, name)
        call.key = key
        return call
    n, k, r = size(), len(ts), rank()
    sizes_name, data_name, slot = _two_step_names(name)
    # The first step: every rank's dimension 0 of every tensor, and the count of the ranks
    # taking part (its last element; a joined rank stands in with zeros), by one allreduce.
    mine = torch.zeros(n * k + 1, dtype=torch.int64)
    mine[r * k:(r + 1) * k] = torch.tensor([t.shape[0] for t in ts], dtype=torch.int64)
    mine[-1] = 1
    summed = torch.empty_like(mine)
    p = _submitter.submit(_core.KIND_ALLREDUCE, [mine.data_ptr()], _INT64, [[n * k + 1]],
                          [summed.data_ptr()], [[n * k + 1]], op=Sum, name=sizes_name)
    sizes = _submitter.work(what, [p], [summed], (mine, summed))

    def then():
        _check_present(int(summed[-1]), what)
        rows = summed[:-1].reshape(n, k)
        totals = rows.sum(0).tolist()
        outs = [torch.empty((tot,) + tuple(t.shape[1:]), dtype=t.dtype)
                for tot, t in zip(totals, ts)]
        obufs = [_tensors.Buf(o, what) for o in outs]
        ps = _submit_by_dtype(_core.KIND_ALLGATHER, bufs, obufs, data_name, what)
        return [_submitter.work(what, ps, outs, (bufs, obufs))], (outs, rows)
    call = _handles.Call([sizes], then=then)
    call.key = key
    _took_slot(slot, call)
    return call


def _gathered(call):
    return lambda _: call.output[0]


def allgather_async(tensor, name=None, process_set=None):
    """Concatenation of every rank's tensor along dimension 0 (first dimensions may differ;
    the others must agree), asynchronously; returns a handle."""
    call = _allgather_call([tensor], name, "allgather", process_set)
    return _handles.register(call, None, post=lambda _: call.output[0][0],
                             name=call.key)


def grouped_allgather_async(tensors, name=None, process_set=None):
    """allgather of several tensors as one request (one per dtype); returns a handle whose result
    is the list of gathered tensors."""
    call = _allgather_call(list(tensors), name, "grouped_allgather", process_set)
    return _handles.register(call, None, post=_gathered(call),
                             name=call.key)


def _own_rows(grads, rows, process_set):
    """Horovod's gradient of allgather: the gradients averaged over the ranks, of which each
    rank keeps the rows it gave. rows: int64 [ranks, tensors] from the forward call."""
    me = rank() if process_set is None else process_set.rank()
    reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], op=Average,
                                                  process_set=process_set))
    starts = rows[:me].sum(0).tolist()
    return tuple(g[s:s + int(n)] for g, s, n in zip(reduced, starts, rows[me].tolist()))


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        call = _allgather_call(list(tensors), name, "allgather", process_set)
        h = _handles.register(call, None, post=_gathered(call),
                              name=call.key)
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
        raise ValueError("mtxcomm.torch.broadcast: root_rank %d is not a rank of the process "
                         "set (ranks %s)" % (root_rank, ranks))
    b = _tensors.Buf(tensor.detach(), what, complex_ok=True)

    def finish(_):
        b.copy_back()
    if comm is not None:
        call = comm.broadcast(b, process_set.ranks.index(int(root_rank)), finish, what,
                              name)
    else:
        p = _submitter.submit(_core.KIND_BROADCAST, [b.ptr()], b.code, [b.dims()], [b.ptr()],
                              [b.dims()], root=int(root_rank), name=name)
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
        reduced = synchronize(allreduce_async(grad.contiguous(), op=Average,
                                              process_set=ctx.process_set))
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
            raise ValueError("mtxcomm.torch.alltoall: %d rows do not split evenly over %d ranks "
                             "(give splits)" % (t.shape[0], n))
        return [t.shape[0] // n] * n
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    # This rank's own bad splits are raised before anything is sent.
    if len(splits) != n or min(splits) < 0 or sum(splits) != t.shape[0]:
        raise ValueError("mtxcomm.torch.alltoall: splits %s do not split %d rows over %d ranks "
                         "(%d non-negative counts adding up to dimension 0)"
                         % (splits, t.shape[0], n, n))
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
    p0 = _submitter.submit(_core.KIND_ALLTOALL, [sp.data_ptr()], _INT64, [[n]],
                           [recv.data_ptr()], [[n]], splits=[1] * n, name=sizes_name)
    sizes = _submitter.work(what, [p0], [recv], (sp, recv))
    present, check = _presence(data_name, what)

    def then():
        check()
        out = torch.empty((int(recv.sum()),) + tuple(t.shape[1:]), dtype=t.dtype)
        o = _tensors.Buf(out, what)
        p = _submitter.submit(_core.KIND_ALLTOALL, [b.ptr()], b.code, [b.dims()], [o.ptr()],
                              [o.dims()], splits=splits, name=data_name)
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
        back, _r = synchronize(alltoall_async(grad.contiguous(), ctx.received,
                                              process_set=ctx.process_set))
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
    outs = [torch.empty((t.shape[0] // n + (1 if r < t.shape[0] % n else 0),) +
                        tuple(t.shape[1:]), dtype=t.dtype) for t in ts]
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


def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """reducescatter, asynchronously; returns a handle."""
    call = _reducescatter_call([tensor], op, name, prescale_factor, postscale_factor,
                               "reducescatter", process_set)
    return _handles.register(call, None, post=lambda _: call.output[0],
                             name=call.key)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of several tensors as one request (one per dtype), asynchronously; returns a
    handle whose result is the list of this rank's rows of each."""
    call = _reducescatter_call(list(tensors), op, name, prescale_factor, postscale_factor,
                               "grouped_reducescatter", process_set)
    return _handles.register(call, None, post=lambda _: list(call.output),
                             name=call.key)


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(synchronize(grouped_reducescatter_async(
            tensors, name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx, *grads):
        # As Horovod: the allgather of the gradients, times the set's size for Sum, times the
        # prescale and postscale factors.
        op, prescale, postscale, process_set = ctx.args
        factor = prescale * postscale * (
            (size() if process_set is None else process_set.size()) if op == Sum else 1)
        grads = [g * factor if factor != 1 else g for g in grads]
        gathered = grouped_allgather(grads, process_set=process_set)
        return (None, None, None, None, None) + tuple(gathered)


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction of tensor (the same shape on every rank) over the ranks, of which rank r
    keeps its rows of dimension 0: d0 // size() rows, one more on the first d0 % size();
    differentiable (as Horovod: the allgather of the gradient, times size() for Sum)."""
    compression = _compression(compression)
    t, ctx = compression.compress(tensor)
    out = _ReducescatterFn.apply(op, name, prescale_factor, postscale_factor, process_set, t)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=None, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of several tensors as one request (one per dtype); differentiable."""
    compression = _compression(compression)
    compressed = [compression.compress(t) for t in tensors]
    outs = _ReducescatterFn.apply(op, name, prescale_factor, postscale_factor, process_set,
                                  *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


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
