"""mtxcomm for PyTorch: the ``"mtxcomm"`` torch.distributed backend and a Horovod-style API.

``import mtxcomm.torch`` registers the backend (``mtxcomm/torch/backend.py``)::

    import mtxcomm.torch
    torch.distributed.init_process_group("mtxcomm")   # torchrun / env:// / mtxrun
    model = torch.nn.parallel.DistributedDataParallel(model)

and is also a drop-in for ``horovod.torch`` (``import mtxcomm.torch as hvd``): ``init``, ``rank``,
``size``, ``local_rank``, ``local_size``, ``allreduce``/``allreduce_``/``allreduce_async``/
``allreduce_async_``, ``grouped_allreduce``, ``allgather``, ``broadcast``/``broadcast_``,
``alltoall``, ``reducescatter``, ``synchronize``/``poll``, ``join``, ``barrier``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object``, ``DistributedOptimizer`` and ``Compression``.

Every call runs on mtxcomm's engine, as the backend's and TensorFlow's do; a named call
(``name="..."``) pairs with the call of the same name on every other rank whatever the order
(Horovod's contract), an unnamed one with the same-numbered unnamed call. Tensors: CPU, dense,
any dtype mtxcomm has. Results are new tensors (the ``_`` variants write in place); allreduce,
allgather, broadcast, alltoall and reducescatter have gradients, as in Horovod.
"""

import io
import os
import pickle
import threading

import torch
import torch.distributed as dist

from mtxcomm import _arrays, _core
from mtxcomm.torch import backend as _backend
from mtxcomm.torch.backend import MtxcommBackend, Work  # noqa: F401

_backend.register()

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_async", "allgather", "allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "synchronize", "poll", "join", "barrier",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer", "Compression", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "mpi_built", "mpi_enabled", "nccl_built", "gloo_built", "cuda_built", "rocm_built",
    "mpi_threads_supported",
]

# Reduction ops, as horovod.torch names them (mtxcomm's op numbers).
Sum = _arrays.SUM
Average = _arrays.AVG
Adasum = _arrays.ADASUM
Min = _arrays.MIN
Max = _arrays.MAX
Product = _arrays.PROD

_submitter = _backend._Submitter("hvd")
_handles = {}
_handle_lock = threading.Lock()
_next_handle = [0]


# ---- process facts ----------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Starts mtxcomm (collective): under mtxrun/mpirun or with MTXCOMM_STORE its own bootstrap;
    under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set) through
    ``torch.distributed.init_process_group("mtxcomm")``, so the default process group is this
    job too. Idempotent. comm and process_sets (Horovod's): only None."""
    if comm is not None or process_sets is not None:
        raise NotImplementedError("mtxcomm.torch.init: comm and process_sets are not supported "
                                  "(mtxcomm runs the whole world)")
    if _core.is_initialized():
        return
    launched = any(os.environ.get(v) for v in _backend._LAUNCHER_VARS)
    torchrun = all(os.environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                 "MASTER_PORT"))
    if not launched and torchrun and not dist.is_initialized():
        dist.init_process_group(_backend.BACKEND_NAME)
    else:
        _arrays.init()


def shutdown():
    _arrays.shutdown()


def is_initialized():
    return _core.is_initialized()


def _fact(value, what):
    if not _core.is_initialized():
        raise ValueError("mtxcomm.torch.%s: mtxcomm has not been initialized; call "
                         "mtxcomm.torch.init() first" % what)
    return value()


def rank():
    return _fact(_core.rank, "rank")


def size():
    return _fact(_core.size, "size")


def local_rank():
    return _fact(_core.local_rank, "local_rank")


def local_size():
    return _fact(_core.local_size, "local_size")


def cross_size():
    """Nodes of the job (ranks per node being equal)."""
    return size() // local_size()


def cross_rank():
    return rank() // local_size()


# What this build has: Horovod's build queries, common/build_flags.py; torch's mpi_enabled and
# mpi_threads_supported answer mpi_built() (TensorFlow's differ, see there).
from mtxcomm.common.build_flags import BuildFlags as _BuildFlags  # noqa: E402

_build_flags = _BuildFlags(_core.build_feature, mpi_enabled_needs_launcher=False,
                           mpi_threads_need_mpi=True)
mpi_built = _build_flags.mpi_built
mpi_enabled = _build_flags.mpi_enabled
mpi_threads_supported = _build_flags.mpi_threads_supported
nccl_built = _build_flags.nccl_built
cuda_built = _build_flags.cuda_built
gloo_built = _build_flags.gloo_built
rocm_built = _build_flags.rocm_built


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


def _need_init(what):
    if not _core.is_initialized():
        raise ValueError("mtxcomm.torch.%s: mtxcomm has not been initialized; call "
                         "mtxcomm.torch.init() first" % what)


