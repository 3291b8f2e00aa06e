"""The calls in flight: ``Submitter`` names and submits requests to mtxcomm's engine, ``Work``
is one collective in flight (``wait``, ``is_completed``, ``get_future``...), and the
process-wide helpers behind them: the keeper that holds every call's buffers until the engine
is done with them, and the thread that completes ``get_future()``'s futures.

Used by the backend (``backend.py``: one Submitter per process group) and the Horovod-style API
(``_ops.py``: one Submitter, ``"hvd"``).
"""

import collections
import datetime
import functools
import os
import queue
import threading
import time
import weakref

import torch
import torch.distributed as dist

from mtxcomm import _arrays, _core
from mtxcomm.torch import _tensors

__all__ = ["to_seconds", "group_seconds", "Work", "Submitter", "keeper"]

# Requests of one Submitter in flight at once. Request names repeat with this period
# ("torch.<group>.<seq % window>"), so a steady-state step of the same collectives is named the
# same every time (the engine's response cache then agrees on it with one bit per request); a
# submit that would reuse the name of a request still in flight first waits for it.
_WINDOW = 64


def _now():
    return time.monotonic()


def to_seconds(timeout):
    """A timedelta (or number of seconds) as seconds; None or <= 0 -> None."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    return timeout if timeout > 0 else None


def group_seconds(timeout):
    """A process group's wait limit in seconds: its ``timeout`` (PyTorch's default is 30
    minutes), or ``MTXCOMM_TIMEOUT`` where that is set and shorter, so that the variable
    bounds a wait on a silent peer under torch as it does everywhere else."""
    seconds = to_seconds(timeout)
    text = os.environ.get("MTXCOMM_TIMEOUT", "").strip()
    if not text:
        return seconds
    try:
        env = float(text)
    except ValueError:
        raise ValueError(
            "MTXCOMM_TIMEOUT=%r is not a number of seconds (e.g. MTXCOMM_TIMEOUT=300)" % text
        ) from None
    if not env > 0:  # the library refuses it at init, naming it
        return seconds
    return env if seconds is None else min(seconds, env)


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
                self._thread = threading.Thread(
                    target=self._run, name="mtxcomm-torch-futures", daemon=True
                )
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

    def settle(self):
        """Waits until the engine is done with every call held now, then lets them go (their
        Works finished, a dropped one's copies made): the C++ backend's worker runs it after a
        call it delegated to this backend, whose Work nobody may wait for."""
        with self._lock:
            items = list(self._items)
        for pendings, _, _, _ in items:
            for p in pendings:
                p.wait()
        self.sweep()


keeper = _Keeper()


class Work(dist._Work):
    """One collective in flight: ``wait(timeout)``, ``is_completed()``, ``is_success()``,
    ``exception()``, ``result()`` (the output tensors), ``get_future()`` (a
    ``torch.futures.Future`` whose value is ``result()``)."""

    def __init__(self, submitter, what, pendings, outputs, finish=None, deadline=None):
        super().__init__()
        self._what = what
        self._pendings = pendings
        self._outputs = outputs
        self._finish_fn = finish
        self._deadline = deadline
        self._submitter = submitter
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
            % (self._what, _core.rank(), seconds)
        )
        self._submitter.broken = str(e)
        return e

    def wait(self, timeout=None):
        if self._finished:
            if self._error is not None:
                raise self._error
            return True
        seconds = to_seconds(timeout)
        if seconds is None and self._deadline is not None:
            seconds = max(0.0, self._deadline[0] - _now())
            limit = self._deadline[1]
        else:
            limit = seconds
        if not self._wait_engine(seconds):
            raise self._timeout_error(limit)
        self._finish()
        keeper.sweep()  # the calls before this one are done too: let them go
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
        self._raw.set_result(
            _Failed(self._error) if self._error is not None else list(self._outputs)
        )

    def _complete_future(self):
        seconds = None if self._deadline is None else max(0.0, self._deadline[0] - _now())
        if not self._wait_engine(seconds):
            self._raw.set_result(_Failed(self._timeout_error(self._deadline[1])))
            self._wait_engine(None)  # the engine may still use the buffers: wait it out
            self._finish()
            return
        self._finish()
        self._set_future()


# ---- submitting -------------------------------------------------------------------------------


class Submitter:
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

    @property
    def seq(self):
        """How many auto-named requests this Submitter has submitted."""
        return self._seq

    def _next_name(self):
        while len(self._inflight) >= _WINDOW:
            # The group's timeout bounds this wait as it bounds Work.wait (a peer that never
            # makes the call, or died, must not hang the submitting thread).
            if not self._inflight[0].wait(-1.0 if self.timeout is None else self.timeout):
                self.broken = (
                    "the request of %d calls ago did not complete within the "
                    "process group's timeout of %.0f s" % (_WINDOW, self.timeout)
                )
                raise _arrays.TimeoutError(
                    "mtxcomm backend: rank %d: %s (a rank that never "
                    "made that call, or a stalled peer)" % (_core.rank(), self.broken)
                )
            self._inflight.popleft()
        while self._inflight and self._inflight[0].done():
            self._inflight.popleft()
        name = "%s.%d" % (self._prefix, self._seq % _WINDOW)
        self._seq += 1
        return name

    def check_usable(self):
        """Raises once a call of this Submitter timed out (see ``broken``)."""
        if self.broken is not None:
            raise RuntimeError(
                "mtxcomm backend: the process group takes no more collectives "
                "after an earlier one timed out (%s); destroy it and restart "
                "the job" % self.broken
            )

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
        with self._lock:
            auto = name is None
            if auto:
                name = self._next_name()
            p = _core.submit(
                kind, name, inputs, code, shapes, int(op), int(root), splits, outputs, out_shapes
            )
            if auto:
                self._inflight.append(p)
        return p

    def placeholder(self):
        """Takes the next name with a request no real call makes; waits for it (bounded)."""
        empty = torch.empty(0, dtype=torch.int8)
        try:
            # root -1: kRefusedRoot (bindings/common/request.h), which the others' error names
            # as a call this rank refused.
            p = self.submit(
                _core.KIND_ALLREDUCE,
                [empty.data_ptr()],
                _tensors.code(empty, "placeholder"),
                [[0]],
                [empty.data_ptr()],
                [[0]],
                root=-1,
            )
        except Exception:  # noqa: BLE001 - the caller's own error is the one to raise
            return
        p.wait(-1.0 if self.timeout is None else self.timeout)

    def work(self, what, pendings, outputs, keep, finish=None):
        """A Work for pendings; keep: what the engine reads or writes for them (held by the
        keeper until the engine is done with them)."""
        deadline = None if self.timeout is None else (_now() + self.timeout, self.timeout)
        w = Work(self, what, pendings, outputs, finish, deadline)
        keeper.hold(pendings, keep, w, finish)
        return w


def collective(method):
    """A backend call that, when this rank refuses its own arguments before submitting
    anything, still takes its place in the group's sequence of calls: it submits a request
    that cannot match the others' (an allreduce of int8 (0,)), so their call fails at once with
    InvalidUsageError instead of waiting, and the next call of every rank pairs with the next
    again; then it raises its own error. (Ranks that all refuse the same way agree on the
    placeholder and all raise.)"""

    @functools.wraps(method)
    def call(self, *args):
        sub = self._submitter
        seq = sub.seq
        try:
            return method(self, *args)
        except (ValueError, TypeError):
            if sub.seq == seq and sub.broken is None:
                sub.placeholder()
            raise

    return call
