"""The tf.data iterators of Keras' epoch loops, destroyed off the training thread.

Keras' ``fit`` makes a new tf.data iterator every epoch (``evaluate`` one per call) and the old
one is destroyed on the training thread when the next epoch's loop starts. Destroying the
iterator of a pipeline with tf.data's autotuning on (its default) can leave the calling thread
idle for a long time in a process with one core, which is a rank's share of the cores under
mtxrun's placement on a machine with as many cores as ranks: measured with TensorFlow 2.21 on a
2-vCPU AMD EPYC, Keras' NumPy pipeline of the digits job (42 batches of 32 rows), pinned to one
core, spent 110-180 ms between ``on_epoch_begin`` and the first batch in most epochs, of which
17-27 ms of CPU time; with the old iterators kept alive, or autotuning off, 15-25 ms. At two
ranks every rank waits for the slowest at the first allreduce, so the job pays it every epoch.

:func:`install` wraps the train and test functions that Keras builds: each keeps the last
iterator it was called with and, when it is called with another one (the next epoch's), hands
the previous one to a background thread, which destroys it once no one else refers to it (it
waits for Keras' own references to go). The iterators still held when ``fit``/``evaluate``
return are handed over by :func:`release_held`.
Nothing else changes: the same iterator objects, the same calls, in the same order.
"""

import atexit
import functools
import os
import queue
import sys
import threading

_STOP = object()
# How often the background thread looks again at iterators someone else still refers to
# (Keras' loop variable until the next epoch's loop starts, its evaluation iterator cache):
# from 2 ms, doubling while nothing changes, up to 50 ms.
_FIRST_LOOK_S, _LAST_LOOK_S = 0.002, 0.05


class _Releaser:
    """One daemon thread that destroys the iterators it is handed once it holds their last
    reference; it lets go of them at interpreter exit (atexit, before TensorFlow is torn
    down)."""

    def __init__(self):
        self._reset()
        atexit.register(self._stop)
        if hasattr(os, "register_at_fork"):  # a forked child starts its own thread
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._stopped = False
        self._lock = threading.Lock()

    def release(self, obj):
        with self._lock:
            if self._stopped or sys.is_finalizing():
                return  # exiting: obj is dropped by the caller (no thread can start now)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="mtxcomm-iterator-release"
                )
                self._thread.start()
        self._queue.put(obj)

    def _run(self):
        pending = []
        wait = _FIRST_LOOK_S
        while True:
            try:
                obj = self._queue.get(timeout=wait if pending else None)
                wait = _FIRST_LOOK_S
            except queue.Empty:
                obj = None
                wait = min(_LAST_LOOK_S, wait * 2)
            if obj is _STOP:
                return
            if obj is not None:
                pending.append(obj)
                obj = None
            kept = []
            while pending:
                held = pending.pop()
                # 2: this local and getrefcount's argument. Then rebinding it destroys the
                # iterator here, on this thread.
                if sys.getrefcount(held) > 2:
                    kept.append(held)
                held = None
            pending = kept

    def _stop(self):
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopped = True
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout=10.0)


_releaser = _Releaser()


class _HoldsLastIterator:
    """Keras' train/test function, keeping the iterator it was last called with."""

    def __init__(self, function, iterator_types):
        functools.update_wrapper(self, function)
        self._function = function
        self._types = iterator_types
        self._held = None

    def __call__(self, iterator, *args, **kwargs):
        if iterator is not self._held and isinstance(iterator, self._types):
            self.release()
            self._held = iterator
        return self._function(iterator, *args, **kwargs)

    def release(self):
        held, self._held = self._held, None
        if held is not None:
            _releaser.release(held)

    def __del__(self):
        self.release()


def install(model_cls, tf):
    """Wraps ``model_cls.make_train_function`` and ``make_test_function`` (once)."""
    if model_cls.__dict__.get("_mtx_iterators_released", False):
        return
    types = (tf.data.Iterator,)
    if hasattr(tf.distribute, "DistributedIterator"):
        types += (tf.distribute.DistributedIterator,)
    for attr in ("train_function", "test_function"):
        original = getattr(model_cls, "make_" + attr)

        def make(self, force=False, _original=original, _attr=attr):
            _original(self, force=force)
            function = getattr(self, _attr, None)
            if function is not None and not isinstance(function, _HoldsLastIterator):
                setattr(self, _attr, _HoldsLastIterator(function, types))
            return getattr(self, _attr)

        setattr(model_cls, "make_" + attr, functools.wraps(original)(make))
    model_cls._mtx_iterators_released = True


def release_held(model, attrs=("train_function", "test_function")):
    """Hands the iterators that model's train and test functions (attrs) still hold to the
    thread."""
    for attr in attrs:
        function = getattr(model, attr, None)
        if isinstance(function, _HoldsLastIterator):
            function.release()