def _op_of(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError("mtxcomm.torch.%s: give op or average, not both" % what)
        return Average if average else Sum
    return Average if op is None else _arrays._op(op, what)


# ---- allreduce --------------------------------------------------------------------------------

def _allreduce_work(tensors, op, name, prescale, postscale, what, outputs):
    """Submits one allreduce of tensors (read) into outputs (written), one engine request."""
    _need_init(what)
    for t in list(tensors) + list(outputs):
        _backend._check(t, what)
    srcs = [t.detach() if prescale == 1.0 else _scaled(t.detach(), prescale) for t in tensors]
    ins = [_backend._Buf(s, what) for s in srcs]
    bufs = [_backend._Buf(o.detach(), what) for o in outputs]
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
    if t.is_floating_point() or t.is_complex():
        return t * factor
    return (t.to(torch.float64) * factor).round().to(t.dtype)


def _scale_(t, factor):
    if t.is_floating_point() or t.is_complex():
        t.mul_(factor)
    else:
        t.copy_((t.to(torch.float64) * factor).round().to(t.dtype))


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
    compression = compression or Compression.none
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
    _need_init(what)
    t = tensor.detach()
    _backend._check(t, what)
    t = t if t.dim() else t.reshape(1)
    b = _backend._Buf(t, what)
    row = int(torch.Size(t.shape[1:]).numel())
    rows = torch.tensor([t.shape[0]], dtype=torch.int64)
    counts = torch.empty(size(), dtype=torch.int64)
    # The first dimensions first (small), then the data into a buffer of the right size.
    cp = _submitter.submit(_core.KIND_ALLGATHER, [rows.data_ptr()], _backend._code(rows, what),
                           [[1]], [counts.data_ptr()], [[size()]],
                           name=None if name is None else name + ".rows")
    _submitter.work(what, [cp], [counts], (rows, counts)).wait()
    total = int(counts.sum())
    out = torch.empty((total,) + tuple(t.shape[1:]), dtype=t.dtype)
    o = _backend._Buf(out, what)
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
    _need_init(what)
    _backend._check(tensor, what)
    if not 0 <= int(root_rank) < size():
        raise ValueError("mtxcomm.torch.broadcast: root_rank %d is not a rank (size %d)"
                         % (root_rank, size()))
    b = _backend._Buf(tensor.detach(), what, complex_ok=True)
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
    _need_init(what)
    t = tensor.detach()
    _backend._check(t, what)
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
    b = _backend._Buf(t, what)
    holder = {}

    # The output's size is known once the ranks' splits are: the engine allocates through the
    # shapes it agreed on, so the received rows are first learnt by a small alltoall.
    sp = torch.tensor(splits, dtype=torch.int64)
    recv = torch.empty(n, dtype=torch.int64)
    ones = [1] * n
    spb, rvb = _backend._Buf(sp, what), _backend._Buf(recv, what)
    p0 = _submitter.submit(_core.KIND_ALLTOALL, [spb.ptr()], spb.code, [[n]], [rvb.ptr()],
                           [[n]], splits=ones, name=None if name is None else name + ".splits")
    _submitter.work(what, [p0], [recv], (spb, rvb)).wait()
    total = int(recv.sum())
    out = torch.empty((total,) + tuple(t.shape[1:]), dtype=t.dtype)
    o = _backend._Buf(out, what)
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
    b = _backend._Buf(src, what)
    out = torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype)
    o = _backend._Buf(out, what)
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


# ---- join, barrier, objects ---------------------------------------------------------------------

def join(device=-1):
    """This rank has no more batches: until every rank has joined, the others' allreduces see
    zeros from it (their averages still divide by size()). Returns the last rank to join."""
    _need_init("join")
    code, message, last = _core.join()
    if code:
        raise _arrays._error(code, message)
    return last


