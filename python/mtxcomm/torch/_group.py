"""The process groups of the ``"mtxcomm"`` backend that are not the whole world in order (a
``new_group`` of a subset or of the world in another order, ``new_subgroups``, each dimension of a
``DeviceMesh``): their requests run on a communicator of the group's ranks (``_setcomm.SetComm``,
the one Horovod-style process sets use), one thread per group, instead of the engine.

``GroupSubmitter`` takes the requests the backend makes (``backend.py``: the engine's kinds,
flat buffers, op, root, splits) and returns pendings with the engine's interface (``done``,
``wait``, ``status``, ``received_splits``), so the backend's argument checks, staging and
``Work`` serve every group alike.

Why a communicator bootstrapped through the group's store, not ``mtxcomm_comm_split`` of the
world's: PyTorch creates a group's backend on the group's members only (the other ranks never
call into the backend for it, and with ``use_local_synchronization=True`` they do not even call
``new_group``), while a split is collective over the whole parent. Each group's communicator is
bootstrapped as a world of its own: the group's rank 0 opens a TCP bootstrap store and publishes
its address and a fresh job secret in the group's c10d store (a ``PrefixStore`` of the group's
own), as the world's backend does (``_bootstrap.py``). Its collectives then have the library's
transports, shared memory and checks; its cost is measured in ``bench/RESULTS.md``.

Every request first exchanges a small descriptor (``SetComm._agree``), so ranks that make
different calls in the same place raise ``InvalidUsageError`` instead of mixing data; allgather
sends each rank's element count in it (uneven inputs become an alltoallv), alltoall's splits
travel by a small alltoall.
"""

import ctypes
import json
import threading

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _setcomm, _work

__all__ = ["GroupSubmitter", "open_comm", "open_group", "is_world"]

_STORE_KEY = "mtxcomm/group"
_WHAT = {
    _core.KIND_ALLREDUCE: "allreduce",
    _core.KIND_BROADCAST: "broadcast",
    _core.KIND_ALLGATHER: "allgather",
    _core.KIND_REDUCE_SCATTER: "reducescatter",
    _core.KIND_ALLTOALL: "alltoall",
}
_INT64 = _setcomm._INT64

_groups_opened = [0]
_opened_lock = threading.Lock()


def _meet(store, group_rank, timeout, key):
    """(store address, secret) of a communicator of the group: its rank 0 makes them and
    publishes them under key in the group's c10d store, the others read them there."""
    if group_rank == 0:
        address, secret = _setcomm.store_address()
        store.set(key, json.dumps({"store": address, "secret": secret}))
        return address, secret
    if _work.to_seconds(timeout) is not None:
        store.wait([key], timeout)
    else:
        store.wait([key])
    info = json.loads(bytes(store.get(key)).decode())
    return info["store"], info["secret"]


def open_group(store, group_rank, ranks, timeout):
    """The communicator of a group (ranks: its global ranks in group-rank order) on this rank;
    collective over the group's ranks, which all pass the group's c10d store."""
    address, secret = _meet(store, group_rank, timeout, _STORE_KEY)
    with _opened_lock:
        gid = _groups_opened[0]
        _groups_opened[0] += 1
    comm = _setcomm.SetComm(
        "group%d" % gid,
        ranks,
        ranks[group_rank],
        address,
        secret,
        label="the process group of global ranks %s" % list(ranks),
        timeout=_work.group_seconds(timeout),
    )
    return comm


def open_comm(store, group_rank, ranks, timeout, key, read=()):
    """A bare C API communicator (a ctypes handle) of the group, bootstrapped as open_group's
    (under key in the group's c10d store), for the C++ backend, which owns it from then on;
    with read, (communicator, the values of those configuration variables)."""
    address, secret = _meet(store, group_rank, timeout, key)
    return _setcomm.init_comm(
        group_rank,
        len(ranks),
        address,
        secret,
        _work.group_seconds(timeout),
        "the C++ backend of the process group of global ranks %s" % list(ranks),
        read=read,
    )


class _Pending(_setcomm._SetWork):
    """A request on a group's thread, with the engine's Pending interface."""

    def __init__(self):
        super().__init__()
        self.received = []

    def done(self):
        return self._done.is_set()

    def wait(self, timeout=-1.0):
        return self._done.wait(None if timeout is None or timeout < 0 else timeout)

    def status(self):
        e = self._error
        if e is None:
            return 0, ""
        return int(getattr(e, "code", 1 if isinstance(e, (ValueError, TypeError)) else 7)), str(e)

    def received_splits(self):
        return list(self.received)


