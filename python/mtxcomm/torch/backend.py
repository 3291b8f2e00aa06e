"""The ``"mtxcomm"`` backend of ``torch.distributed`` (a c10d ``Backend`` written in Python).

``import mtxcomm.torch`` registers it for "cpu" (and "cuda" when the C++ backend serves and
libmtxcomm has CUDA: docs/torch.md); then ``init_process_group("mtxcomm")`` (torchrun, mtxrun).

Every collective is submitted to mtxcomm's background engine (``bindings/common/engine.h``, the
one the TensorFlow binding and the array API use) and returns at once with a ``Work``: the
engine agrees on the order with the other ranks, fuses small allreduces (DDP's buckets that are
ready together) and runs them on the shared-memory path inside a node and mtxcomm's transports
across nodes. ``Work.wait()`` blocks (without the GIL) until the engine is done; ``get_future()``
returns a ``torch.futures.Future`` completed by a helper thread, as DDP's communication hooks
need.

This Python backend is the fallback of the C++ one (``bindings/torch``, the module
``mtxcomm.torch._c10d``; ``docs/torch.md``): ``_create`` makes both for a group, the Python one
first, and hands it to the C++ one, which runs the common collectives itself on a communicator
of its own (no trampoline, no negotiation: ~100 us less per call) and delegates the rest here.
Where the C++ module is absent, does not import, or was built for another torch, this backend
serves alone (one warning says why and how to rebuild); ``MTXCOMM_TORCH_BACKEND=python`` asks
for it. It subclasses ``torch._C._distributed_c10d.Backend`` in Python (the ``PyBackend``
trampoline dispatches c10d's calls into the overrides below): the data never passes through
Python, and no C++ ABI has to match the PyTorch release.

Supported: allreduce (SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM; BAND/BOR/BXOR are not),
allreduce_coalesced, broadcast, reduce, allgather, all_gather_single (``_allgather_base``,
``all_gather_into_tensor``), allgather_coalesced, reduce_scatter, reduce_scatter_single
(``_reduce_scatter_base``, ``reduce_scatter_tensor``), all_to_all_single (``all_to_all_single``
with or without split sizes), alltoall (lists), gather and scatter (alltoalls in which only the
root receives or sends), barrier; send and recv (``_p2p.py``: isend, irecv,
batch_isend_irecv). dtypes: every one mtxcomm has
(int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64,
bool), and complex64/complex128 for SUM, AVG and PREMUL_SUM (as pairs of reals). Anything else
(a sparse or CUDA tensor, recv from any source) raises a clear error.

Rendezvous: when the process was started by ``mpirun``/``mtxrun`` or has ``MTXCOMM_STORE`` set,
mtxcomm's own bootstrap runs and its world must match the group's rank and size. Otherwise
(``torchrun``, ``init_method="env://"`` or ``"tcp://"``, a ``FileStore``) the c10d ``Store`` that
PyTorch hands the backend carries it: rank 0 opens mtxcomm's TCP bootstrap store on a free port
of ``MASTER_ADDR`` (or this host's address) and publishes that address and a fresh 256-bit job
secret under ``mtxcomm/bootstrap``; every rank reads them from the c10d store, so no second
rendezvous is configured by hand. The secret keeps strangers out of mtxcomm's bootstrap; it is
as private as the c10d store it travels through (PyTorch's TCPStore has no authentication).

Groups: the world in order (the default group, ``new_group`` of every rank) shares the engine;
any other group (a subset, ``new_subgroups``, a ``DeviceMesh`` dimension) runs the same calls on
a communicator of its own ranks (``_group.py``, which says why not ``mtxcomm_comm_split``).

This module holds the backend class (each collective's checks, staging and submission) and its
registration with ``torch.distributed``; the rest is beside it: ``_lists.py``, ``_p2p.py`` and
``_sparse.py`` (mixins: list forms, point-to-point, sparse allreduce), ``_native.py`` (the C++
backend and the choice of it), ``_bootstrap.py`` (rendezvous, the engine's start), ``_group.py``
(the groups other than the world), ``_tensors.py`` (tensor
checks, dtype and op codes, ``Buf``), ``_work.py`` (``Submitter``, ``Work`` and the helpers
that hold buffers and complete futures), which the Horovod-style API (``_ops.py``) uses too.
"""

import collections
import datetime
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import _DistributedBackendOptions