def barrier(process_set=None):
    _need_init("barrier")
    _arrays.barrier()


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's obj (pickled) on every rank."""
    _need_init("broadcast_object")
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    base = name or "broadcast_object"
    broadcast_(length, root_rank, name=None if name is None else base + ".len")
    if rank() != root_rank:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    broadcast_(data, root_rank, name=None if name is None else base + ".data")
    if rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's obj (pickled), in rank order."""
    _need_init("allgather_object")
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64))
    gathered = allgather(data, name=name)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[offset:offset + n].numpy().tobytes()))
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
        handles.append(broadcast_async_(p.data if p.requires_grad else p, root_rank,
                                        name="broadcast.%s" % n))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank):
    """Sets every rank's optimizer state (state and param_groups, e.g. momentum buffers and
    the learning rate) to root_rank's."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


# ---- compression ------------------------------------------------------------------------------

from mtxcomm.torch.compression import Compression  # noqa: E402


# ---- the optimizer ----------------------------------------------------------------------------

class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def _mtx_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor):
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named):
                raise ValueError("DistributedOptimizer: named_parameters must be (name, "
                                 "parameter) pairs, e.g. model.named_parameters()")
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("DistributedOptimizer: parameter names are not unique")
            by_id = {id(p): n for n, p in named}
            missing = [p for p in params if id(p) not in by_id]
            if missing:
                raise ValueError("DistributedOptimizer: named_parameters misses %d of the "
                                 "optimizer's parameters" % len(missing))
        else:
            by_id = {id(p): "param.%d.%d" % (gi, pi)
                     for gi, g in enumerate(self.param_groups) for pi, p in enumerate(g["params"])}
        if backward_passes_per_step < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1")
        if op == Adasum:
            raise NotImplementedError("DistributedOptimizer: op=Adasum is not supported in the "
                                      "torch API; use Average or Sum")
        self._mtx_names = by_id
        self._mtx_compression = compression
        self._mtx_passes = backward_passes_per_step
        self._mtx_op = op
        self._mtx_predivide = gradient_predivide_factor
        self._mtx_counts = {}
        self._mtx_handles = {}
        self._mtx_hooks = []
        self._mtx_skip = False
        for p in params:
            if p.requires_grad:
                self._mtx_hooks.append(p.register_post_accumulate_grad_hook(self._mtx_hook))

    def _mtx_submit(self, p):
        grad = p.grad
        name = "allreduce.%s" % self._mtx_names[id(p)]
        if self._mtx_op == Average:
            # Horovod: divide by predivide before the sum, the rest after.
            pre = 1.0 / self._mtx_predivide
            post = self._mtx_predivide / size()
            op = Sum
        else:
            pre, post, op = 1.0, 1.0, self._mtx_op
        t, ctx = self._mtx_compression.compress(grad)
        if t is grad:
            h = allreduce_async_(grad, name=name, op=op, prescale_factor=pre,
                                 postscale_factor=post)
        else:
            h = allreduce_async_(t, name=name, op=op, prescale_factor=pre, postscale_factor=post)
        self._mtx_handles[p] = (h, t, ctx)

    def _mtx_hook(self, p):
        if p in self._mtx_handles and self._mtx_handles[p][0] is not None:
            raise AssertionError(
                "DistributedOptimizer: a gradient was computed twice before step() (call "
                "optimizer.synchronize() between the backward passes, or set "
                "backward_passes_per_step)")
        n = self._mtx_counts.get(p, 0) + 1
        self._mtx_counts[p] = n
        if n == self._mtx_passes:
            self._mtx_counts[p] = 0
            self._mtx_submit(p)

    def synchronize(self):
        """Waits for every gradient's allreduce; afterwards p.grad holds the reduced value."""
        for g in self.param_groups:
            for p in g["params"]:
                if (p.requires_grad and p.grad is not None and p not in self._mtx_handles
                        and self._mtx_counts.get(p, 0) == 0):
                    # A parameter whose hook did not fire this step (unused): still reduced, so
                    # the ranks agree on the request sequence.
                    self._mtx_submit(p)
        for p, (h, t, ctx) in list(self._mtx_handles.items()):
            synchronize(h)
            if t is not p.grad:
                p.grad.copy_(self._mtx_compression.decompress(t, ctx))
        self._mtx_handles.clear()

    def skip_synchronize(self):
        """A context in which step() does not synchronize (call synchronize() yourself first)."""
        opt = self

        class _Skip:
            def __enter__(self):
                opt._mtx_skip = True

            def __exit__(self, *exc):
                opt._mtx_skip = False
        return _Skip()

    def step(self, closure=None):
        if not self._mtx_skip:
            self.synchronize()
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if self._mtx_handles:
            raise AssertionError("DistributedOptimizer: zero_grad() while gradients are being "
                                 "reduced; call step() or synchronize() first")
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None):
    """optimizer, made to reduce each gradient over all ranks as soon as backward produces it
    (one asynchronous allreduce per parameter, named after it; the engine fuses those ready
    together) and to wait for them in step(). op: Average (default) or Sum.
    backward_passes_per_step: gradients accumulated locally (summed in p.grad, as PyTorch
    does) over that many backward passes before one reduction, as Horovod (no division by the
    number of passes). Returns an instance of a subclass of the optimizer's
    class sharing its state (param_groups, state)."""
    _need_init("DistributedOptimizer")
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    dist_opt = cls.__new__(cls)
    dist_opt.__dict__ = optimizer.__dict__
    dist_opt._mtx_setup(named_parameters, compression or Compression.none,
                        backward_passes_per_step, _arrays._op(op, "DistributedOptimizer"),
                        gradient_predivide_factor)
    return dist_opt
