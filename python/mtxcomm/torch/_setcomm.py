"""The communicator of one process set: an mtxcomm communicator of the set's ranks only, made
through the C API (``include/mtxcomm/mtxcomm.h``, the library the package ships in
``mtxcomm/lib``), and a thread of its own that runs the set's calls on it.

Why not the engine: the engine runs every request over the whole world (a request is ready
when every rank has made it), and a rank outside a set never makes the set's calls. A set's
communicator is a second, independent one, bootstrapped as a world of its own
(``mtxcomm_comm_init_from_env`` with ``MTXCOMM_RANK``/``MTXCOMM_SIZE`` of the set and a TCP store
its first rank opens; the address and a fresh job secret reach the others through the global
set), so it has the library's transports, shared memory and checks.

What differs from the engine: a set's calls run in the order each rank makes them (one thread
per set, in submission order), not paired by name; no fusion. Every call first exchanges a
small descriptor (collective, op, root, dtypes, shapes, name, by one allgather of 8 integers),
so ranks that make different calls in the same place raise InvalidUsageError on every rank of
the set instead of mixing data. allgather's first dimensions travel by a second small
allgather, alltoall's splits by a small alltoall.
"""

import ctypes
import os
import queue
import threading
import zlib

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _bootstrap, _handles, _tensors

__all__ = ["SetComm", "init_comm", "store_address"]

_c = ctypes
_P = _c.c_void_p
_SIZES = _c.POINTER(_c.c_size_t)
_SIGNATURES = {
    "mtxcomm_comm_init_from_env": ([_c.POINTER(_P)], _c.c_int),
    "mtxcomm_comm_destroy": ([_P], _c.c_int),
    "mtxcomm_get_last_error": ([_P], _c.c_char_p),
    "mtxcomm_comm_set_call_label": ([_P, _c.c_char_p], _c.c_int),
    "mtxcomm_allreduce": ([_P, _P, _c.c_size_t, _c.c_int, _c.c_int, _P, _P], _c.c_int),
    "mtxcomm_broadcast": ([_P, _P, _c.c_size_t, _c.c_int, _c.c_int, _P, _P], _c.c_int),
    "mtxcomm_allgather": ([_P, _P, _c.c_size_t, _c.c_int, _P, _P], _c.c_int),
    "mtxcomm_reduce_scatter": ([_P, _P, _c.c_size_t, _c.c_int, _c.c_int, _P, _P], _c.c_int),
    "mtxcomm_alltoall": ([_P, _P, _c.c_size_t, _c.c_int, _P, _P], _c.c_int),
    "mtxcomm_alltoallv": ([_P, _SIZES, _SIZES, _P, _SIZES, _SIZES, _c.c_int, _P, _P], _c.c_int),
    "mtxcomm_barrier": ([_P], _c.c_int),
    "mtxcomm_config_get": ([_c.c_char_p, _c.c_char_p, _c.c_size_t], _c.c_int),
    # point-to-point (_p2p.py)
    "mtxcomm_isend": (
        [_P, _c.c_size_t, _c.c_int, _c.c_int, _c.c_int, _P, _c.POINTER(_P)],
        _c.c_int,
    ),
    "mtxcomm_irecv": (
        [_P, _c.c_size_t, _c.c_int, _c.c_int, _c.c_int, _P, _c.POINTER(_P)],
        _c.c_int,
    ),
    "mtxcomm_test": ([_P, _c.POINTER(_c.c_int)], _c.c_int),
    "mtxcomm_wait": ([_P, _c.c_double], _c.c_int),
    "mtxcomm_request_free": ([_P], _c.c_int),
}
_lib = []


def _library():
    """libmtxcomm (the copy mtxcomm._core is linked against, so one library in the process)."""
    if not _lib:
        lib = _c.CDLL(os.path.join(os.path.dirname(_core.__file__), "lib", "libmtxcomm.so.0"))
        for fn, (args, res) in _SIGNATURES.items():
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = res
        _lib.append(lib)
    return _lib[0]


_INT64 = _tensors.code(torch.empty(0, dtype=torch.int64), "process set")
_KINDS = {
    "allreduce": 1,
    "allgather": 2,
    "broadcast": 3,
    "alltoall": 4,
    "reducescatter": 5,
    "barrier": 6,
}


