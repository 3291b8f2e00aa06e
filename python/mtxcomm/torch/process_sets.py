"""Process sets of the Horovod-style API (Horovod's ``horovod/common/process_sets``): a
``ProcessSet`` is a set of ranks whose collectives run among themselves (``process_set=`` of
every call), ``global_process_set`` every rank.

``add_process_set(ranks)`` and ``remove_process_set(ps)`` are called by every rank, with the
same arguments, in the same order (Horovod's dynamic process sets). The global set's calls run
on the engine; another set's on a communicator of its ranks (``_setcomm.py``: made when the set
is added, freed when it is removed or at shutdown), in the order each rank makes them.
"""

import atexit
import json
import operator
import threading

import numpy as np

from mtxcomm import _arrays, _core
from mtxcomm.torch import _setcomm
from mtxcomm.torch._bootstrap import need_init


def rank():
    return _core.rank()


def size():
    return _core.size()


def _gathered_sets(ranks):
    """Every rank's list of ranks, in rank order (the array API: the lengths, then the lists)."""
    lengths = _arrays.allgather(np.array([len(ranks)], np.int64))
    flat = _arrays.allgather(np.array(ranks, np.int64))
    every, at = [], 0
    for n in lengths:
        every.append([int(v) for v in flat[at : at + n]])
        at += n
    return every


def _broadcast_address(address, root):
    """root's address (a JSON-able tuple) on every rank (the array API: its length, then it)."""
    data = json.dumps(address).encode() if rank() == root else b""
    n = int(_arrays.broadcast(np.array([len(data)], np.int64), root=root)[0])
    buf = np.frombuffer(data, np.uint8).copy() if rank() == root else np.zeros(n, np.uint8)
    return tuple(json.loads(_arrays.broadcast(buf, root=root).tobytes().decode()))


__all__ = [
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "communicator",
    "close_all",
]


class ProcessSet:
    """A set of ranks (global ranks, kept sorted) that run collectives together. It becomes
    usable once added (``add_process_set``), which gives it a ``process_set_id``."""

    def __init__(self, ranks):
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise ValueError("ProcessSet: expected a list of ranks, got %r" % (ranks,))
        ranks = list(ranks)
        try:
            # Python and NumPy integers (operator.index), never bools or floats.
            if any(isinstance(r, bool) for r in ranks):
                raise TypeError
            ranks = [operator.index(r) for r in ranks]
        except TypeError:
            raise ValueError("ProcessSet: ranks must be ints, got %r" % (ranks,)) from None
        self._ranks = sorted(ranks)
        self.process_set_id = None
        self._comm = None

    @property
    def ranks(self):
        if self is global_process_set:
            return list(range(_core.size())) if _core.is_initialized() else []
        return list(self._ranks)

    def size(self):
        """The number of ranks, or None before the set is added."""
        if self.process_set_id is None or (
            self is global_process_set and not _core.is_initialized()
        ):
            return None
        return size() if self is global_process_set else len(self._ranks)

    def rank(self):
        """This rank's index in the set (what allgather's rank order follows), or None before
        the set is added; ValueError on a rank outside the set. (Collectives still take global
        ranks: broadcast's root_rank is hvd.rank()'s number.)"""
        if self.process_set_id is None:
            return None
        if self is global_process_set:
            return rank()
        if rank() not in self._ranks:
            raise ValueError("ProcessSet.rank: rank %d is not in %s" % (rank(), self))
        return self._ranks.index(rank())

    def included(self):
        """Whether this rank is in the set."""
        return self is global_process_set or rank() in self._ranks

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_sets = {}  # process_set_id -> ProcessSet (added, not removed)
_next_id = [1]


def add_process_set(process_set):
    """Adds a process set (a ProcessSet or a list of ranks) and returns it, usable at once.
    Every rank calls it with the same ranks (collective over every rank: the set's ranks also
    create its communicator). ValueError where a set of those ranks exists already (the global
    set has every rank) or the ranks disagree."""
    need_init("add_process_set")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError("mtxcomm.torch.add_process_set: %s was added already" % ps)
    ranks = ps.ranks
    every = _gathered_sets(ranks)
    if any(r != ranks for r in every):
        raise ValueError(
            "mtxcomm.torch.add_process_set: the ranks passed different sets: %s" % every
        )
    if not ranks or len(set(ranks)) != len(ranks) or not 0 <= ranks[0] <= ranks[-1] < size():
        raise ValueError(
            "mtxcomm.torch.add_process_set: %s is not a set of distinct ranks of "
            "[0, %d)" % (ranks, size())
        )
    with _lock:
        taken = [s for s in _sets.values() if s.ranks == ranks]
    if ranks == list(range(size())) or taken:
        raise ValueError(
            "mtxcomm.torch.add_process_set: a process set of ranks %s exists "
            "already (%s)" % (ranks, taken[0] if taken else global_process_set)
        )
    # The set's first rank opens the bootstrap store of its communicator; every rank learns
    # the address (the others ignore it).
    address = _setcomm.store_address() if rank() == ranks[0] else None
    address = _broadcast_address(address, ranks[0])
    with _lock:
        set_id = _next_id[0]
        _next_id[0] += 1
    if rank() in ranks:
        ps._comm = _setcomm.SetComm(set_id, ranks, rank(), *address)
    ps.process_set_id = set_id
    with _lock:
        _sets[set_id] = ps
    return ps


def remove_process_set(process_set):
    """Removes an added process set (every rank calls it); True when it was removed, False for
    the global set or a set not added. Its calls already made run first."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    with _lock:
        ps = _sets.pop(set_id, None)
    if ps is None:
        return False
    if ps._comm is not None:
        ps._comm.close()
        ps._comm = None
    ps.process_set_id = None
    return True


def communicator(process_set, what):
    """The communicator a call with process_set runs on: None for the global set (the
    engine), the set's own for another; ValueError for a set not added or without this
    rank."""
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            "mtxcomm.torch.%s: process_set must be a ProcessSet, got %s"
            % (what, type(process_set).__name__)
        )
    if process_set.process_set_id is None:
        raise ValueError(
            "mtxcomm.torch.%s: %s has not been added (add_process_set) or was "
            "removed" % (what, process_set)
        )
    if process_set._comm is None:
        raise ValueError("mtxcomm.torch.%s: rank %d is not in %s" % (what, rank(), process_set))
    return process_set._comm


def close_all():
    """Frees every set's communicator (at shutdown); the sets are removed."""
    with _lock:
        sets = list(_sets.values())
    for ps in sets:
        remove_process_set(ps)


# Before the engine's own exit handler (registered earlier, run later): a communicator still
# alive when the process ends would end it with std::terminate (its threads still joinable).
atexit.register(close_all)