from mtxcomm import _core
from mtxcomm.torch import _bootstrap, _group, _native, _tensors, _work
from mtxcomm.torch._lists import ListCollectives
from mtxcomm.torch._native import python_backend
from mtxcomm.torch._p2p import PointToPoint
from mtxcomm.torch._sparse import SparseAllreduce
from mtxcomm.torch._work import Work, collective

__all__ = ["MtxcommBackend", "Work", "python_backend", "register"]

BACKEND_NAME = "mtxcomm"


# ---- the backend ------------------------------------------------------------------------------

_backends_created = 0


class MtxcommBackend(ListCollectives, PointToPoint, SparseAllreduce, _C10dBackend):
    """c10d backend over mtxcomm's engine; see the module's docstring."""

    def __init__(self, store, rank, size, timeout, options=None, global_ranks=None):
        global _backends_created
        super().__init__(rank, size)
        self._options = (
            options
            if options is not None
            else _C10dBackend.Options(
                BACKEND_NAME, timeout=timeout if timeout is not None else datetime.timedelta(0)
            )
        )
        ranks = list(global_ranks) if global_ranks else list(range(size))
        if len(ranks) != size or len(set(ranks)) != size:
            raise ValueError(
                "mtxcomm backend: a group of %d ranks given global ranks %s" % (size, ranks)
            )
        self.global_ranks = ranks
        self._comm = None
        if ranks == list(range(size)) and (
            not dist.is_initialized() or size == dist.get_world_size()
        ):
            # The world, in order: mtxcomm's engine (fusion, the response cache, shm).
            _bootstrap.init_engine(store, rank, size, timeout)
            # Named by how many engine groups this process made: every rank makes each of
            # them (each holds every rank), in the same order, so the names pair.
            self._submitter = _work.Submitter(
                "torch.%d" % _backends_created, _work.group_seconds(timeout)
            )
            _backends_created += 1
        else:
            # A subset, or the world in another order: a communicator of its own (_group.py).
            self._comm = _group.open_group(store, rank, ranks, timeout)
            self._submitter = _group.GroupSubmitter(self._comm, _work.group_seconds(timeout))

    @property
    def options(self):
        return self._options

    def getBackendName(self):
        return BACKEND_NAME

    @property
    def supports_splitting(self):
        return False

    @property
    def supports_coalescing(self):
        return False

    def _submit(self, *args, **kwargs):
        return self._submitter.submit(*args, **kwargs)

    def _submit_each(self, calls, keep):
        """Submits calls ((args, kwargs) of _submit) in order; when one raises, the keeper holds
        keep until the engine is done with those already submitted."""
        pendings = []
        try:
            for args, kwargs in calls:
                pendings.append(self._submit(*args, **kwargs))
        except BaseException:
            if pendings:
                _work.keeper.hold(pendings, keep)
            raise
        return pendings

    def _work(self, what, pendings, outputs, keep, finish=None):
        return self._submitter.work(what, pendings, outputs, keep, finish)

    def _root(self, root, what):
        if not 0 <= root < self.size():
            raise ValueError(
                "mtxcomm backend: %s: root %d is not a rank of this group (size "
                "%d)" % (what, root, self.size())
            )
        return root

    # -- allreduce --

    def _allreduce(self, tensors, reduce_op, what):
        if not tensors:
            raise ValueError("mtxcomm backend: %s: no tensors" % what)
        code, factor = _tensors.c10d_op(reduce_op, what, tensors)
        bufs = [_tensors.Buf(t, what, complex_ok=True) for t in tensors]
        if factor is not None:
            for b in bufs:
                b.view.mul_(factor)
        # One request per dtype: the engine fuses its tensors.
        groups = collections.OrderedDict()
        for b in bufs:
            groups.setdefault(b.code, []).append(b)
        calls = []
        for dtype, group in groups.items():
            ptrs = [b.ptr() for b in group]
            shapes = [b.shape() for b in group]
            calls.append(((_core.KIND_ALLREDUCE, ptrs, dtype, shapes, ptrs, shapes), {"op": code}))
        pendings = self._submit_each(calls, bufs)

        def finish(_):
            for b in bufs:
                b.copy_back()

        return self._work(what, pendings, list(tensors), bufs, finish)

    @collective
    def allreduce(self, tensors, opts):
        if len(tensors) == 1 and tensors[0].layout == torch.sparse_coo:
            return self._sparse_allreduce(tensors[0], opts.reduceOp)
        # The common case (one contiguous CPU tensor of a real dtype, not PREMUL_SUM) without
        # the general path's bookkeeping: a few microseconds less per call.
        if len(tensors) == 1:
            t = tensors[0]
            code = _tensors.FAST_CODES.get(t.dtype)
            op = _tensors.OP_CODES.get(opts.reduceOp.op)
            if (
                code is not None
                and op is not None
                and t.is_contiguous()
                and t.device.type == "cpu"
                and t.layout == torch.strided
            ):
                n = t.numel()
                ptr = t.data_ptr()
                p = self._submitter.submit(
                    _core.KIND_ALLREDUCE, [ptr], code, [[n]], [ptr], [[n]], op=op
                )
                return self._work("allreduce", [p], [t], t)
        return self._allreduce(tensors, opts.reduceOp, "allreduce")

    @collective
    def allreduce_coalesced(self, tensors, opts):
        return self._allreduce(tensors, opts.reduceOp, "allreduce_coalesced")

    # -- broadcast, reduce --

    @collective
    def broadcast(self, tensors, opts):
        what = "broadcast"
        root = self._root(opts.rootRank, what)
        bufs = [_tensors.Buf(t, what, complex_ok=True) for t in tensors]
        pendings = self._submit_each(
            [
                (
                    (_core.KIND_BROADCAST, [b.ptr()], b.code, [b.shape()], [b.ptr()], [b.shape()]),
                    {"root": root},
                )
                for b in bufs
            ],
            bufs,
        )

        def finish(_):
            for b in bufs:
                b.copy_back()

        return self._work(what, pendings, list(tensors), bufs, finish)

    @collective
    def reduce(self, tensors, opts):
        what = "reduce"
        root = self._root(opts.rootRank, what)
        code, factor = _tensors.c10d_op(opts.reduceOp, what, tensors)
        bufs = [_tensors.Buf(t, what, complex_ok=True) for t in tensors]
        scratch, calls = [], []
        for b in bufs:
            src = b.view if factor is None else b.view * factor
            # The root reduces in place; the others into scratch: their tensors keep their values.
            out = b.view if self.rank() == root else torch.empty_like(b.view)
            scratch += [src, out]
            calls.append(
                (
                    (
                        _core.KIND_ALLREDUCE,
                        [src.data_ptr()],
                        b.code,
                        [b.shape()],
                        [out.data_ptr()],
                        [b.shape()],
                    ),
                    {"op": code},
                )
            )
        pendings = self._submit_each(calls, (bufs, scratch))

        def finish(_):
            if self.rank() == root:
                for b in bufs:
                    b.copy_back()

        return self._work(what, pendings, list(tensors), (bufs, scratch), finish)

    # -- allgather --

    @staticmethod
    def _gather_bufs(what, inp, flat_out):
        b = _tensors.Buf(inp, what)
        out = _tensors.Buf(flat_out, what)
        if out.code != b.code:
            raise TypeError(
                "mtxcomm backend: %s: the output is %s but the input is %s"
                % (what, flat_out.dtype, inp.dtype)
            )
        return b, out

    @staticmethod
    def _gather_call(b, out):
        return (
            _core.KIND_ALLGATHER,
            [b.ptr()],
            b.code,
            [b.shape()],
            [out.ptr()],
            [out.shape()],
        ), {}

    @collective
    def allgather(self, output_tensors, input_tensors, opts):
        what = "allgather"
        keep, copies = [], []
        if len(output_tensors) != len(input_tensors):
            raise ValueError("mtxcomm backend: allgather: one output list per input tensor")
        # Every list is checked and staged before any is submitted: a request in flight whose
        # buffers a later error dropped would be written after they are freed.
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError(
                    "mtxcomm backend: allgather: %d output tensors for a group of "
                    "%d ranks" % (len(outs), self.size())
                )
            for o in outs:
                _tensors.check(o, what)
                if o.dtype != inp.dtype:
                    raise TypeError(
                        "mtxcomm backend: allgather: an output tensor is %s but the "
                        "input is %s" % (o.dtype, inp.dtype)
                    )
            if outs[self.rank()].numel() != inp.numel():
                raise ValueError(
                    "mtxcomm backend: allgather: this rank's output tensor has %d "
                    "elements but its input %d" % (outs[self.rank()].numel(), inp.numel())
                )
            flat = torch.empty(sum(o.numel() for o in outs), dtype=inp.dtype)
            b, out = self._gather_bufs(what, inp, flat)
            keep += [b, out]
            copies.append((flat, outs))
        pendings = self._submit_each(
            [self._gather_call(b, out) for b, out in zip(keep[0::2], keep[1::2])], keep
        )

        def finish(_):
            for flat, outs in copies:
                offset = 0
                for o in outs:
                    o.copy_(flat[offset : offset + o.numel()].view(o.shape))
                    offset += o.numel()

        # The Work's result is a flat list of tensors (as Gloo's: the one input's outputs).
        return self._work(
            what, pendings, [o for outs in output_tensors for o in outs], keep, finish
        )

    @collective
    def all_gather_single(self, output, input, opts):
        what = "all_gather_into_tensor"
        _tensors.check(output, what)
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                "mtxcomm backend: %s: the output has %d elements, not size() x the "
                "input's = %d x %d" % (what, output.numel(), self.size(), input.numel())
            )
        out = _tensors.Buf(output, what)
        b, o = self._gather_bufs(what, input, out.contig)
        args, kwargs = self._gather_call(b, o)
        p = self._submit(*args, **kwargs)

        def finish(_):
            out.copy_back()

        return self._work(what, [p], [output], (b, o, out), finish)

    _allgather_base = all_gather_single

    # -- reduce-scatter --

    def _reduce_scatter_bufs(self, what, inp, out, reduce_op):
        code, factor = _tensors.c10d_op(reduce_op, what, [inp])
        if inp.numel() != out.numel() * self.size():
            raise ValueError(
                "mtxcomm backend: %s: the input has %d elements, not size() x the "
                "output's = %d x %d" % (what, inp.numel(), self.size(), out.numel())
            )
        b = _tensors.Buf(inp, what, complex_ok=True)
        if factor is not None:
            b.view = b.view * factor
        o = _tensors.Buf(out, what, complex_ok=True)
        return code, b, o

    @staticmethod
    def _reduce_scatter_call(code, b, o):
        return (
            _core.KIND_REDUCE_SCATTER,
            [b.ptr()],
            b.code,
            [b.shape()],
            [o.ptr()],
            [o.shape()],
        ), {"op": code}

    @collective
    def reduce_scatter_single(self, output, input, opts):
        what = "reduce_scatter_tensor"
        _tensors.check(output, what)
        _tensors.check(input, what)
        code, b, o = self._reduce_scatter_bufs(what, input, output, opts.reduceOp)
        args, kwargs = self._reduce_scatter_call(code, b, o)
        p = self._submit(*args, **kwargs)

        def finish(_):
            o.copy_back()

        return self._work(what, [p], [output], (b, o), finish)

    _reduce_scatter_base = reduce_scatter_single

    @collective
    def reduce_scatter(self, output_tensors, input_tensors, opts):
        what = "reduce_scatter"
        keep, outs, staged = [], [], []
        if len(output_tensors) != len(input_tensors):
            raise ValueError("mtxcomm backend: reduce_scatter: one input list per output tensor")
        for out, ins in zip(output_tensors, input_tensors):
            _tensors.check(out, what)
            if len(ins) != self.size():
                raise ValueError(
                    "mtxcomm backend: reduce_scatter: %d input tensors for a group "
                    "of %d ranks" % (len(ins), self.size())
                )
            for t in ins:
                _tensors.check(t, what)
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError(
                        "mtxcomm backend: reduce_scatter: every input tensor must "
                        "have the output's %d elements and dtype %s" % (out.numel(), out.dtype)
                    )
            # Every list is checked and staged before any is submitted (allgather's reason).
            staged.append(
                self._reduce_scatter_bufs(
                    what, torch.cat([t.reshape(-1) for t in ins]), out, opts.reduceOp
                )
            )
        for _, b, o in staged:
            keep += [b, o]
            outs.append(o)
        pendings = self._submit_each([self._reduce_scatter_call(*x) for x in staged], keep)

        def finish(_):
            for o in outs:
                o.copy_back()

        return self._work(what, pendings, output_tensors, keep, finish)

    # -- alltoall --

    @collective
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        what = "all_to_all_single"
        _tensors.check(output, what)
        _tensors.check(input, what)
        n = self.size()
        if output.dtype != input.dtype:
            raise TypeError(
                "mtxcomm backend: %s: the output is %s but the input is %s"
                % (what, output.dtype, input.dtype)
            )
        rows_in = input.shape[0] if input.dim() else 1
        row = input[0].numel() if input.dim() and rows_in else max(1, input.numel())
        if input.dim() and rows_in == 0:
            row = int(torch.Size(input.shape[1:]).numel())
        in_splits = list(input_split_sizes) if input_split_sizes else None
        if in_splits is None:
            if rows_in % n:
                raise ValueError(
                    "mtxcomm backend: %s: %d rows do not split evenly over %d "
                    "ranks (give input_split_sizes)" % (what, rows_in, n)
                )
            in_splits = [rows_in // n] * n
        if len(in_splits) != n or sum(in_splits) != rows_in or min(in_splits) < 0:
            raise ValueError(
                "mtxcomm backend: %s: input_split_sizes %s do not split %d rows "
                "over %d ranks" % (what, in_splits, rows_in, n)
            )
        out_splits = list(output_split_sizes) if output_split_sizes else None
        b = _tensors.Buf(input, what)
        o = _tensors.Buf(output, what)
        # Rows of `row` elements each (1-D to the engine: shape (rows * row,) with splits in
        # elements keeps the row length out of the agreement).
        splits = [s * row for s in in_splits]
        p = self._submit(
            _core.KIND_ALLTOALL,
            [b.ptr()],
            b.code,
            [b.shape()],
            [o.ptr()],
            [o.shape()],
            splits=splits,
        )

        def finish(pendings):
            if out_splits is not None:
                got = [s // row for s in pendings[0].received_splits()]
                if got != out_splits:
                    raise ValueError(
                        "mtxcomm backend: %s on rank %d: output_split_sizes %s but "
                        "the ranks sent %s rows" % (what, self.rank(), out_splits, got)
                    )
            o.copy_back()

        return self._work(what, [p], [output], (b, o), finish)

    alltoall_base = all_to_all_single

    # -- barrier --

    @collective
    def barrier(self, opts):
        t = torch.zeros(1, dtype=torch.int32)
        p = self._submit(
            _core.KIND_ALLREDUCE,
            [t.data_ptr()],
            _tensors.code(t, "barrier"),
            [[1]],
            [t.data_ptr()],
            [[1]],
        )
        return self._work("barrier", [p], [t], t)

    def shutdown(self):
        """A group's own communicator is freed (after its calls already made); the engine
        outlives the world's group (the array API or TensorFlow may share it) and ends at exit
        or with mtxcomm.shutdown()."""
        if self._comm is not None:
            self._comm.close()

    def abort(self):
        _core.shutdown()


def _create(opts, backend_options):
    """register_backend's creator (extended_api=True): the C++ backend over the Python one
    (its fallback for what it does not run natively), or the Python one alone (_native.py).
    A group whose only backend is this one gets the C++ backend's ProcessGroup, which names it
    "mtxcomm" where PyTorch reports the backend (DDP's logging)."""
    backend = create_backend(opts, backend_options)
    return _native.as_process_group(backend, opts, sys._getframe(1))


def create_backend(opts, backend_options):
    """The backend of a group (opts: register_backend's): the C++ one over the Python one, or
    the Python one alone."""
    options = backend_options
    if not isinstance(options, _C10dBackend.Options):
        options = _C10dBackend.Options(BACKEND_NAME, timeout=opts.timeout)
    module, why = _native.native_module()
    py_backend = MtxcommBackend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        options,
        global_ranks=opts.global_ranks_in_group,
    )
    if module is None:
        if why is not None:
            _native.warn_fallback(why)
        return py_backend
    return _native.native_backend(module, opts, py_backend)


def split_backend(parent, store, ranks, seconds, group_name):
    """The C++ backend's split (dist.split_group; bindings/torch/c10d_group.cc): the backend of
    ``ranks`` (ranks of parent's group, sorted, this rank among them; parent: its Python
    backend), bootstrapped through ``store`` as a new group's, among those ranks only."""
    bad = [r for r in ranks if not 0 <= r < len(parent.global_ranks)]
    if bad:
        raise ValueError(
            "mtxcomm backend: split_group: ranks %s are not ranks of the parent group (size %d)"
            % (bad, len(parent.global_ranks))
        )
    opts = _DistributedBackendOptions()
    opts.store = store
    opts.group_rank = list(ranks).index(parent.rank())
    opts.group_size = len(ranks)
    opts.timeout = datetime.timedelta(seconds=seconds)
    opts.group_id = group_name
    opts.global_ranks_in_group = [parent.global_ranks[r] for r in ranks]
    return create_backend(opts, None)


_registered = False


def register():
    """Registers the "mtxcomm" backend with torch.distributed (idempotent)."""
    global _registered
    if _registered or BACKEND_NAME.upper() in dist.Backend._plugins:
        _registered = True
        return
    devices = _native.devices()
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices)
    _native.records_its_own_calls(BACKEND_NAME)
    _registered = True


# ``import mtxcomm.torch`` (which imports this module) registers the backend.
register()
