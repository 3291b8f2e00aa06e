"""The ``"mtxcomm"`` backend of ``torch.distributed`` (a c10d ``Backend`` written in Python).

``import mtxcomm.torch`` registers it (``torch.distributed.Backend.register_backend("mtxcomm",
..., extended_api=True, devices=["cpu"])``); then::

    torch.distributed.init_process_group("mtxcomm")           # torchrun, env://, mtxrun
    torch.distributed.init_process_group("cpu:mtxcomm,cuda:nccl")   # CUDA tensors to NCCL

Every collective is submitted to mtxcomm's background engine (``bindings/common/engine.h``, the
one the TensorFlow binding and the array API use) and returns at once with a ``Work``: the
engine agrees on the order with the other ranks, fuses small allreduces (DDP's buckets that are
ready together) and runs them on the shared-memory path inside a node and mtxcomm's transports
across nodes. ``Work.wait()`` blocks (without the GIL) until the engine is done; ``get_future()``
returns a ``torch.futures.Future`` completed by a helper thread, as DDP's communication hooks
need.

Why Python and not a C++ extension: torch 2.x lets a Python subclass of
``torch._C._distributed_c10d.Backend`` be a backend (its ``PyBackend`` trampoline dispatches
c10d's calls into the overrides below). The data never passes through Python (the engine gets
the tensors' addresses), and there is no C++ ABI to match with each PyTorch release: one wheel
of mtxcomm works with every PyTorch that has the trampoline. The cost is a few microseconds of
Python per call (``bench/RESULTS.md``, the PyTorch table).

Supported: allreduce (SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM; BAND/BOR/BXOR are not),
allreduce_coalesced, broadcast, reduce, allgather, all_gather_single (``_allgather_base``,
``all_gather_into_tensor``), allgather_coalesced, reduce_scatter, reduce_scatter_single
(``_reduce_scatter_base``, ``reduce_scatter_tensor``), all_to_all_single (``all_to_all_single``
with or without split sizes), alltoall (lists), gather and scatter (alltoalls in which only the
root receives or sends), barrier. dtypes: every one mtxcomm has
(int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64,
bool), and complex64/complex128 for SUM, AVG and PREMUL_SUM (as pairs of reals). Anything else
(send/recv, a sparse or CUDA tensor) raises a clear error.

Rendezvous: when the process was started by ``mpirun``/``mtxrun`` or has ``MTXCOMM_STORE`` set,
mtxcomm's own bootstrap runs and its world must match the group's rank and size. Otherwise
(``torchrun``, ``init_method="env://"`` or ``"tcp://"``, a ``FileStore``) the c10d ``Store`` that
PyTorch hands the backend carries it: rank 0 opens mtxcomm's TCP bootstrap store on a free port
of ``MASTER_ADDR`` (or this host's address) and publishes that address and a fresh 256-bit job
secret under ``mtxcomm/bootstrap``; every rank reads them from the c10d store, so no second
rendezvous is configured by hand. The secret keeps strangers out of mtxcomm's bootstrap; it is
as private as the c10d store it travels through (PyTorch's TCPStore has no authentication).

Groups: the world only. ``new_group`` of every rank in order works (it shares the engine); a
smaller group raises, naming a workaround (``new_group(ranks, backend="gloo")``).
"""

import collections
import datetime
import functools
import json
import os
import queue
import secrets
import socket
import threading
import time
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend, ReduceOp

from mtxcomm import _arrays, _core

__all__ = ["MtxcommBackend", "register"]

BACKEND_NAME = "mtxcomm"
_STORE_KEY = "mtxcomm/bootstrap"
# Requests of one backend in flight at once. Request names repeat with this period
# ("torch.<group>.<seq % window>"), so a steady-state step of the same collectives is named the
# same every time (the engine's response cache then agrees on it with one bit per request); a
# submit that would reuse the name of a request still in flight first waits for it.
_WINDOW = 64

_SUPPORTED = ("int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, "
              "float32, float64, bool (complex64/complex128 for SUM, AVG, PREMUL_SUM)")


def _now():
    return time.monotonic()


def _seconds(timeout):
    """A timedelta (or number of seconds) as seconds; None or <= 0 -> None."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    return timeout if timeout > 0 else None


# ---- rendezvous -------------------------------------------------------------------------------

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "MTXCOMM_STORE")


def _free_port(host):
    """A TCP port free on host (an address of this machine), or None when host is not local."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(addr[:2] if family == socket.AF_INET else addr)
                return s.getsockname()[1]
        except OSError:
            continue
    return None


