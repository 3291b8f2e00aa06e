"""The calls of the Horovod-style API in flight: ``Call`` (one call made of one or two steps of
engine requests), the handles that ``poll`` and ``synchronize`` take, and the names in flight
(a second call of a name still in flight raises, as Horovod).

A call whose output size is only known once the ranks have told each other theirs (allgather,
alltoall) is two steps: the sizes, then the data into an output of the agreed size. The second
step is submitted as soon as the first is done, by a helper thread that waits for it (one per
such call in flight, kept for the next), so the call returns at once, ``poll`` says whether the
data are there, and a rank never blocks in a call waiting for another rank to make one.
"""

import queue
import threading

__all__ = ["Call", "Done", "register", "poll", "synchronize", "claim_name", "run_in_background"]


# ---- helper threads ---------------------------------------------------------------------------


class _Waiters:
    """Threads that each run one blocking function (a wait for a first step, then its second),
    as many as are busy at once: a thread idle for 10 s ends. No call ever waits behind
    another's wait, whatever order the ranks' steps complete in."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._idle = 0

    def run(self, fn):
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._queue.put(fn)
                return
        threading.Thread(
            target=self._loop, args=(fn,), name="mtxcomm-torch-steps", daemon=True
        ).start()

    def _loop(self, fn):
        while True:
            try:
                fn()
            except BaseException:  # noqa: BLE001 - the call keeps its error for synchronize
                pass
            with self._lock:
                self._idle += 1
            try:
                fn = self._queue.get(timeout=10.0)
            except queue.Empty:
                with self._lock:
                    # A run() may have counted on this thread just as the wait ended.
                    try:
                        fn = self._queue.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


_waiters = _Waiters()


def run_in_background(fn):
    """Runs fn on a helper thread of its own (see _Waiters)."""
    _waiters.run(fn)


# ---- calls ------------------------------------------------------------------------------------


class Done:
    """A call that needed no request (one rank, nothing to send): complete at once."""

    def __init__(self, error=None):
        self._error = error

    def is_completed(self):
        return True

    def wait(self):
        if self._error is not None:
            raise self._error
        return True


class Call:
    """One call in flight: the Works (``_work.Work`` or alike) of its first step; ``then``, where
    there is a second step, a function of no argument that submits it and returns (its Works,
    the call's output), run once every first-step Work succeeded; ``check``, a function run when
    the call is done that raises where the call must fail (a join the results revealed).
    ``output``: the call's output (given, or from ``then``)."""

    def __init__(self, works, then=None, check=None, output=None):
        self._works = list(works)
        self._then = then
        self._check = check
        self._second = None
        self._error = None
        self._lock = threading.Lock()
        self.output = output
        self.key = None  # the name under which the call is in flight (set by its maker)
        if then is not None:
            run_in_background(lambda: self._advance(block=True))

    def _advance(self, block):
        """Submits the second step once the first is done (by whichever thread comes first);
        False while the first step is running and block is False."""
        if self._then is None or self._second is not None or self._error is not None:
            return True
        if block:
            for w in self._works:
                try:
                    w.wait()
                except BaseException:  # noqa: BLE001 - taken again under the lock below
                    pass
        elif not all(w.is_completed() for w in self._works):
            return False
        with self._lock:
            if self._second is None and self._error is None:
                try:
                    for w in self._works:
                        w.wait()  # done: returns or raises at once
                    second, self.output = self._then()
                    self._second = list(second)
                except BaseException as e:  # noqa: BLE001 - raised by wait()
                    self._error = e
        return True

    def _last(self):
        return self._works if self._then is None else self._second

    def is_completed(self):
        if not self._advance(block=False):
            return False
        return self._error is not None or all(w.is_completed() for w in self._last())

    def wait(self):
        self._advance(block=True)
        if self._error is not None:
            raise self._error
        for w in self._last():
            w.wait()
        if self._check is not None:
            self._check()
        return True


# ---- handles ----------------------------------------------------------------------------------


class _Handle:
    def __init__(self, call, result, post, name):
        self.call = call
        self.result = result
        self.post = post
        self.name = name


_lock = threading.Lock()
_handles = {}
_next_handle = [0]
# name -> (the call made under it, its number among this rank's calls). A name is taken from
# the call until this rank has seen the call's result: at synchronize() of its handle, at a
# poll() that says True, or, for a handle never synchronized, once the call is done and this
# rank has made another call since. So a second call of a name made right after the first,
# with nothing between, raises whatever the other ranks' timing (the first may have been
# completed by fast peers, but the program has not seen it).
_names = {}
_calls = [0]


def _release(name, call):
    with _lock:
        if _names.get(name, (None,))[0] is call:
            del _names[name]


def claim_name(name, what):
    """Raises ValueError when a call named name is still in flight on this rank (Horovod's
    rule: two calls in flight at once need different names); None names nothing."""
    if name is None:
        return
    with _lock:
        held = _names.get(name)
        made_since = held is not None and _calls[0] > held[1] + 1
    if held is None:
        return
    if made_since and held[0].is_completed():
        _release(name, held[0])
        return
    raise ValueError(
        "mtxcomm.torch.%s: a call named %r is in flight on this rank (made and "
        "not synchronized yet); two calls in flight at once need different "
        "names" % (what, name)
    )


def register(call, result, post=None, name=None):
    """A handle (an int) for call; synchronize returns result (post(result) when post is set).
    name: the call's name, taken until the call is done (see _names)."""
    with _lock:
        h = _next_handle[0]
        _next_handle[0] += 1
        _handles[h] = _Handle(call, result, post, name)
        if name is not None:
            _names[name] = (call, _calls[0])
        _calls[0] += 1
    return h


def poll(handle):
    """True when the asynchronous call of handle is done, so that synchronize returns at once;
    never blocks."""
    with _lock:
        entry = _handles.get(handle)
    if entry is None:
        raise ValueError("mtxcomm.torch.poll: unknown handle %r" % (handle,))
    done = entry.call.is_completed()
    if done and entry.name is not None:
        _release(entry.name, entry.call)
    return done


def synchronize(handle):
    """Waits for the asynchronous call of handle; returns its output (raises its error)."""
    with _lock:
        entry = _handles.pop(handle, None)
    if entry is None:
        raise ValueError("mtxcomm.torch.synchronize: unknown handle %r" % (handle,))
    try:
        entry.call.wait()
    finally:
        if entry.name is not None:
            _release(entry.name, entry.call)
    return entry.post(entry.result) if entry.post else entry.result