def config_get(name):
    """The library's validated value of configuration variable name (a string)."""
    buf = _c.create_string_buffer(256)
    lib = _library()
    code = lib.mtxcomm_config_get(name.encode(), buf, len(buf))
    if code:
        msg = lib.mtxcomm_get_last_error(None)
        raise _arrays._error(code, msg.decode(errors="replace") if msg else name)
    return buf.value.decode()


def store_address():
    """(store, secret) for a set's bootstrap: a TCP store on a free port of this host, which
    the set's first rank opens when it creates the communicator."""
    import secrets

    return "tcp:" + _bootstrap._bootstrap_address(), secrets.token_hex(32)


def init_comm(rank, size, store, secret, timeout=None, label="a communicator", read=()):
    """A C API communicator (a ctypes handle) of size ranks, this one rank; collective over
    them (each passes the same store, a "tcp:HOST:PORT" its rank 0 opens, and secret).
    timeout: MTXCOMM_TIMEOUT in seconds (None: the environment's). label names it in errors.
    read: configuration variables to return the values of as well ((comm, [values])), read
    under the environment the communicator was made with (the job's own may hold values the
    library refuses, such as an empty MTXCOMM_RANK, which this one replaces)."""
    lib = _library()
    env = {
        "MTXCOMM_RANK": str(rank),
        "MTXCOMM_SIZE": str(size),
        "MTXCOMM_STORE": store,
        "MTXCOMM_JOB_SECRET": secret,
        # The process was placed when the engine started: not again.
        "MTXCOMM_PLACEMENT": "off",
    }
    if timeout is not None:
        env["MTXCOMM_TIMEOUT"] = "%g" % max(1.0, timeout)
    saved = {
        k: os.environ.get(k) for k in list(env) + ["MTXCOMM_JOB_SECRET_FILE", "MTXCOMM_TRANSPORT"]
    }
    os.environ.update(env)
    os.environ.pop("MTXCOMM_JOB_SECRET_FILE", None)
    if os.environ.get("MTXCOMM_TRANSPORT") == "mpi":
        os.environ.pop("MTXCOMM_TRANSPORT")  # the communicator bootstraps over its TCP store
    comm = _P()
    values = []
    try:
        code = lib.mtxcomm_comm_init_from_env(_c.byref(comm))
        if not code:
            values = [config_get(name) for name in read]
    finally:
        _bootstrap.restore_environ(saved)
    if code:
        msg = lib.mtxcomm_get_last_error(None)
        raise _arrays._error(
            code,
            "mtxcomm.torch: the communicator of %s: %s"
            % (label, msg.decode(errors="replace") if msg else ""),
        )
    return (comm, values) if read else comm


