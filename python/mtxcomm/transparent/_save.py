"""Saves on rank 0 only (``keras.Model.save``, ``save_weights``, ``export``,
``keras.saving.save_model``, ``tf.saved_model.save``), each a collective that every rank leaves
once rank 0's file is in place (:func:`_save_on_rank_0`), and the callbacks that fit runs on
rank 0 alone, inside which a save is no collective (:class:`_RankZeroOnly`)."""

import functools
import sys
import threading

from ._tf import tf_module


class _RankZeroOnly:
    """The callbacks that fit runs on rank 0 alone (its ModelCheckpoint, BackupAndRestore, ...;
    the other ranks dropped them) while it runs them. A save made inside one of their methods
    is no collective: found at the save by looking up the calling frames for one of these
    objects as ``self`` (the callback objects themselves are left as they are: copies and
    pickles of them stay plain, and the same object given to evaluate, which every rank runs,
    is not one of them there)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active = {}  # id -> [callback, count]

    def enter(self, callbacks):
        with self._lock:
            for c in callbacks:
                self._active.setdefault(id(c), [c, 0])[1] += 1

    def leave(self, callbacks):
        with self._lock:
            for c in callbacks:
                entry = self._active[id(c)]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._active[id(c)]

    def inside(self):
        if not self._active:
            return False
        frame = sys._getframe(1)
        while frame is not None:
            obj = frame.f_locals.get("self")
            entry = self._active.get(id(obj)) if obj is not None else None
            if entry is not None and entry[0] is obj:
                return True
            frame = frame.f_back
        return False


_rank_0_only = _RankZeroOnly()


def _save_on_rank_0(keras, model_cls, rank, mtx):
    """Model.save, save_weights, export, keras.saving.save_model and tf.saved_model.save write
    on rank 0 only; rank 0 writes each local file through a temporary name in its directory and
    a rename, so that it is never seen half written (SavedModel directories are written in
    place).

    Every rank runs the same script, so every rank makes the same saves at the same points:
    each is a collective (a broadcast of rank 0's outcome), every rank returns from it once
    rank 0's file is in place (a load right after reads it), and if rank 0's save failed every
    rank raises. Not inside a callback that only rank 0 runs (its ModelCheckpoint,
    BackupAndRestore: _RankZeroOnly), nor inside another save (Model.export calls
    tf.saved_model.save)."""
    import os

    saving = threading.local()  # the outermost save is the collective (saves may nest)

    def collective():
        return not getattr(saving, "depth", 0) and not _rank_0_only.inside()

    def together(ok, path):
        """Every rank: rank 0's outcome (True: its file is in place)."""
        flag = mtx.broadcast(
            tf_module().constant([1 if ok else 0], tf_module().int32),
            0,
            name="mtxcomm.transparent.save",
        )
        if int(flag.numpy()[0]) != 1 and rank != 0:
            raise RuntimeError(
                "mtxcomm transparent: rank 0 failed to save %s (its error is on "
                "rank 0's output); this rank skipped the save" % (path,)
            )

    def saved_together(write, path_at):
        """write (rank 0's save, or the others' skip), made a collective."""

        @functools.wraps(write)
        def save(*args, **kwargs):
            if not collective():
                return write(*args, **kwargs)
            path = args[path_at] if len(args) > path_at else kwargs.get("filepath")
            saving.depth = 1
            ok = False
            try:
                result = write(*args, **kwargs)
                ok = True
            finally:
                saving.depth = 0
                together(ok, path)
            return result

        return save

    def local(path):
        return isinstance(path, (str, os.PathLike)) and "://" not in os.fspath(path)

    def atomic(original, at):
        @functools.wraps(original)
        def write(*args, **kwargs):
            args = list(args)
            path = args[at] if len(args) > at else kwargs.get("filepath")
            if not local(path) or (kwargs.get("overwrite") is False and os.path.exists(path)):
                return original(*args, **kwargs)  # (Keras asks before overwriting)
            path = os.fspath(path)
            head, tail = os.path.split(path)
            # The suffix stays last: Keras checks it (.keras, .h5, .weights.h5).
            cut = tail.find(".")
            tmp = os.path.join(
                head,
                ".%s.mtxcomm-%d%s"
                % (tail[:cut] if cut > 0 else tail, os.getpid(), tail[cut:] if cut > 0 else ""),
            )
            if len(args) > at:
                args[at] = tmp
            else:
                kwargs["filepath"] = tmp
            try:
                result = original(*args, **kwargs)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return result

        return write

    def skip(*args, **kwargs):
        return None

    # An import of tensorflow.saved_model (Model.export makes one) rebinds tf.saved_model to a
    # new module that takes save from its defining module: both are replaced.
    from tensorflow.python.saved_model import save as saved_model_module

    if rank == 0:
        write, file_write = (lambda f: f), (lambda f: atomic(f, 1))
    else:
        # SavedModel directories too: ranks writing one directory together broke each other's
        # variables files.
        write = file_write = lambda f: skip
    model_cls.save = saved_together(file_write(model_cls.save), 1)
    model_cls.save_weights = saved_together(file_write(model_cls.save_weights), 1)
    model_cls.export = saved_together(write(model_cls.export), 1)
    saved_model_module.save = saved_together(write(saved_model_module.save), 1)
    tf_module().saved_model.save = saved_model_module.save
    for module in (keras.saving, keras.models):
        module.save_model = saved_together(file_write(module.save_model), 1)