def _bootstrap_address():
    """'host:port' where rank 0 can open mtxcomm's bootstrap store for the others to reach."""
    candidates = []
    if os.environ.get("MASTER_ADDR"):
        candidates.append(os.environ["MASTER_ADDR"])
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    candidates.append("127.0.0.1")
    for host in candidates:
        port = _free_port(host)
        if port is not None:
            return "%s:%d" % (host, port)
    raise RuntimeError("mtxcomm backend: rank 0 found no local address to open mtxcomm's "
                       "bootstrap store on (tried %s)" % ", ".join(candidates))


def _init_engine(store, rank, size, timeout):
    """Starts mtxcomm's engine (collective over the group's ranks) unless it runs."""
    if not _core.is_initialized():
        if size > 1 and not any(os.environ.get(v) for v in _LAUNCHER_VARS):
            _init_through_store(store, rank, size, timeout)
        else:
            _arrays.init()
    if _core.size() != size or _core.rank() != rank:
        raise RuntimeError(
            "mtxcomm backend: the process group is rank %d of %d but mtxcomm's world (from "
            "%s) is rank %d of %d; launch with one launcher (torchrun, or mtxrun/mpirun) or "
            "unset MTXCOMM_STORE" % (rank, size, _launcher(), _core.rank(), _core.size()))


def _launcher():
    for v in _LAUNCHER_VARS:
        if os.environ.get(v):
            return "%s=%s" % (v, os.environ[v])
    return "an earlier init"


def _init_through_store(store, rank, size, timeout):
    if rank == 0:
        info = {"store": "tcp:" + _bootstrap_address(), "secret": secrets.token_hex(32)}
        store.set(_STORE_KEY, json.dumps(info))
    else:
        store.wait([_STORE_KEY], timeout)
        info = json.loads(bytes(store.get(_STORE_KEY)).decode())
    env = {"MTXCOMM_RANK": str(rank), "MTXCOMM_SIZE": str(size), "MTXCOMM_STORE": info["store"],
           "MTXCOMM_JOB_SECRET": info["secret"]}
    saved = {k: os.environ.get(k) for k in list(env) + ["MTXCOMM_JOB_SECRET_FILE"]}
    os.environ.update(env)
    os.environ.pop("MTXCOMM_JOB_SECRET_FILE", None)
    try:
        _arrays.init()
        # Every rank has joined (init is collective): the address and the secret are of no
        # more use in the c10d store, where anyone who reaches it could read them.
        if rank == 0:
            try:
                store.delete_key(_STORE_KEY)
            except Exception:  # noqa: BLE001 - a store without delete: the key stays
                pass
    finally:
        # The secret is not left for child processes to inherit.
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- tensors ----------------------------------------------------------------------------------

# torch dtype -> mtxcomm datatype (the real dtypes; complex tensors travel as their reals).
_FAST_CODES = {dt: code for dt, (code, _) in _arrays._torch_dtypes(torch).items()}


def _code(t, what):
    code = _FAST_CODES.get(t.dtype)
    if code is None:
        raise TypeError("mtxcomm backend: %s: a tensor of dtype %s, which mtxcomm does not "
                        "support; supported: %s" % (what, t.dtype, _SUPPORTED))
    return code