class _SetWork:
    """One call on a set's thread: done once the thread ran it (or it failed)."""

    def __init__(self):
        self._done = threading.Event()
        self._error = None

    def is_completed(self):
        return self._done.is_set()

    def wait(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True


def _crc(*parts):
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class SetComm:
    """The communicator of process set set_id (ranks: the global ranks, sorted) on this rank,
    one of them; collective over the set's ranks (which all pass the same store and secret)."""

    def __init__(self, set_id, ranks, global_rank, store, secret, label=None, timeout=None):
        self.id = set_id
        self.ranks = list(ranks)
        self.rank = self.ranks.index(global_rank)
        self.size = len(self.ranks)
        # How errors name this communicator and the call that made it.
        self.label = label or "process set %d (ranks %s)" % (set_id, self.ranks)
        self._comm = init_comm(self.rank, self.size, store, secret, timeout, self.label)
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._loop, name="mtxcomm-comm-%s" % set_id, daemon=True
        )
        self._thread.start()

    # ---- the thread -----------------------------------------------------------------------

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, call, work = item
            try:
                fn(call)
            except BaseException as e:  # noqa: BLE001 - the call's synchronize raises it
                work._error = e
            work._done.set()

    def _call(self, fn, output=None):
        """fn(call) run on the set's thread: a Call (_handles) done when it has run (fn may
        set the call's output)."""
        if self._comm is None:
            raise ValueError("mtxcomm.torch: %s was removed" % self.label)
        work = _SetWork()
        call = _handles.Call([work], output=output)
        self._queue.put((fn, call, work))
        return call

    def close(self):
        """Runs the calls already made, then frees the communicator (local)."""
        if self._comm is None:
            return
        self._queue.put(None)
        self._thread.join()
        _library().mtxcomm_comm_destroy(self._comm)
        self._comm = None

    # ---- the C API ------------------------------------------------------------------------

    def _last_error(self, comm):
        msg = _library().mtxcomm_get_last_error(comm)
        return msg.decode(errors="replace") if msg else ""

    def _ok(self, code, what):
        if code:
            raise _arrays._error(
                code,
                "mtxcomm.torch.%s on %s, rank %d there: %s"
                % (what, self.label, self.rank, self._last_error(self._comm)),
            )

    def _agree(self, what, name, dtypes, shapes, op=0, root=0, skip_dim0=False, extra=0):
        """The descriptor exchange: raises InvalidUsageError on every rank of the set where the
        ranks' calls differ (collective, op, root, dtypes, shapes, name). extra: a number each
        rank tells the others (not compared); returns every rank's, in rank order."""
        lib = _library()
        if name is not None:
            lib.mtxcomm_comm_set_call_label(self._comm, str(name).encode())
        dims = [tuple(s[1:]) if skip_dim0 else tuple(s) for s in shapes]
        kind = next(v for k, v in _KINDS.items() if k in what)
        mine = torch.tensor(
            [kind, len(shapes), int(op), int(root), _crc(dtypes), _crc(dims), _crc(name), extra],
            dtype=torch.int64,
        )
        every = torch.empty(self.size, 8, dtype=torch.int64)
        self._ok(
            lib.mtxcomm_allgather(mine.data_ptr(), every.data_ptr(), 8, _INT64, self._comm, None),
            what,
        )
        bad = [r for r in range(self.size) if not torch.equal(every[r, :7], every[0, :7])]
        if bad:
            fields = ("collective", "number of tensors", "op", "root", "dtypes", "shapes", "name")
            differ = [
                f for i, f in enumerate(fields) if any(every[r][i] != every[0][i] for r in bad)
            ]
            raise _arrays.InvalidUsageError(
                "mtxcomm.torch.%s on %s: the ranks disagree on the %s (ranks %s there differ "
                "from its rank 0; its calls pair in the order each rank makes them)"
                % (what, self.label, ", ".join(differ), bad),
                2,
            )
        return every[:, 7].tolist()

    # ---- the collectives: each returns a Call ---------------------------------------------

    def allreduce(self, ins, outs, op, finish, what, name):
        lib = _library()

        def run(_):
            self._agree(what, name, [b.code for b in ins], [b.dims() for b in ins], op)
            for i, o in zip(ins, outs):
                self._ok(
                    lib.mtxcomm_allreduce(
                        i.ptr(), o.ptr(), i.view.numel(), i.code, int(op), self._comm, None
                    ),
                    what,
                )
            finish(None)

        return self._call(run)

    def broadcast(self, b, root, finish, what, name):
        lib = _library()

        def run(_):
            self._agree(what, name, [b.code], [b.dims()], root=root)
            self._ok(
                lib.mtxcomm_broadcast(
                    b.ptr(), b.ptr(), b.view.numel(), b.code, root, self._comm, None
                ),
                what,
            )
            finish(None)

        return self._call(run)

    def allgather(self, ts, bufs, what, name):
        lib = _library()
        n, k = self.size, len(ts)

        def run(call):
            self._agree(
                what, name, [b.code for b in bufs], [b.dims() for b in bufs], skip_dim0=True
            )
            mine = torch.tensor([t.shape[0] for t in ts], dtype=torch.int64)
            rows = torch.empty(n, k, dtype=torch.int64)
            self._ok(
                lib.mtxcomm_allgather(
                    mine.data_ptr(), rows.data_ptr(), k, _INT64, self._comm, None
                ),
                what,
            )
            outs = []
            for i, (t, b) in enumerate(zip(ts, bufs)):
                counts = rows[:, i].tolist()
                row = int(torch.Size(t.shape[1:]).numel()) * (2 if t.is_complex() else 1)
                out = torch.empty((sum(counts),) + tuple(t.shape[1:]), dtype=t.dtype)
                flat = _tensors.Buf(out, what)
                top = max(counts)
                if min(counts) == top:
                    self._ok(
                        lib.mtxcomm_allgather(
                            b.ptr(), flat.ptr(), top * row, b.code, self._comm, None
                        ),
                        what,
                    )
                else:
                    # Uneven first dimensions: every rank's rows padded to the longest.
                    pad = torch.zeros((top,) + tuple(t.shape[1:]), dtype=t.dtype)
                    pad[: t.shape[0]] = t
                    padded = torch.empty((n * top,) + tuple(t.shape[1:]), dtype=t.dtype)
                    pb, gb = _tensors.Buf(pad, what), _tensors.Buf(padded, what)
                    self._ok(
                        lib.mtxcomm_allgather(
                            pb.ptr(), gb.ptr(), top * row, b.code, self._comm, None
                        ),
                        what,
                    )
                    start = 0
                    for r, c in enumerate(counts):
                        out[start : start + c] = padded[r * top : r * top + c]
                        start += c
                outs.append(out)
            call.output = (outs, rows)

        return self._call(run)

    def alltoall(self, t, b, splits, what, name):
        lib = _library()
        n = self.size

        def run(call):
            self._agree(what, name, [b.code], [b.dims()], skip_dim0=True)
            sp = torch.tensor(splits, dtype=torch.int64)
            recv = torch.empty(n, dtype=torch.int64)
            self._ok(
                lib.mtxcomm_alltoall(sp.data_ptr(), recv.data_ptr(), 1, _INT64, self._comm, None),
                what,
            )
            row = int(torch.Size(t.shape[1:]).numel()) * (2 if t.is_complex() else 1)
            out = torch.empty((int(recv.sum()),) + tuple(t.shape[1:]), dtype=t.dtype)
            o = _tensors.Buf(out, what)
            scounts = [s * row for s in splits]
            rcounts = [int(c) * row for c in recv.tolist()]
            arrays = []
            for counts in (scounts, rcounts):
                displs = [sum(counts[:j]) for j in range(n)]
                arrays += [(_c.c_size_t * n)(*counts), (_c.c_size_t * n)(*displs)]
            self._ok(
                lib.mtxcomm_alltoallv(
                    b.ptr(),
                    arrays[0],
                    arrays[1],
                    o.ptr(),
                    arrays[2],
                    arrays[3],
                    b.code,
                    self._comm,
                    None,
                ),
                what,
            )
            call.output = (out, recv.to(torch.int32))

        return self._call(run)

    def reducescatter(self, bufs, obufs, op, finish, what, outs, name):
        lib = _library()
        n, me = self.size, self.rank

        def run(_):
            self._agree(what, name, [b.code for b in bufs], [b.dims() for b in bufs], op)
            for b, o, _ in zip(bufs, obufs, outs):
                d0 = b.dims()[0]
                row = b.view.numel() // d0 if d0 else 0
                if d0 % n == 0:
                    self._ok(
                        lib.mtxcomm_reduce_scatter(
                            b.ptr(), o.ptr(), (d0 // n) * row, b.code, int(op), self._comm, None
                        ),
                        what,
                    )
                    continue
                # Uneven (d0 // n rows each, one more on the first d0 % n): the whole
                # reduction, of which this rank keeps its rows.
                full = torch.empty_like(b.view)
                fb = _tensors.Buf(full, what)
                self._ok(
                    lib.mtxcomm_allreduce(
                        b.ptr(), fb.ptr(), b.view.numel(), b.code, int(op), self._comm, None
                    ),
                    what,
                )
                start = (me * (d0 // n) + min(me, d0 % n)) * row
                o.view.copy_(full[start : start + o.view.numel()])
            finish(None)

        return self._call(run, output=outs)

    def barrier(self):
        lib = _library()

        def run(_):
            self._agree("barrier", None, [], [])
            self._ok(lib.mtxcomm_barrier(self._comm), "barrier")

        self._call(run).wait()