class GroupSubmitter(_work.Submitter):
    """Submits the backend's requests to a group's communicator (see the module's docstring)."""

    def __init__(self, comm, timeout=None):
        super().__init__("group", timeout)
        self.comm = comm

    def submit(
        self,
        kind,
        inputs,
        code,
        shapes,
        outputs,
        out_shapes,
        op=_arrays.SUM,
        root=0,
        splits=None,
        name=None,
    ):
        self.check_usable()
        comm = self.comm
        if comm._comm is None:
            raise ValueError("mtxcomm backend: %s was destroyed" % comm.label)
        what = _WHAT[kind]
        p = _Pending()
        counts = [int(torch.Size(s).numel()) for s in shapes]
        out_counts = [int(torch.Size(s).numel()) for s in out_shapes]

        def run(_):
            _run(comm, p, what, kind, inputs, code, counts, outputs, out_counts, op, root, splits)

        with self._lock:
            comm._queue.put((run, None, p))
            self._seq += 1
        return p


def _run(comm, p, what, kind, inputs, code, counts, outputs, out_counts, op, root, splits):
    """One request on the group's thread (its pending completes when this returns or raises)."""
    lib, c = _setcomm._library(), comm._comm
    n = comm.size
    mine = counts[0] if kind in (_core.KIND_ALLGATHER, _core.KIND_ALLTOALL) else 0
    # allgather's and alltoall's element counts may differ between ranks; the others' agree.
    agreed = [[0] if kind in (_core.KIND_ALLGATHER, _core.KIND_ALLTOALL) else counts]
    every = comm._agree(what, None, [code] * len(counts), agreed, op, root, extra=mine)
    if kind == _core.KIND_ALLREDUCE:
        for i, o, k in zip(inputs, outputs, counts):
            comm._ok(lib.mtxcomm_allreduce(i, o, k, code, int(op), c, None), what)
    elif kind == _core.KIND_BROADCAST:
        comm._ok(lib.mtxcomm_broadcast(inputs[0], outputs[0], counts[0], code, root, c, None), what)
    elif kind == _core.KIND_REDUCE_SCATTER:
        comm._ok(
            lib.mtxcomm_reduce_scatter(
                inputs[0], outputs[0], out_counts[0], code, int(op), c, None
            ),
            what,
        )
    elif kind == _core.KIND_ALLGATHER:
        _check_fits(comm, what, sum(every), out_counts[0])
        if min(every) == max(every):
            comm._ok(lib.mtxcomm_allgather(inputs[0], outputs[0], mine, code, c, None), what)
        else:  # uneven: an allgatherv as an alltoallv (the same block to every rank)
            displs = [sum(every[:r]) for r in range(n)]
            _alltoallv(comm, what, inputs[0], [mine] * n, [0] * n, outputs[0], every, displs, code)
    else:  # alltoall, splits in elements
        sp = torch.tensor(splits, dtype=torch.int64)
        got = torch.empty(n, dtype=torch.int64)
        comm._ok(lib.mtxcomm_alltoall(sp.data_ptr(), got.data_ptr(), 1, _INT64, c, None), what)
        received = got.tolist()
        _check_fits(comm, what, sum(received), out_counts[0])
        sdispls = [sum(splits[:j]) for j in range(n)]
        rdispls = [sum(received[:j]) for j in range(n)]
        _alltoallv(comm, what, inputs[0], splits, sdispls, outputs[0], received, rdispls, code)
        p.received = received


def _check_fits(comm, what, arriving, room):
    """Every rank raises (InvalidArgumentError) when the elements arriving on some rank do not
    equal the room its output has: no rank writes past an output or waits for a rank that
    refused."""
    bad = torch.tensor([0 if arriving == room else 1], dtype=torch.int64)
    lib = _setcomm._library()
    comm._ok(
        lib.mtxcomm_allreduce(
            bad.data_ptr(), bad.data_ptr(), 1, _INT64, _arrays.MAX, comm._comm, None
        ),
        what,
    )
    if bad.item():
        if arriving != room:
            raise _arrays.InvalidArgumentError(
                "mtxcomm backend: %s on %s, rank %d there: %d elements arrive but the output "
                "holds %d" % (what, comm.label, comm.rank, arriving, room),
                1,
            )
        raise _arrays.InvalidArgumentError(
            "mtxcomm backend: %s on %s: another rank's output does not hold what arrives "
            "there (its own error names the sizes)" % (what, comm.label),
            1,
        )


def _alltoallv(comm, what, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls, code):
    n = comm.size
    arrays = [
        (ctypes.c_size_t * n)(*[int(v) for v in a]) for a in (scounts, sdispls, rcounts, rdispls)
    ]
    comm._ok(
        _setcomm._library().mtxcomm_alltoallv(
            sendbuf, arrays[0], arrays[1], recvbuf, arrays[2], arrays[3], code, comm._comm, None
        ),
        what,
    )


def is_world(ranks, size):
    """Whether a group of these global ranks (in group-rank order) is the engine's world."""
    return _core.is_initialized() and _core.size() == size and list(ranks) == list(range(size))