def _check(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("mtxcomm backend: %s: expected a torch.Tensor, got %s"
                        % (what, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError(
            "mtxcomm backend: %s: a tensor on %s; mtxcomm runs torch collectives on CPU "
            "tensors (for CUDA tensors use init_process_group(\"cpu:mtxcomm,cuda:nccl\"))"
            % (what, t.device))
    if t.layout != torch.strided:
        raise ValueError("mtxcomm backend: %s: a %s tensor; only dense (strided) tensors"
                         % (what, t.layout))


class _Buf:
    """A tensor as a contiguous buffer for the engine: ``flat`` (1-D, mtxcomm's dtype), and on
    finish the result copied back into the caller's tensor when it was not contiguous."""

    def __init__(self, t, what, complex_ok=False):
        _check(t, what)
        self.tensor = t
        self.contig = t if t.is_contiguous() else t.contiguous()
        view = self.contig
        if view.is_complex():
            if not complex_ok:
                raise TypeError("mtxcomm backend: %s: complex tensors take SUM, AVG or "
                                "PREMUL_SUM only" % what)
            view = torch.view_as_real(view)
        self.view = view.reshape(-1)
        self.code = _code(self.view, what)

    def ptr(self):
        return self.view.data_ptr()

    def shape(self):
        return [self.view.numel()]

    def copy_back(self):
        if self.contig is not self.tensor:
            self.tensor.copy_(self.contig)


_OP_CODES = {ReduceOp.SUM: _arrays.SUM, ReduceOp.PRODUCT: _arrays.PROD, ReduceOp.MIN: _arrays.MIN,
             ReduceOp.MAX: _arrays.MAX, ReduceOp.AVG: _arrays.AVG}


def _op(reduce_op, what, tensors):
    """(mtxcomm op, premul factor or None) of a c10d ReduceOp."""
    op_type = getattr(reduce_op, "op", reduce_op)
    if op_type == ReduceOp.PREMUL_SUM:
        factor = getattr(reduce_op, "factor", None)
        if factor is None:
            raise ValueError("mtxcomm backend: %s: PREMUL_SUM without a factor" % what)
        return _arrays.SUM, factor
    code = _OP_CODES.get(op_type)
    if code is None:
        raise ValueError("mtxcomm backend: %s: reduce op %s is not supported (SUM, AVG, MIN, "
                         "MAX, PRODUCT, PREMUL_SUM)" % (what, op_type))
    if any(t.is_complex() for t in tensors) and code not in (_arrays.SUM, _arrays.AVG):
        raise ValueError("mtxcomm backend: %s: %s of complex tensors is not defined"
                         % (what, op_type))
    return code, None


# ---- Work -------------------------------------------------------------------------------------

class _Failed:
    """A failed call's error, as the value of a Work's private future."""

    def __init__(self, error):
        self.error = error


def _value_or_raise(fut):
    value = fut.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class _Completer:
    """The thread that completes the futures of Works (get_future) in submission order."""

    def __init__(self):
        self._q = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def add(self, work):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mtxcomm-torch-futures",
                                                daemon=True)
                self._thread.start()
        self._q.put(work)

    def _run(self):
        while True:
            work = self._q.get()
            try:
                work._complete_future()
            except BaseException:  # never lose the thread; the future carries the error
                pass


_completer = _Completer()


class _Keeper:
    """Holds, for every call, what the engine reads or writes (inputs, outputs, staging copies)
    from the call until the engine is done with it, whatever happens meanwhile to the Work
    (dropped at once, as Gloo allows), to the group (destroy_process_group) or to a call that
    raised after a part of it was submitted; process-wide, so a group's end lets nothing go
    early. Calls the engine is done with are let go at the next call or wait of any group: a
    Work still referenced is finished there (its copies into the caller's outputs, as Gloo
    makes them whether or not anyone waits), a dropped one's copies are made without it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items = collections.deque()  # (pendings, buffers, finish, weakref to the Work)

    def hold(self, pendings, objects, work=None, finish=None):
        ref = None if work is None else weakref.ref(work)
        with self._lock:
            self._items.append((pendings, objects, finish, ref))
        self.sweep()

    def sweep(self):
        """Lets go of the oldest calls the engine is done with (in submission order)."""
        done = []
        with self._lock:
            while self._items and all(p.done() for p in self._items[0][0]):
                done.append(self._items.popleft())
        for pendings, _, finish, ref in done:
            work = None if ref is None else ref()
            try:
                if work is not None:
                    work._finish()
                elif finish is not None and all(p.status()[0] == 0 for p in pendings):
                    finish(pendings)
            except BaseException:  # noqa: BLE001 - a dropped Work's error has nobody to reach
                pass


_keeper = _Keeper()


class Work(dist._Work):
    """One collective in flight: ``wait(timeout)``, ``is_completed()``, ``is_success()``,
    ``exception()``, ``result()`` (the output tensors), ``get_future()`` (a
    ``torch.futures.Future`` whose value is ``result()``)."""

    def __init__(self, backend, what, pendings, outputs, finish=None, deadline=None):
        super().__init__()
        self._what = what
        self._pendings = pendings
        self._outputs = outputs
        self._finish_fn = finish
        self._deadline = deadline
        self._submitter = backend
        self._lock = threading.Lock()
        self._finished = False
        self._error = None
        self._future = None

    def _engine_done(self):
        return all(p.done() for p in self._pendings)

    def _wait_engine(self, seconds):
        """Waits for the engine up to seconds (None: forever); True when every part is done."""
        end = None if seconds is None else _now() + seconds
        for p in self._pendings:
            left = -1.0 if end is None else max(0.0, end - _now())
            if not p.wait(left):
                return False
        return True

    def _finish(self):
        """Once the engine is done: the error or the outputs' last copies (idempotent)."""
        with self._lock:
            if self._finished:
                return
            for p in self._pendings:
                code, message = p.status()
                if code != 0 and self._error is None:
                    self._error = _arrays._error(code, message)
            if self._error is None and self._finish_fn is not None:
                try:
                    self._finish_fn(self._pendings)
                except BaseException as e:  # a mismatch found after the fact (splits)
                    self._error = e
            self._finished = True

    def _timeout_error(self, seconds):
        e = _arrays.TimeoutError(
            "mtxcomm backend: %s on rank %d did not complete within the process group's "
            "timeout of %.0f s (a rank that never made the call, or a stalled peer)"
            % (self._what, _core.rank(), seconds))
        self._submitter.broken = str(e)
        return e

    def wait(self, timeout=None):
        if self._finished:
            if self._error is not None:
                raise self._error
            return True
        seconds = _seconds(timeout)
        if seconds is None and self._deadline is not None:
            seconds = max(0.0, self._deadline[0] - _now())
            limit = self._deadline[1]
        else:
            limit = seconds
        if not self._wait_engine(seconds):
            raise self._timeout_error(limit)
        self._finish()
        _keeper.sweep()  # the calls before this one are done too: let them go
        if self._error is not None:
            raise self._error
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        if not self._finished and self._engine_done():
            self._finish()
        return self._finished

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        self.is_completed()
        return self._error

    def result(self):
        self.wait()
        return list(self._outputs)

    def get_future(self):
        # The future handed out is a .then() of a private one: a callback that raises marks its
        # future failed in C++, which every consumer sees (DDP's reducer, PyTorch's re-wrapped
        # Work). Future.set_exception only tags the value for Python's wait() and is lost when
        # PyTorch re-wraps the future (the failure then arrives as a value).
        if self._future is None:
            self._raw = torch.futures.Future()
            self._future = self._raw.then(_value_or_raise)
            if self.is_completed():
                self._set_future()
            else:
                _completer.add(self)
        return self._future

    def _set_future(self):
        self._raw.set_result(_Failed(self._error) if self._error is not None
                             else list(self._outputs))

    def _complete_future(self):
        seconds = None if self._deadline is None else max(0.0, self._deadline[0] - _now())
        if not self._wait_engine(seconds):
            self._raw.set_result(_Failed(self._timeout_error(self._deadline[1])))
            self._wait_engine(None)  # the engine may still use the buffers: wait it out
            self._finish()
            return
        self._finish()
        self._set_future()


# ---- the backend ------------------------------------------------------------------------------

_backends_created = 0


class _Submitter:
    """Names and submits requests for one user of the engine (a backend, the Horovod-style
    API): auto names "<prefix>.<seq % window>" (the same every step of a steady loop, so the
    engine's response cache hits), a submit that would reuse a name still in flight first
    waiting for it; or a caller's own name."""

    def __init__(self, prefix, timeout=None):
        self._prefix = prefix
        self.timeout = timeout
        self._seq = 0
        self._inflight = collections.deque()
        self._lock = threading.Lock()
        # Set when a call timed out: its request may still pair with a later one of another
        # rank, so (as NCCL's communicator after a timeout) the group takes no more calls.
        self.broken = None

    def _next_name(self):
        while len(self._inflight) >= _WINDOW:
            # The group's timeout bounds this wait as it bounds Work.wait (a peer that never
            # makes the call, or died, must not hang the submitting thread).
            if not self._inflight[0].wait(-1.0 if self.timeout is None else self.timeout):
                self.broken = ("the request of %d calls ago did not complete within the "
                               "process group's timeout of %.0f s" % (_WINDOW, self.timeout))
                raise _arrays.TimeoutError("mtxcomm backend: rank %d: %s (a rank that never "
                                           "made that call, or a stalled peer)"
                                           % (_core.rank(), self.broken))
            self._inflight.popleft()
        while self._inflight and self._inflight[0].done():
            self._inflight.popleft()
        name = "%s.%d" % (self._prefix, self._seq % _WINDOW)
        self._seq += 1
        return name

    def submit(self, kind, inputs, code, shapes, outputs, out_shapes, op=_arrays.SUM, root=0,
               splits=None, name=None):
        if self.broken is not None:
            raise RuntimeError("mtxcomm backend: the process group takes no more collectives "
                               "after an earlier one timed out (%s); destroy it and restart "
                               "the job" % self.broken)
        with self._lock:
            auto = name is None
            if auto:
                name = self._next_name()
            p = _core.submit(kind, name, inputs, code, shapes, int(op), int(root), splits,
                             outputs, out_shapes)
            if auto:
                self._inflight.append(p)
        return p

    def placeholder(self):
        """Takes the next name with a request no real call makes; waits for it (bounded)."""
        empty = torch.empty(0, dtype=torch.int8)
        try:
            # root -1: kRefusedRoot (bindings/common/request.h), which the others' error names
            # as a call this rank refused.
            p = self.submit(_core.KIND_ALLREDUCE, [empty.data_ptr()], _code(empty, "placeholder"),
                            [[0]], [empty.data_ptr()], [[0]], root=-1)
        except Exception:  # noqa: BLE001 - the caller's own error is the one to raise
            return
        p.wait(-1.0 if self.timeout is None else self.timeout)

    def work(self, what, pendings, outputs, keep, finish=None):
        """A Work for pendings; keep: what the engine reads or writes for them (held by the
        keeper until the engine is done with them)."""
        deadline = None if self.timeout is None else (_now() + self.timeout, self.timeout)
        w = Work(self, what, pendings, outputs, finish, deadline)
        _keeper.hold(pendings, keep, w, finish)
        return w


def _collective(method):
    """A backend call that, when this rank refuses its own arguments before submitting
    anything, still takes its place in the group's sequence of calls: it submits a request
    that cannot match the others' (an allreduce of int8 (0,)), so their call fails at once with
    InvalidUsageError instead of waiting, and the next call of every rank pairs with the next
    again; then it raises its own error. (Ranks that all refuse the same way agree on the
    placeholder and all raise.)"""
    @functools.wraps(method)
    def call(self, *args):
        sub = self._submitter
        seq = sub._seq
        try:
            return method(self, *args)
        except (ValueError, TypeError):
            if sub._seq == seq and sub.broken is None:
                sub.placeholder()
            raise
    return call


class MtxcommBackend(_C10dBackend):
    """c10d backend over mtxcomm's engine; see the module's docstring."""

    def __init__(self, store, rank, size, timeout, options=None):
        global _backends_created
        super().__init__(rank, size)
        self._options = options if options is not None else _C10dBackend.Options(
            BACKEND_NAME, timeout=timeout if timeout is not None else datetime.timedelta(0))
        _init_engine(store, rank, size, timeout)
        self._submitter = _Submitter("torch.%d" % _backends_created, _seconds(timeout))
        _backends_created += 1

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
                _keeper.hold(pendings, keep)
            raise
        return pendings

    def _work(self, what, pendings, outputs, keep, finish=None):
        return self._submitter.work(what, pendings, outputs, keep, finish)

    def _root(self, root, what):
        if not 0 <= root < self.size():
            raise ValueError("mtxcomm backend: %s: root %d is not a rank of this group (size "
                             "%d)" % (what, root, self.size()))
        return root

    # -- allreduce --

    def _allreduce(self, tensors, reduce_op, what):
        if not tensors:
            raise ValueError("mtxcomm backend: %s: no tensors" % what)
        code, factor = _op(reduce_op, what, tensors)
        bufs = [_Buf(t, what, complex_ok=True) for t in tensors]
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
            calls.append(((_core.KIND_ALLREDUCE, ptrs, dtype, shapes, ptrs, shapes),
                          {"op": code}))
        pendings = self._submit_each(calls, bufs)

        def finish(_):
            for b in bufs:
                b.copy_back()
        return self._work(what, pendings, list(tensors), bufs, finish)

    @_collective
    def allreduce(self, tensors, opts):
        # The common case (one contiguous CPU tensor of a real dtype, not PREMUL_SUM) without
        # the general path's bookkeeping: a few microseconds less per call.
        if len(tensors) == 1:
            t = tensors[0]
            code = _FAST_CODES.get(t.dtype)
            op = _OP_CODES.get(opts.reduceOp.op)
            if (code is not None and op is not None and t.is_contiguous() and
                    t.device.type == "cpu" and t.layout == torch.strided):
                n = t.numel()
                ptr = t.data_ptr()
                p = self._submitter.submit(_core.KIND_ALLREDUCE, [ptr], code, [[n]], [ptr],
                                           [[n]], op=op)
                return self._work("allreduce", [p], [t], t)
        return self._allreduce(tensors, opts.reduceOp, "allreduce")

    @_collective
    def allreduce_coalesced(self, tensors, opts):
        return self._allreduce(tensors, opts.reduceOp, "allreduce_coalesced")

    # -- broadcast, reduce --

    @_collective
    def broadcast(self, tensors, opts):
        what = "broadcast"
        root = self._root(opts.rootRank, what)
        bufs = [_Buf(t, what, complex_ok=True) for t in tensors]
        pendings = self._submit_each(
            [((_core.KIND_BROADCAST, [b.ptr()], b.code, [b.shape()], [b.ptr()], [b.shape()]),
              {"root": root}) for b in bufs], bufs)

        def finish(_):
            for b in bufs:
                b.copy_back()
        return self._work(what, pendings, list(tensors), bufs, finish)

    @_collective
    def reduce(self, tensors, opts):
        what = "reduce"
        root = self._root(opts.rootRank, what)
        code, factor = _op(opts.reduceOp, what, tensors)
        bufs = [_Buf(t, what, complex_ok=True) for t in tensors]
        scratch, calls = [], []
        for b in bufs:
            src = b.view if factor is None else b.view * factor
            # The root reduces in place; the others into scratch: their tensors keep their values.
            out = b.view if self.rank() == root else torch.empty_like(b.view)
            scratch += [src, out]
            calls.append(((_core.KIND_ALLREDUCE, [src.data_ptr()], b.code, [b.shape()],
                           [out.data_ptr()], [b.shape()]), {"op": code}))
        pendings = self._submit_each(calls, (bufs, scratch))

        def finish(_):
            if self.rank() == root:
                for b in bufs:
                    b.copy_back()
        return self._work(what, pendings, list(tensors), (bufs, scratch), finish)

    # -- allgather --

    @staticmethod
    def _gather_bufs(what, inp, flat_out):
        b = _Buf(inp, what)
        out = _Buf(flat_out, what)
        if out.code != b.code:
            raise TypeError("mtxcomm backend: %s: the output is %s but the input is %s"
                            % (what, flat_out.dtype, inp.dtype))
        return b, out

    @staticmethod
    def _gather_call(b, out):
        return (_core.KIND_ALLGATHER, [b.ptr()], b.code, [b.shape()], [out.ptr()],
                [out.shape()]), {}

    @_collective
    def allgather(self, output_tensors, input_tensors, opts):
        what = "allgather"
        keep, copies = [], []
        if len(output_tensors) != len(input_tensors):
            raise ValueError("mtxcomm backend: allgather: one output list per input tensor")
        # Every list is checked and staged before any is submitted: a request in flight whose
        # buffers a later error dropped would be written after they are freed.
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError("mtxcomm backend: allgather: %d output tensors for a group of "
                                 "%d ranks" % (len(outs), self.size()))
            for o in outs:
                _check(o, what)
                if o.dtype != inp.dtype:
                    raise TypeError("mtxcomm backend: allgather: an output tensor is %s but the "
                                    "input is %s" % (o.dtype, inp.dtype))
            if outs[self.rank()].numel() != inp.numel():
                raise ValueError("mtxcomm backend: allgather: this rank's output tensor has %d "
                                 "elements but its input %d" % (outs[self.rank()].numel(),
                                                                inp.numel()))
            flat = torch.empty(sum(o.numel() for o in outs), dtype=inp.dtype)
            b, out = self._gather_bufs(what, inp, flat)
            keep += [b, out]
            copies.append((flat, outs))
        pendings = self._submit_each(
            [self._gather_call(b, out) for b, out in zip(keep[0::2], keep[1::2])], keep)

        def finish(_):
            for flat, outs in copies:
                offset = 0
                for o in outs:
                    o.copy_(flat[offset:offset + o.numel()].view(o.shape))
                    offset += o.numel()
        # The Work's result is a flat list of tensors (as Gloo's: the one input's outputs).
        return self._work(what, pendings, [o for outs in output_tensors for o in outs], keep,
                          finish)

    @_collective
    def all_gather_single(self, output, input, opts):
        what = "all_gather_into_tensor"
        _check(output, what)
        if output.numel() != input.numel() * self.size():
            raise ValueError("mtxcomm backend: %s: the output has %d elements, not size() x the "
                             "input's = %d x %d" % (what, output.numel(), self.size(),
                                                    input.numel()))
        out = _Buf(output, what)
        b, o = self._gather_bufs(what, input, out.contig)
        args, kwargs = self._gather_call(b, o)
        p = self._submit(*args, **kwargs)

        def finish(_):
            out.copy_back()
        return self._work(what, [p], [output], (b, o, out), finish)

    _allgather_base = all_gather_single

    @_collective
    def allgather_coalesced(self, output_lists, input_tensors, opts):
        # c10d passes output_lists[rank][i] (ProcessGroupGloo reads it so); allgather takes one
        # list per input, [i][rank]. Read the other way, the result came back transposed.
        if len(output_lists) != self.size():
            raise ValueError("mtxcomm backend: allgather_coalesced: %d output lists for a group "
                             "of %d ranks (one per rank)" % (len(output_lists), self.size()))
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_tensors):
                raise ValueError("mtxcomm backend: allgather_coalesced: the output list of rank "
                                 "%d has %d tensors for %d inputs" % (r, len(outs),
                                                                       len(input_tensors)))
        by_input = [[output_lists[r][i] for r in range(self.size())]
                    for i in range(len(input_tensors))]
        return self.allgather(by_input, input_tensors, opts)

    # -- reduce-scatter --

    def _reduce_scatter_bufs(self, what, inp, out, reduce_op):
        code, factor = _op(reduce_op, what, [inp])
        if inp.numel() != out.numel() * self.size():
            raise ValueError("mtxcomm backend: %s: the input has %d elements, not size() x the "
                             "output's = %d x %d" % (what, inp.numel(), self.size(),
                                                     out.numel()))
        b = _Buf(inp, what, complex_ok=True)
        if factor is not None:
            b.view = b.view * factor
        o = _Buf(out, what, complex_ok=True)
        return code, b, o

    @staticmethod
    def _reduce_scatter_call(code, b, o):
        return (_core.KIND_REDUCE_SCATTER, [b.ptr()], b.code, [b.shape()], [o.ptr()],
                [o.shape()]), {"op": code}

    @_collective
    def reduce_scatter_single(self, output, input, opts):
        what = "reduce_scatter_tensor"
        _check(output, what)
        _check(input, what)
        code, b, o = self._reduce_scatter_bufs(what, input, output, opts.reduceOp)
        args, kwargs = self._reduce_scatter_call(code, b, o)
        p = self._submit(*args, **kwargs)

        def finish(_):
            o.copy_back()
        return self._work(what, [p], [output], (b, o), finish)

    _reduce_scatter_base = reduce_scatter_single

    @_collective
    def reduce_scatter(self, output_tensors, input_tensors, opts):
        what = "reduce_scatter"
        keep, outs, staged = [], [], []
        if len(output_tensors) != len(input_tensors):
            raise ValueError("mtxcomm backend: reduce_scatter: one input list per output tensor")
        for out, ins in zip(output_tensors, input_tensors):
            _check(out, what)
            if len(ins) != self.size():
                raise ValueError("mtxcomm backend: reduce_scatter: %d input tensors for a group "
                                 "of %d ranks" % (len(ins), self.size()))
            for t in ins:
                _check(t, what)
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError("mtxcomm backend: reduce_scatter: every input tensor must "
                                     "have the output's %d elements and dtype %s"
                                     % (out.numel(), out.dtype))
            # Every list is checked and staged before any is submitted (allgather's reason).
            staged.append(self._reduce_scatter_bufs(what, torch.cat([t.reshape(-1) for t in ins]),
                                                    out, opts.reduceOp))
        for _, b, o in staged:
            keep += [b, o]
            outs.append(o)
        pendings = self._submit_each([self._reduce_scatter_call(*x) for x in staged], keep)

        def finish(_):
            for o in outs:
                o.copy_back()
        return self._work(what, pendings, output_tensors, keep, finish)

    # -- alltoall --

    @_collective
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        what = "all_to_all_single"
        _check(output, what)
        _check(input, what)
        n = self.size()
        if output.dtype != input.dtype:
            raise TypeError("mtxcomm backend: %s: the output is %s but the input is %s"
                            % (what, output.dtype, input.dtype))
        rows_in = input.shape[0] if input.dim() else 1
        row = input[0].numel() if input.dim() and rows_in else max(1, input.numel())
        if input.dim() and rows_in == 0:
            row = int(torch.Size(input.shape[1:]).numel())
        in_splits = list(input_split_sizes) if input_split_sizes else None
        if in_splits is None:
            if rows_in % n:
                raise ValueError("mtxcomm backend: %s: %d rows do not split evenly over %d "
                                 "ranks (give input_split_sizes)" % (what, rows_in, n))
            in_splits = [rows_in // n] * n
        if len(in_splits) != n or sum(in_splits) != rows_in or min(in_splits) < 0:
            raise ValueError("mtxcomm backend: %s: input_split_sizes %s do not split %d rows "
                             "over %d ranks" % (what, in_splits, rows_in, n))
        out_splits = list(output_split_sizes) if output_split_sizes else None
        b = _Buf(input, what)
        o = _Buf(output, what)
        # Rows of `row` elements each (1-D to the engine: shape (rows * row,) with splits in
        # elements keeps the row length out of the agreement).
        splits = [s * row for s in in_splits]
        p = self._submit(_core.KIND_ALLTOALL, [b.ptr()], b.code, [b.shape()], [o.ptr()],
                         [o.shape()], splits=splits)

        def finish(pendings):
            if out_splits is not None:
                got = [s // row for s in pendings[0].received_splits()]
                if got != out_splits:
                    raise ValueError("mtxcomm backend: %s on rank %d: output_split_sizes %s but "
                                     "the ranks sent %s rows" % (what, self.rank(), out_splits,
                                                                 got))
            o.copy_back()
        return self._work(what, [p], [output], (b, o), finish)

    alltoall_base = all_to_all_single

    @_collective
    def alltoall(self, output_tensors, input_tensors, opts):
        return self._alltoall_lists("all_to_all", output_tensors, input_tensors)

    # -- gather, scatter: alltoalls in which only the root receives, or only the root sends --

    @_collective
    def gather(self, output_tensors, input_tensors, opts):
        return self._rooted("gather", opts.rootRank, input_tensors, output_tensors,
                            root_sends=False)

    @_collective
    def scatter(self, output_tensors, input_tensors, opts):
        return self._rooted("scatter", opts.rootRank, output_tensors, input_tensors,
                            root_sends=True)

    def _rooted(self, what, root, single, lists, root_sends):
        """gather (root_sends False) or scatter: every rank's one tensor `single`, the root's
        list of size() tensors in `lists` ([[...]]; [] on the others)."""
        root = self._root(root, what)
        t = self._one(single, what, "tensor")
        _check(t, what)
        none = [torch.empty(0, dtype=t.dtype)] * self.size()
        mine = list(none)
        mine[root] = t
        if self.rank() == root:
            listed = self._one(lists, what, "list (the root's %s_list)" % what)
        elif any(len(x) for x in lists):
            raise ValueError("mtxcomm backend: %s: rank %d is not the root (%d) but was given a "
                             "%s_list" % (what, self.rank(), root, what))
        else:
            listed = none
        outs, ins = (mine, listed) if root_sends else (listed, mine)
        # What the Work's result() holds: the root's gathered list, or each rank's scattered
        # tensor.
        result = list(single) if root_sends else [y for x in lists for y in x]
        return self._alltoall_lists(what, outs, ins, result=result)

    @staticmethod
    def _one(items, what, name):
        if len(items) != 1:
            raise ValueError("mtxcomm backend: %s: expected one %s, got %d" % (what, name,
                                                                                 len(items)))
        return items[0]

    def _alltoall_lists(self, what, output_tensors, input_tensors, result=None):
        """Alltoall of lists: input_tensors[j] goes to rank j, output_tensors[i] comes from
        rank i (one flat alltoall with splits; each output's size is checked against what its
        sender sent). result: the tensors the Work reports (default output_tensors)."""
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError("mtxcomm backend: %s: %d output and %d input tensors for a group of "
                             "%d ranks" % (what, len(output_tensors), len(input_tensors), n))
        for t in list(output_tensors) + list(input_tensors):
            _check(t, what)
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise TypeError("mtxcomm backend: %s: tensors of several dtypes %s"
                            % (what, sorted(str(d) for d in dtypes)))
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        b = _Buf(flat_in, what)
        o = _Buf(flat_out, what)
        p = self._submit(_core.KIND_ALLTOALL, [b.ptr()], b.code, [b.shape()], [o.ptr()],
                         [o.shape()], splits=[t.numel() for t in input_tensors])
        expected = [t.numel() for t in output_tensors]

        def finish(pendings):
            got = list(pendings[0].received_splits())
            if got != expected:
                raise ValueError("mtxcomm backend: %s on rank %d: the output tensors hold %s "
                                 "elements but the ranks sent %s" % (what, self.rank(), expected,
                                                                     got))
            offset = 0
            for t in output_tensors:
                t.copy_(flat_out[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()
        return self._work(what, [p], list(output_tensors) if result is None else result,
                          (b, o), finish)

    # -- barrier --

    @_collective
    def barrier(self, opts):
        t = torch.zeros(1, dtype=torch.int32)
        p = self._submit(_core.KIND_ALLREDUCE, [t.data_ptr()], _code(t, "barrier"), [[1]],
                         [t.data_ptr()], [[1]])
        return self._work("barrier", [p], [t], t)

    def shutdown(self):
        """The engine outlives the group (the array API or TensorFlow may share it); it ends at
        exit or with mtxcomm.shutdown()."""

    def abort(self):
        _core.shutdown()


def _create(opts, backend_options):
    """register_backend's creator (extended_api=True)."""
    world = None
    ranks = list(opts.global_ranks_in_group or [])
    if _core.is_initialized():
        world = _core.size()
    if ranks and world is not None and ranks != list(range(world)):
        raise RuntimeError(
            "mtxcomm backend: a group of ranks %s: mtxcomm runs groups of the whole world "
            "(%d ranks) only; create this one with new_group(ranks, backend=\"gloo\")"
            % (ranks, world))
    if opts.group_size != len(ranks or range(opts.group_size)) or (world is not None and
                                                                    opts.group_size != world):
        raise RuntimeError(
            "mtxcomm backend: a group of %d ranks: mtxcomm runs groups of the whole world "
            "(%s ranks) only; create this one with new_group(ranks, backend=\"gloo\")"
            % (opts.group_size, world))
    options = backend_options
    if not isinstance(options, _C10dBackend.Options):
        options = _C10dBackend.Options(BACKEND_NAME, timeout=opts.timeout)
    return MtxcommBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, options)


_registered = False


def register():
    """Registers the "mtxcomm" backend with torch.distributed (idempotent)."""
    global _registered
    if _registered or BACKEND_NAME.upper() in dist.Backend._plugins:
        _registered = True
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    _registered = True
