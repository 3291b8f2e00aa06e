"""Transparent data parallelism for unmodified Keras 3 scripts (``mtxrun --transparent``).

``mtxrun --transparent`` starts every rank with ``MTXCOMM_TRANSPARENT=1`` and this package's
``_transparent`` folder first on ``PYTHONPATH``, whose ``sitecustomize`` calls :func:`install`
before the user's script runs. Nothing in the script changes. What is hooked:

- at interpreter start, on ranks other than 0: ``sys.stdout`` goes to /dev/null (progress bars,
  prints), unless ``MTXCOMM_TRANSPARENT_OUTPUT=all`` (``mtxrun --all-ranks-output``); stderr is
  kept on every rank;
- when ``keras`` is imported: mtxcomm is initialised (collective) and the global random seed is
  set to one value drawn on rank 0 (``keras.utils.set_random_seed``), so every rank shuffles
  identically; a seed the script sets later is used as it is, on every rank;
- ``keras.Model.fit``: the compiled optimizer becomes a DistributedOptimizer (gradients averaged
  over ranks, once per step); ``train_step`` is wrapped so that each rank computes on its
  contiguous 1/N share of every global batch (rows [B*r/N, B*(r+1)/N)) and weights its gradient
  by its share, so the average equals the full batch's gradient; model variables and optimizer
  state are broadcast from rank 0 when training begins; the epoch's training logs are combined
  over ranks weighted by the rows each trained on (the values a 1-process run reports);
  XLA compilation of the train step is turned off (the collective ops have no XLA kernel);
  on ranks other than 0, ``verbose`` is 0 and ModelCheckpoint, BackupAndRestore, TensorBoard
  and CSVLogger callbacks are dropped;
- input: a NumPy input (arrays, or lists/dicts of arrays) stays here and each rank gathers its
  own share of every global batch by row index in the train step; the batches of row indices
  come from one iterator for the whole fit (:func:`_index_epochs`: the 1-process run's order
  under the script's seed, a new permutation every epoch without one), or from Keras' own
  batching and shuffling of an array of row indices where that order cannot be reproduced; a
  ``tf.data``
  dataset is mapped so that each rank keeps only its rows of every global batch (the rebatch of
  Keras' distribution code; what the pipeline computes before batching still runs on every
  rank, as with TensorFlow's own DATA sharding); other inputs (generators, PyDataset) are cut
  in the train step;
- ``keras.Model.evaluate`` / ``predict`` are distributed too: each rank computes on its rows
  of every batch; evaluate sums the metrics' state over the ranks (as tf.distribute does) so
  the results are the 1-process ones; predict gathers every batch's outputs in rank order, so
  they come back in the input's order on every rank; ``verbose=0`` on ranks other than 0;
- ``keras.Model.save``, ``save_weights`` and ``keras.saving.save_model``: write on rank 0 only;
- the tf.data iterator of each finished epoch (and of each ``evaluate``) is destroyed on a
  background thread, not on the training thread at the start of the next epoch: with one core
  per rank that destruction left the rank idle for 110-180 ms per epoch (see
  ``mtxcomm/tensorflow/keras/_iterators.py``);
- when training starts, once: a full garbage collection, then ``gc.freeze()`` (the ranks wait for
  each other every step: a collection walking every imported object on one rank stalls all).

Limits: a custom training loop with ``tf.GradientTape`` needs ``mtxcomm.tensorflow``
explicitly; the batch size stays the global batch; SparseTensor inputs are not split; with
``class_weight`` a NumPy input is cut in the train step (Keras needs the labels in its
pipeline).
"""

import functools
import inspect
import os
import sys
import threading

_installed = False
_lock = threading.Lock()


def _env_rank():
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MTXCOMM_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def install():
    """Called by the sitecustomize that mtxrun --transparent puts on PYTHONPATH."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    if _env_rank() != 0 and os.environ.get("MTXCOMM_TRANSPARENT_OUTPUT", "rank0") != "all":
        sys.stdout = open(os.devnull, "w")
    sys.meta_path.insert(0, _KerasImportHook())


class _KerasImportHook:
    """Runs _patch_keras right after the top-level keras package has been executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _KerasImportHook)]
            _patch_keras(module)

        loader.exec_module = exec_module
        return spec


def _patch_keras(keras):
    import mtxcomm.tensorflow as mtx
    import mtxcomm.tensorflow.keras as hvd
    import numpy as np
    from mtxcomm.tensorflow.keras import _iterators as iterators

    mtx.init()
    # One seed for every rank, drawn on rank 0: identical shuffling and initialisation.
    seed = int(np.random.SeedSequence().generate_state(1)[0] % (2 ** 31))
    seed = mtx.broadcast_object(seed, 0, name="mtxcomm.transparent.seed")
    keras.utils.set_random_seed(seed)
    _unseeded["seed"] = seed

    rank = mtx.rank()
    _synchronise_batch_norm(keras, hvd)
    _weigh_batch_means(keras, hvd)
    _share_additional_losses(keras, hvd)
    _record_state_assignments(keras, hvd)
    _draw_apart(keras, hvd)
    model_cls = keras.Model
    quiet_callbacks = tuple(c for c in (
        getattr(keras.callbacks, "ModelCheckpoint", None),
        getattr(keras.callbacks, "BackupAndRestore", None),
        getattr(keras.callbacks, "TensorBoard", None),
        getattr(keras.callbacks, "CSVLogger", None)) if c is not None)

    iterators.install(model_cls, tf_module())
    original_fit = model_cls.fit
    fit_signature = inspect.signature(original_fit)

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        bound = fit_signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        _same_data_everywhere("fit", arguments, ("x", "y", "sample_weight", "validation_data"),
                              mtx)
        _make_data_parallel(self, keras, hvd)
        user_callbacks = list(arguments.get("callbacks") or [])
        writes = any(isinstance(c, quiet_callbacks) for c in user_callbacks)
        if rank != 0:
            user_callbacks = [c for c in user_callbacks if not isinstance(c, quiet_callbacks)]
            arguments["verbose"] = 0
        # Ours first where they combine the epoch's logs (the user's callbacks then read the
        # combined ones); the start-of-training broadcast last, after every user callback's
        # on_train_begin (a BackupAndRestore restores weights and the epoch on rank 0 there).
        callbacks = [_RowWeightedLogs(self._mtx_rows, keras, hvd)
                     if hasattr(self, "_mtx_rows") else hvd.callbacks.MetricAverageCallback(),
                     _SameWeights(keras, hvd)]
        callbacks = callbacks + user_callbacks + [_StartAsRank0(keras, hvd),
                                                  _EpochEndTogether(keras, hvd, writes)]
        if _may_stop_mid_epoch(user_callbacks, keras, hvd):
            callbacks.append(_BatchEndTogether(keras, hvd))
        arguments["callbacks"] = callbacks
        _shard_input(self, arguments, tf_module())
        _freeze_garbage_collector()
        alone = [c for c in user_callbacks if isinstance(c, quiet_callbacks)] if rank == 0 else []
        _rank_0_only.enter(alone)
        try:
            return original_fit(*bound.args, **bound.kwargs)
        except tf_module().errors.DeadlineExceededError as e:
            raise _stall_hint(e) from e
        finally:
            _rank_0_only.leave(alone)
            iterators.release_held(self)

    model_cls.fit = fit

    for name in ("train_on_batch", "test_on_batch"):
        original = getattr(model_cls, name)
        sig = inspect.signature(original)

        def on_batch(original=original, sig=sig, name=name):
            @functools.wraps(original)
            def method(self, *args, **kwargs):
                bound = sig.bind(self, *args, **kwargs)
                _make_data_parallel(self, keras, hvd)
                # The batch itself, not row indices: a train step traced by fit for another
                # kind of input (NumPy rows as indices, a sharded dataset) is traced again.
                if name == "train_on_batch" and getattr(self, "_mtx_input", "step") != "step":
                    self._mtx_input = "step"
                    self.train_function = None
                as_dict = bound.arguments.get("return_dict", False)
                bound.arguments["return_dict"] = True
                logs = original(*bound.args, **bound.kwargs)
                # The whole batch's values, not this rank's share's, as Python floats (what
                # Keras returns: its own conversion ran on this rank's values).
                logs = _python_logs(self._get_metrics_result_or_logs(logs))
                return logs if as_dict else self._flatten_metrics_in_order(logs)
            return method

        setattr(model_cls, name, on_batch())

    for name in ("evaluate", "predict"):
        original = getattr(model_cls, name)
        sig = inspect.signature(original)

        def distributed(original=original, sig=sig, name=name):
            @functools.wraps(original)
            def method(self, *args, **kwargs):
                bound = sig.bind(self, *args, **kwargs)
                if rank != 0:
                    bound.arguments["verbose"] = 0
                if not bound.arguments.get("kwargs", {}).get("_use_cached_eval_dataset"):
                    # (Not fit's own validation: fit compared those arrays.)
                    _same_data_everywhere(name, bound.arguments, ("x", "y", "sample_weight"), mtx)
                _make_data_parallel(self, keras, hvd)
                try:
                    return original(*bound.args, **bound.kwargs)
                except tf_module().errors.DeadlineExceededError as e:
                    raise _stall_hint(e) from e
                finally:
                    if name == "evaluate":
                        # (Only evaluate's own: fit's is still in use when fit validates.)
                        iterators.release_held(self, ("test_function",))
            return method

        setattr(model_cls, name, distributed())

    _save_on_rank_0(keras, model_cls, rank, mtx)


# The bytes of an array that _same_data_everywhere digests whole; of a larger one, rows spread
# evenly over it up to about this many bytes (a digest at several hundred MB/s).
_DIGEST_BYTES = 16 << 20


def _digest(value):
    """16 bytes naming an argument's structure, and the contents of its NumPy arrays (and of
    what converts to one: tensors, pandas frames); other leaves (datasets, generators) by type
    only."""
    import hashlib
    import numpy as np
    tf = tf_module()
    h = hashlib.blake2b(digest_size=16)
    try:
        leaves = tf.nest.flatten(value)
        h.update(repr(tf.nest.map_structure(lambda _: 0, value)).encode())  # keys, nesting
    except Exception:
        leaves = [value]
    for leaf in leaves:
        h.update(type(leaf).__name__.encode())
        if leaf is None or isinstance(leaf, (tf.data.Dataset, str, bytes)):
            h.update(repr(leaf).encode() if isinstance(leaf, (str, bytes)) else b"")
            continue
        if not isinstance(leaf, np.ndarray):
            if not (hasattr(leaf, "__array__") and hasattr(leaf, "shape")):
                continue  # a generator, a PyDataset, a Python number: by type
            try:
                leaf = np.asarray(leaf)
            except Exception:
                continue
        h.update(("%s%s" % (leaf.dtype.str, leaf.shape)).encode())
        if leaf.ndim and leaf.nbytes > _DIGEST_BYTES:
            rows = max(1, int(len(leaf) * _DIGEST_BYTES // leaf.nbytes))
            leaf = leaf[np.linspace(0, len(leaf) - 1, rows).astype(np.int64)]
        if leaf.dtype.hasobject:
            h.update(repr(leaf.tolist()).encode())
        else:
            h.update(np.ascontiguousarray(leaf).view(np.uint8).reshape(-1).data)
    return h.digest()


def _same_data_everywhere(call, arguments, names, mtx):
    """Raises on every rank when the ranks were given different data for call (fit, evaluate,
    predict): each rank takes its own rows of every batch of the data it holds, so ranks that
    hold different arrays (drawn from an unseeded generator, or before mtxrun could seed one)
    would train on a mix of them and report a mix, silently. Compares digests of the NumPy
    arrays (_digest): one allgather of 16 bytes per argument."""
    import numpy as np
    tf = tf_module()
    mine = b"".join(_digest(arguments.get(a)) for a in names)
    every = mtx.allgather(tf.constant(np.frombuffer(mine, np.uint8)[None, :]),
                          name="mtxcomm.transparent.same_data/" + call).numpy()
    differ = [r for r in range(len(every)) if bytes(every[r]) != bytes(every[0])]
    if not differ:
        return
    first = next(i for i in range(len(names))
                 if any(bytes(every[r][16 * i:16 * i + 16]) != bytes(every[0][16 * i:16 * i + 16])
                        for r in differ))
    raise ValueError(
        "mtxrun --transparent: the %s given to %s differ between the ranks: rank(s) %s hold "
        "other values than rank 0 (or other shapes or types). Every rank runs the whole script "
        "and takes its own rows of every batch of the data it holds, so every rank must build "
        "the same data: a split or shuffle drawn from a generator without a seed "
        "(np.random.default_rng(), random.shuffle before keras is imported) or data drawn or "
        "read differently in each process gives each rank other rows. Seed it "
        "(np.random.default_rng(0)), or draw it after importing keras (mtxrun --transparent "
        "seeds Python's, NumPy's and TensorFlow's global generators alike on every rank)."
        % (names[first], call, ",".join(map(str, differ))))


def _stall_hint(error):
    """A stall verdict in fit, evaluate or predict (whose collectives are all the transparent
    mode's: the gradients', the ranks' batches, metrics, stops; which of them the verdict
    names depends on timing), with what usually causes it."""
    message = getattr(error, "message", str(error))
    if "MTXCOMM_STALL_TIMEOUT" not in message:
        return error
    return type(error)(error.node_def, error.op, message + ". Under --transparent every rank "
                       "runs the script on the same input and takes its share of each batch: "
                       "did the ranks' inputs give different numbers of batches (a generator or "
                       "dataset that depends on the process, or is not seeded alike), or did "
                       "code that only some ranks run collect (fit's ModelCheckpoint, "
                       "BackupAndRestore, TensorBoard and CSVLogger run on rank 0 alone)?")


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
        flag = mtx.broadcast(tf_module().constant([1 if ok else 0], tf_module().int32), 0,
                             name="mtxcomm.transparent.save")
        if int(flag.numpy()[0]) != 1 and rank != 0:
            raise RuntimeError("mtxcomm transparent: rank 0 failed to save %s (its error is on "
                               "rank 0's output); this rank skipped the save" % (path,))

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
            tmp = os.path.join(head, ".%s.mtxcomm-%d%s" % (
                tail[:cut] if cut > 0 else tail, os.getpid(), tail[cut:] if cut > 0 else ""))
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


_gc_frozen = False


def _freeze_garbage_collector():
    """Once, when training starts: what the imports and the model built is moved out of the
    garbage collector's reach (gc.freeze, after a full collection). The ranks of a job wait for
    each other every step, so a full collection that walks TensorFlow's and Keras' millions of
    objects on one rank (100-300 ms) stalls them all; afterwards a collection only walks what
    training creates."""
    global _gc_frozen
    if _gc_frozen:
        return
    import gc
    gc.collect()
    gc.freeze()
    _gc_frozen = True


def tf_module():
    import tensorflow as tf
    return tf


def _share(batch, n, r):
    """This rank's rows [B*r/N, B*(r+1)/N) of a global batch of B rows, as (start, end, count);
    a share of no rows (a last batch smaller than the ranks) becomes one row, weighted 0."""
    tf = tf_module()
    start = batch * r // n
    end = batch * (r + 1) // n
    count = end - start
    start = tf.where(count > 0, start, tf.zeros_like(start))
    end = tf.where(count > 0, end, tf.minimum(tf.ones_like(end), batch))
    return start, end, count


def _take(data, start, end):
    tf = tf_module()
    flat = tf.nest.flatten(data)

    def cut(t):
        if t is None:
            return None
        if isinstance(t, tf.SparseTensor):
            raise ValueError("mtxrun --transparent cannot split SparseTensor inputs")
        return t[start:end]

    return tf.nest.pack_sequence_as(data, [cut(t) for t in flat])


def _rows(data):
    tf = tf_module()
    first = next(t for t in tf.nest.flatten(data) if t is not None)
    return tf.shape(first, out_type=tf.int64)[0]


def _numpy_structure(x):
    """x as a structure of NumPy arrays of one length, or None when it is not one."""
    import numpy as np
    tf = tf_module()
    if x is None:
        return None
    flat = tf.nest.flatten(x)
    if not flat or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in flat):
        return None
    n = len(flat[0])
    return x if all(len(a) == n for a in flat) else None


def _shard_input(model, arguments, tf):
    """Each rank produces only its rows of every global batch (see the module docstring)."""
    previous = getattr(model, "_mtx_input", None)
    _choose_input(model, arguments, tf)
    if model._mtx_input != previous:
        model.train_function = None  # traced for the other kind of input


def _choose_input(model, arguments, tf):
    import math
    import numpy as np
    x, y = arguments.get("x"), arguments.get("y")
    sw = arguments.get("sample_weight")
    if isinstance(x, tf.data.Dataset) and getattr(model, "built", False):
        # (Keras inspects the first element to build a model that is not built yet: such a
        # model's data is cut in the train step instead.)
        n, r = model._mtx_size, model._mtx_rank

        def mine(*element):
            data = element[0] if len(element) == 1 else element
            start, end, _ = _share(_rows(data), n, r)
            return _take(data, start, end), _rows(data)

        arguments["x"] = x.map(mine, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True)
        model._mtx_input = "dataset"
        return
    if arguments.get("class_weight") is not None or _numpy_structure(x) is None:
        model._mtx_input = "step"
        return
    for other in (y, sw):
        if other is not None and _numpy_structure(other) is None:
            model._mtx_input = "step"
            return
    rows = len(tf.nest.flatten(x)[0])
    if any(len(a) != rows for a in tf.nest.flatten((y, sw)) if a is not None):
        model._mtx_input = "step"  # Keras reports the mismatch itself
        return
    split = arguments.get("validation_split") or 0.0
    if split and arguments.get("validation_data") is None:
        # Keras' own split (the last fraction of the rows), done here so that validation sees
        # the rows themselves.
        at = int(math.floor(rows * (1.0 - split)))
        arguments["validation_data"] = tf.nest.map_structure(
            lambda a: None if a is None else a[at:], (x, y, sw))
        if sw is None:
            arguments["validation_data"] = arguments["validation_data"][:2]
        x, y, sw = tf.nest.map_structure(lambda a: None if a is None else a[:at], (x, y, sw))
        arguments["validation_split"] = 0.0
        rows = at
    # The arrays stay here; the train step gathers its rows by index. The batches of row
    # indices come from one iterator for the whole fit (_index_epochs), or, where their order
    # cannot be reproduced, from Keras' own batching and shuffling of the indices, which picks
    # the rows a 1-process run would (the permutation does not depend on the data).
    _hold_arrays(model, (x, y, sw), tf)
    arguments["y"] = None
    arguments["sample_weight"] = None
    model._mtx_input = "indices"
    epochs = _index_epochs(rows, arguments, getattr(model, "steps_per_execution", 1), tf)
    if epochs is None:
        arguments["x"] = np.arange(rows, dtype=np.int64)
        return
    batch = arguments.get("batch_size") or 32  # (Keras' default)
    arguments["x"], arguments["steps_per_epoch"] = epochs
    arguments["batch_size"] = None
    arguments["shuffle"] = False  # (the dataset's order; Keras warns that it ignores True)
    if arguments.get("validation_batch_size") is None:
        arguments["validation_batch_size"] = batch  # fit's own default: the batch size


# Seeds of the index permutations of fits whose script set no seed of its own: rank 0's draw
# (the same on every rank) and the number of such fits so far (every rank calls fit alike).
_unseeded = {"seed": None, "fits": 0}


def _keras_index_batches(rows, batch, shuffle, tf):
    """The batches of row indices Keras' own pipeline for NumPy arrays gives an epoch, if it
    gives the same ones every epoch, else None. Keras (3.x, TensorFlow backend) makes a new
    iterator every epoch and re-instantiates its pipeline's functions there: about 8-20 ms of
    one core per epoch, mostly TensorFlow's graph optimizer, on the training thread. With a
    global seed set its shuffle then yields one permutation in every epoch (its random op
    starts from the same seed in each new iterator), so that epoch's batches, repeated, are
    what it would give; checked on two of its epochs, not assumed."""
    try:
        import numpy as np
        from keras.src.trainers.data_adapters import array_data_adapter
        adapter = array_data_adapter.ArrayDataAdapter(
            np.arange(rows, dtype=np.int64), batch_size=batch, shuffle=shuffle)
        dataset = adapter.get_tf_dataset()
        first = [b.numpy() for b in dataset]
        second = [b.numpy() for b in dataset]
    except Exception:  # another Keras: its own path
        return None
    if len(first) != len(second) or any(
            a.shape != b.shape or (a != b).any() for a, b in zip(first, second)):
        return None
    return first


def _index_epochs(rows, arguments, steps_per_execution, tf):
    """(dataset of row-index batches for every epoch, steps per epoch) for a NumPy fit, or None
    to leave the batching to Keras. Keras' loop then keeps one iterator for the whole fit
    (fit's steps_per_epoch with an endless dataset) instead of making one per epoch:
    - a script that set its own seed, or shuffle=False: Keras' batches of one epoch, repeated
      (_keras_index_batches): the 1-process run's, every epoch;
    - a script that set none (the seed is the one install drew on rank 0): a new permutation
      every epoch, as a 1-process run without a seed draws (Keras would repeat one, under that
      seed), the same on every rank: a stateless shuffle keyed by the seed, the fit's number
      and the epoch.
    shuffle="batch", a steps_per_epoch of the script, keras.config's max steps per epoch and a
    steps_per_execution that does not divide the epoch's steps keep Keras' own path (its last
    execution of an epoch takes the batches left; from an endless dataset it would take the
    next epoch's)."""
    import math
    import numpy as np
    import keras

    shuffle = arguments.get("shuffle", True)
    if shuffle not in (True, False) or arguments.get("steps_per_epoch") is not None:
        return None
    max_steps = getattr(getattr(keras, "config", None), "max_steps_per_epoch", None)
    if max_steps is not None and max_steps():
        return None
    batch = arguments.get("batch_size") or 32
    if not isinstance(batch, int) or batch <= 0 or rows <= 0:
        return None  # Keras reports it
    steps = math.ceil(rows / batch)
    if not isinstance(steps_per_execution, int) or steps_per_execution < 1 or \
            steps % steps_per_execution:
        return None
    full = rows // batch * batch

    def batches(order):
        """One epoch's batches of an order of the rows: full batches, then the rest."""
        data = tf.data.Dataset.from_tensor_slices(tf.reshape(order[:full], [-1, batch]))
        if full < rows:
            data = data.concatenate(tf.data.Dataset.from_tensors(order[full:]))
        return data

    seed = _unseeded["seed"]
    if not shuffle or seed is None or _global_seed() != seed:
        keras_batches = _keras_index_batches(rows, batch, shuffle, tf)
        if keras_batches is None or len(keras_batches) != steps:
            return None
        order = np.concatenate(keras_batches)
        return tf.data.Dataset.from_tensors(order).repeat().flat_map(batches), steps
    fit = _unseeded["fits"]
    _unseeded["fits"] += 1

    def permutation(epoch):
        return tf.random.experimental.stateless_shuffle(
            tf.range(rows, dtype=tf.int64),
            seed=tf.stack([tf.constant(seed, tf.int64), fit * (1 << 32) + epoch]))

    data = tf.data.Dataset.range(1 << 62).map(permutation).flat_map(batches)
    return data.prefetch(1), steps


def _global_seed():
    """TensorFlow's global seed (tf.random.set_seed, keras.utils.set_random_seed), or None
    when it cannot be read (then a script is taken to have set its own)."""
    try:
        from tensorflow.python.eager import context
        return context.global_seed()
    except Exception:
        return None


def _hold_arrays(model, arrays, tf):
    """This fit's arrays as the variables the traced train step gathers its rows from
    (model._mtx_arrays): a later fit with other arrays, or the same arrays changed in place,
    assigns its rows to them (any number of rows), so the step never trains on an earlier
    fit's data; arrays of another structure, dtype or row shape get new variables and a new
    trace. Not through Keras' attribute tracking: it would wrap dicts and lists of targets in
    its own tracked types, which its loss no longer matches to the outputs, and save the data
    with the model."""
    def spec(a):
        return None if a is None else (str(a.dtype), tuple(a.shape[1:]))

    signature = tf.nest.map_structure(spec, arrays)  # the structure too (dict keys, tuples)
    held = getattr(model, "_mtx_arrays", None)
    if held is not None and getattr(model, "_mtx_arrays_signature", None) == signature:
        for v, a in zip(tf.nest.flatten(held), tf.nest.flatten(arrays)):
            if a is not None:
                v.assign(a)
        return
    object.__setattr__(model, "_mtx_arrays", tf.nest.map_structure(
        lambda a: None if a is None else tf.Variable(
            a, trainable=False, shape=tf.TensorShape([None] + list(a.shape[1:]))), arrays))
    object.__setattr__(model, "_mtx_arrays_signature", signature)
    model.train_function = None


def _weigh_batch_means(keras, hvd):
    """In a transparent train or test step, a keras.metrics.Mean given one value per batch (a
    scalar: a loss tracker of a custom train_step, the per-output losses of a multi-output
    model) counts with this rank's share of the batch's rows as its weight, so that the sum of
    the ranks' states (how the epoch's logs are combined) counts each global batch once with
    the rows-weighted mean of the shares' values, the batch's own value, as the 1-process run
    counts it. The per-output losses are weighted by the batch's static size (Keras passes
    y_pred.shape[0]): where this rank's share has a static size, that is already its share
    of the 1-process run's weight; where it has none, the weight is the global batch's static
    size (None, as in the 1-process run, where the batch has none either) times the share.
    Values per row (the metrics of compile) and explicit weights are left as they are: their
    sum over the ranks is already the whole batch's."""
    mean_cls = getattr(keras.metrics, "Mean", None)
    original = getattr(mean_cls, "update_state", None)
    if original is None or getattr(original, "_mtx_shared", False):
        return
    tf = tf_module()

    def update_state(self, values, sample_weight=None):
        share = getattr(hvd._step_state, "row_share", None)
        if share is None:
            return original(self, values, sample_weight=sample_weight)
        model = hvd._step_state.model
        compiled = getattr(getattr(model, "_compile_loss", None), "metrics", ())
        per_output = any(m is self for m in compiled)
        if getattr(hvd._step_state, "summed_loss", False) and (
                per_output or self is getattr(model, "_loss_tracker", None)):
            # A loss summed over the rows (reduction "sum"): this rank's value covers its
            # share; the batch's is the sum over the ranks, this value over the share.
            values = tf.convert_to_tensor(values)
            values = tf.math.divide_no_nan(values, tf.cast(share, values.dtype))
        if sample_weight is None:
            values = tf.convert_to_tensor(values)
            if values.shape.rank == 0:
                weight = hvd._step_state.static_batch if per_output else None
                sample_weight = share * (1.0 if weight is None else float(weight))
        return original(self, values, sample_weight=sample_weight)

    update_state._mtx_shared = True
    mean_cls.update_state = update_state


def _layers(model):
    """The model and every layer inside it (Keras' own walk; the model alone where a Keras
    without it)."""
    try:
        return list(model._flatten_layers(include_self=True))
    except Exception:
        return [model]


def _own_state(model, keras):
    """ids of the model's numeric non-trainable weights whose assignments in a step are
    combined over the ranks (combined_state in _make_data_parallel): all but
    BatchNormalization's moving statistics, which the layer already computes from the global
    batch (_synchronise_batch_norm). Metric and random-seed state are not weights."""
    bn_cls = getattr(keras.layers, "BatchNormalization", None)
    synchronised = {id(v) for layer in _layers(model)
                    if bn_cls is not None and isinstance(layer, bn_cls)
                    for v in layer.non_trainable_weights}
    return {id(v) for v in model.non_trainable_weights
            if id(v) not in synchronised and _is_numeric(v)}


def _is_numeric(v):
    """Whether a variable holds numbers (floating or integer, not bool or string)."""
    dtype = tf_module().as_dtype(_variable_dtype(v))
    return dtype.is_floating or dtype.is_integer


def _variable_dtype(v):
    """A Keras variable's own dtype (its dtype property is the autocast one inside a
    mixed-precision layer)."""
    return getattr(v, "_dtype", None) or v.dtype


def _variable_value(v):
    """A Keras variable's value in its own dtype (not autocast)."""
    tf = tf_module()
    inner = getattr(v, "_value", None)
    return tf.identity(inner if inner is not None else v.value)


def _value_in(v, graph):
    """v's value read in graph, the step's (None: the step runs eagerly). An assignment inside a
    cond branch, a loop body or a nested tf.function is traced in a graph of its own, whose
    tensors the step cannot use after it; read in the step's graph, the value comes before
    that construct (built after its body: automatic control dependencies order the read
    first)."""
    tf = tf_module()
    if graph is None:
        with tf.init_scope():  # (a nested tf.function of an eager step: the value before it)
            return _variable_value(v)
    with graph.as_default():
        return _variable_value(v)


def _record_state_assignments(keras, hvd):
    """In a transparent train, test or predict step, the first assignment to each of the
    model's own non-trainable weights (_own_state) records the weight and its value before
    it, for combined_state; other assignments (the optimizer's, the metrics') are left
    alone."""
    variable_cls = getattr(keras, "Variable", None)
    original = getattr(variable_cls, "assign", None)
    if original is None or getattr(original, "_mtx_recorded", False):
        return

    def assign(self, value):
        before = getattr(hvd._step_state, "state_before", None)
        if before is not None and id(self) not in before and \
                id(self) in (hvd._step_state.state_candidates or ()):
            before[id(self)] = (self, _value_in(self, hvd._step_state.state_graph))
        return original(self, value)

    assign._mtx_recorded = True
    variable_cls.assign = assign


def _share_additional_losses(keras, hvd):
    """In a transparent train or test step whose compiled loss is summed over the rows
    (reduction "sum"), each of the model's additional losses (weight regularizers, activity
    regularizers, add_loss) counts with this rank's share of the batch's rows as its weight.
    Those losses are the batch's own value (a weight penalty) or a mean over its rows (Keras
    divides an activity regularizer by the batch's size), as in the 1-process run, where each
    counts once; the ranks' summed gradients (and losses) would otherwise count them once per
    rank. With a loss that is a mean over the rows, the whole loss is already weighted so."""
    model_cls = getattr(keras, "Model", None)
    original = getattr(model_cls, "_aggregate_additional_loss", None)
    if original is None or getattr(original, "_mtx_shared", False):
        return

    def _aggregate_additional_loss(self, loss):
        value = original(self, loss)
        share = getattr(hvd._step_state, "row_share", None)
        if share is None or not getattr(hvd._step_state, "summed_loss", False):
            return value
        return value * tf_module().cast(share, value.dtype)

    _aggregate_additional_loss._mtx_shared = True
    model_cls._aggregate_additional_loss = _aggregate_additional_loss


# An odd prime, coprime with TensorFlow's stateless seed modulus (2**31 - 2): the folded seeds
# of ranks 0, 1, 2, ... are distinct for any job size.
_RANK_SEED_STRIDE = 1000003


def _draw_apart(keras, hvd):
    """In a transparent train or test step, a draw from a keras.random.SeedGenerator (Dropout,
    GaussianNoise, the augmentation layers, keras.random.* with seed=None or a generator in a
    custom train_step) uses a seed with this rank folded in, so the ranks' rows of one global
    batch get different masks and noise, as the rows of the 1-process run's batch do; with one
    seed, row i of every rank's share drew the same mask. The generators' state (a variable,
    saved with the model) advances as before and stays equal on every rank; only the value
    handed to the draw differs. A draw with an integer seed (stateless: the same value at every
    call, e.g. a fixed random projection) is left the same on every rank. Rank 0 draws what it
    drew before."""
    generator_cls = getattr(getattr(keras, "random", None), "SeedGenerator", None)
    original = getattr(generator_cls, "next", None)
    if original is None or getattr(original, "_mtx_apart", False):
        return

    def next(self, ordered=True):
        value = original(self, ordered)
        rank = getattr(hvd._step_state, "seed_rank", 0)
        if not rank:
            return value
        tf = tf_module()
        fold = tf.constant([rank * _RANK_SEED_STRIDE, 0], dtype=value.dtype)
        return value + fold

    next._mtx_apart = True
    generator_cls.next = next


def _synchronise_batch_norm(keras, hvd):
    """In a transparent train step every BatchNormalization normalises with the statistics of
    the global batch (mtxcomm.tensorflow.sync_batch_norm.global_moments), as the 1-process run
    does, so the ranks' moving statistics stay the same and follow the 1-process run: with
    each rank's own half batch, the forward pass and the moving statistics would differ from
    it and between the ranks, and predict/evaluate would mix the ranks' models. Outside a
    transparent train step (inference, a custom loop) the layer is unchanged."""
    layer_cls = getattr(keras.layers, "BatchNormalization", None)
    original = getattr(layer_cls, "_moments", None)
    if original is None or getattr(original, "_mtx_global", False):
        return
    from mtxcomm.tensorflow.sync_batch_norm import global_moments

    def _moments(self, inputs, mask):
        weight = getattr(hvd._step_state, "row_weight", None)
        if weight is None:
            return original(self, inputs, mask)
        return global_moments(self, inputs, mask, row_weight=weight,
                              grad_scale=getattr(hvd._step_state, "grad_scale", None))

    _moments._mtx_global = True
    layer_cls._moments = _moments


def _model_optimizers(model, keras):
    """The compiled optimizer (an uncompiled model has none) and every other Keras optimizer
    the model or one of its sub-models holds, each once: as an attribute (a GAN's, which
    keras.io's compile(d_optimizer, g_optimizer) keeps so and its train_step applies), in a
    list, tuple or dict attribute, or as a sub-model's compiled optimizer."""
    found = []

    def visit(value, depth=0):
        if isinstance(value, keras.optimizers.Optimizer):
            if not any(value is f for f in found):
                found.append(value)
        elif depth < 2 and isinstance(value, (list, tuple, dict)):
            for item in (value.values() if isinstance(value, dict) else value):
                visit(item, depth + 1)

    for m in [m for m in _layers(model) if isinstance(m, keras.Model)]:
        visit(getattr(m, "optimizer", None))
        for value in vars(m).values():
            visit(value)
    return found


def _make_data_parallel(model, keras, hvd):
    import numpy as np
    tf = tf_module()

    for optimizer in _model_optimizers(model, keras):
        hvd.DistributedOptimizer(optimizer)
    if getattr(model, "_mtx_sharded", False):
        return
    if getattr(model, "jit_compile", False):
        model.jit_compile = False
    original_step = model.train_step
    original_test = model.test_step
    original_predict = model.predict_step
    n, r = hvd.size(), hvd.rank()
    object.__setattr__(model, "_mtx_size", n)
    object.__setattr__(model, "_mtx_rank", r)
    object.__setattr__(model, "_mtx_input", "step")
    # Rows this rank trained on in the epoch: the weight of its logs (its share of each batch
    # can be uneven). A plain attribute, not a Keras-tracked variable: never saved with the model.
    rows = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    object.__setattr__(model, "_mtx_rows", rows)

    def local_batch(data):
        """(this rank's rows of the global batch, its row count, the global batch's rows)."""
        mode = getattr(model, "_mtx_input", "step")
        if mode == "dataset":
            # The pipeline kept this rank's rows (an empty share: one row, weighted 0).
            local, batch = data
            _, _, count = _share(batch, n, r)
            return local, count, batch
        if mode == "indices":
            index = tf.nest.flatten(data)[0]
            batch = tf.shape(index, out_type=tf.int64)[0]
            start, end, count = _share(batch, n, r)
            mine = index[start:end]
            local = tf.nest.map_structure(
                lambda a: None if a is None else tf.gather(a, mine), model._mtx_arrays)
            # As Keras packs a batch (keras.utils.pack_x_y_sample_weight): x alone is handed
            # to the train step as itself, not as a tuple of one.
            return keras.utils.pack_x_y_sample_weight(*local), count, batch
        batch = _rows(data)
        start, end, count = _share(batch, n, r)
        return _take(data, start, end), count, batch

    def unchanged_metrics(count, step):
        """Runs step; a rank with no rows of this batch trained on one row weighted 0: its
        metrics (loss tracker included) must not count that row, they are put back after."""
        metric_vars = [v for m in model.metrics for v in m.variables]
        before = [tf.identity(v.value if hasattr(v, "value") else v) for v in metric_vars]
        logs = step()

        def restore():
            for v, b in zip(metric_vars, before):
                v.assign(b)
            return tf.constant(True)

        tf.cond(count > 0, lambda: tf.constant(False), restore)
        return logs

    def sharing(data, count, batch, step):
        """Runs step with hvd._step_state telling the Mean metrics this rank's share of the
        batch and whether the loss is summed over the rows (_weigh_batch_means)."""
        flat = [t for t in tf.nest.flatten(data) if t is not None]
        hvd._step_state.model = model
        hvd._step_state.row_share = tf.cast(count, tf.float32) / tf.cast(batch, tf.float32)
        hvd._step_state.static_batch = flat[0].shape[0] if flat and flat[0].shape.rank else None
        hvd._step_state.summed_loss = _loss_is_summed(model, keras)
        hvd._step_state.seed_rank = r
        try:
            return unchanged_metrics(count, step)
        finally:
            hvd._step_state.seed_rank = 0
            hvd._step_state.row_share = None
            hvd._step_state.model = None
            hvd._step_state.summed_loss = False

    def train_step(data):
        local, count, batch = local_batch(data)
        rows.assign_add(tf.cast(count, tf.float64))
        if _loss_is_summed(model, keras):
            # The batch's gradient is the sum of the ranks': n times their average (a rank
            # with no rows of this batch trained on one row weighted 0: none of its gradient).
            hvd._step_state.grad_scale = \
                tf.cast(count > 0, tf.float32) * tf.constant(float(n), tf.float32)
        else:
            # A mean over the rows: this rank's gradient weighted by its share of them.
            hvd._step_state.grad_scale = \
                tf.cast(count * n, tf.float32) / tf.cast(batch, tf.float32)
        hvd._step_state.row_weight = tf.cast(count > 0, tf.float32)
        try:
            return sharing(data, count, batch,
                           lambda: combining_state(count, batch, lambda: original_step(local)))
        finally:
            hvd._step_state.grad_scale = None
            hvd._step_state.row_weight = None

    def combining_state(count, batch, step):
        """step(), then combined_state over the non-trainable weights it assigned."""
        hvd._step_state.state_candidates = _own_state(model, keras)
        hvd._step_state.state_graph = \
            None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        hvd._step_state.state_before = {}
        try:
            return combined_state(step(), count, batch)
        finally:
            hvd._step_state.state_before = None
            hvd._step_state.state_candidates = None
            hvd._step_state.state_graph = None

    traced_states = [0]

    def combined_state(out, count, batch):
        """After a step (train, test or predict): the model's non-trainable weights that the
        step assigned (a moving statistic of a custom layer, kept as Keras keeps
        BatchNormalization's, a counter), each set to its value before the step plus the sum
        of the ranks' changes to it, the same on every rank, as tf.distribute combines a
        variable by its aggregation: "sum" the changes summed, "only_first_replica" rank 0's,
        any other ("none", "mean") weighted by each rank's share of the batch's rows, so that
        a change linear in the batch (a moving mean of its rows) is the 1-process run's and a
        change every rank made alike (a counter) is that change. In float64 (an integer
        weight's rounded back). Without it each rank would keep its own share's statistics:
        the ranks' models drift apart, evaluate and predict mix them, rank 0 saves its own."""
        assigned = list((hvd._step_state.state_before or {}).values())
        hvd._step_state.state_before = None  # (the assignments below are not the step's)
        if not assigned:
            return out
        # (A rank with no rows of this batch ran on one row weighted 0: none of its change.)
        rows = tf.cast(count > 0, tf.float64)
        weights = {"sum": rows, "only_first_replica": rows * (1.0 if r == 0 else 0.0)}
        share = tf.cast(count, tf.float64) / tf.cast(batch, tf.float64)
        changes = [tf.reshape((tf.cast(_variable_value(v), tf.float64) -
                               tf.cast(before, tf.float64)) *
                              weights.get(getattr(v, "aggregation", "none"), share), [-1])
                   for v, before in assigned]
        # One tensor, whatever the number of weights. Each traced step names its own
        # (steps_per_execution > 1 traces several into one graph); the ranks trace alike. An
        # eager step (run_eagerly) reuses one name: a new one per step would never be cached.
        k = traced_states[0]
        if not tf.executing_eagerly():
            traced_states[0] += 1
        summed = hvd.allreduce(tf.concat(changes, 0), op=hvd.Sum,
                               name="mtxcomm.transparent.state/%d" % k)
        sizes = [int(np.prod(before.shape)) for _, before in assigned]
        for (v, before), change in zip(assigned, tf.split(summed, sizes)):
            value = tf.cast(before, tf.float64) + tf.reshape(change, tf.shape(before))
            if before.dtype.is_integer:
                value = tf.round(value)
            v.assign(tf.cast(value, before.dtype))
        return out

    def test_step(data):
        batch = _rows(data)
        start, end, count = _share(batch, n, r)
        return sharing(data, count, batch, lambda: combining_state(
            count, batch, lambda: original_test(_take(data, start, end))))

    traced_predicts = [0]

    def predict_step(data):
        batch = _rows(data)
        start, end, count = _share(batch, n, r)
        out = combining_state(count, batch, lambda: original_predict(_take(data, start, end)))
        # Every rank gets the whole batch's outputs, in rank order: the input's order. Each
        # traced step names its allgathers apart (steps_per_execution > 1 traces several steps
        # into one graph, whose collectives are in flight together); the ranks trace alike.
        # Eagerly (run_eagerly) one name serves every step: a new one would never be cached.
        k = traced_predicts[0]
        if not tf.executing_eagerly():
            traced_predicts[0] += 1
        flat = tf.nest.flatten(out)
        gathered = [hvd.allgather(t[:count], name="mtxcomm.transparent.predict/%d/%d" % (k, i))
                    for i, t in enumerate(flat)]
        return tf.nest.pack_sequence_as(out, gathered)

    model.train_step = train_step
    model.test_step = test_step
    model.predict_step = predict_step
    def summed_results(logs):
        """Keras' _get_metrics_result_or_logs (the logs of fit's epoch and of evaluate) with
        every metric's result computed from the sum of the ranks' metric states: each rank's
        state covers its rows, their sum is the state of the whole data (tf.distribute's SUM
        aggregation of metric variables), so a ratio (AUC, precision, F1), a weighted metric
        or a mean is the 1-process value. Each rank's own state is put back afterwards (a
        train_on_batch with reset_metrics=False goes on accumulating its own rows). A collective:
        every rank calls it at the same points."""
        variables = [v for m in model.metrics for v in m.variables]
        own = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        own_results = tf.nest.map_structure(tf.identity, model.get_metrics_result())
        if variables:
            for v, t in zip(variables, _combined_states(variables, own, hvd, tf)):
                v.assign(t)
        try:
            # Read now: a result() may return a state variable itself, which is put back below.
            metric_logs = tf.nest.map_structure(tf.identity, model.get_metrics_result())
        finally:
            for v, t in zip(variables, own):
                v.assign(t)
        if not isinstance(logs, dict):
            object.__setattr__(model, "_mtx_logs_combined", False)
            return logs
        if set(logs) == set(metric_logs):  # Keras' own rule: the metrics' results
            object.__setattr__(model, "_mtx_logs_combined", True)
            return metric_logs
        # A custom train_step or test_step's logs: a value that is a metric's result on this
        # rank (its own tracker's) takes that metric's combined result; a value of its own (a
        # batch's loss) stays, and fit's epoch combines those (_RowWeightedLogs). Nested dicts
        # too: keras.io's custom steps return {m.name: m.result() for m in self.metrics}, where
        # the compiled metrics' result is a dict of theirs (Keras flattens it afterwards).
        left_own = []

        def combined(d):
            out = {}
            for k, v in d.items():
                if isinstance(v, dict):
                    out[k] = combined(v)
                elif k in metric_logs and _same_value(v, own_results.get(k)):
                    out[k] = metric_logs[k]
                else:
                    out[k] = v
                    left_own.append(k)
            return out

        out = combined(logs)
        object.__setattr__(model, "_mtx_logs_combined", not left_own)
        return out

    object.__setattr__(model, "_get_metrics_result_or_logs", summed_results)
    model._mtx_sharded = True
    model.train_function = None
    model.test_function = None
    model.predict_function = None


def _python_logs(logs):
    """Keras' pythonify_logs: nested dicts flattened, scalar values as Python floats."""
    from keras.src.utils.python_utils import pythonify_logs
    return pythonify_logs(logs)


def _same_value(a, b):
    """Whether two log values (tensors, arrays or numbers) are equal, element for element."""
    import numpy as np
    if a is None or b is None:
        return False
    try:
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
    except (TypeError, ValueError):
        return False


_warned_mixed_reductions = set()


def _loss_is_summed(model, keras):
    """Whether the compiled loss sums over the rows (every loss object given to compile has
    reduction "sum"): a rank's gradient and loss then cover its share's sum, not its mean.
    Losses of mixed reductions are taken as means, with one warning per model."""
    losses = [l for l in tf_module().nest.flatten(getattr(model, "loss", None)) if l is not None]
    if not losses:
        return False
    summed = [isinstance(l, keras.losses.Loss) and getattr(l, "reduction", None) == "sum"
              for l in losses]
    if all(summed):
        return True
    if any(summed) and id(model) not in _warned_mixed_reductions:
        _warned_mixed_reductions.add(id(model))
        import sys
        print("[mtxcomm rank %d] WARN transparent: the compiled losses mix reduction 'sum' with "
              "means; every rank's gradient is weighted as a mean over its rows, so the summed "
              "ones do not follow the 1-process run" % model._mtx_rank, file=sys.stderr,
              flush=True)
    return False


def _combined_states(variables, values, hvd, tf):
    """The ranks' metric states combined by each variable's aggregation, as tf.distribute
    combines a metric's variables: "sum" (Keras' default for metric variables) and anything
    unknown summed, "mean" averaged, "only_first_replica" rank 0's. One grouped allreduce per
    kind present; every rank calls it with the same metrics."""
    kinds = [getattr(v, "aggregation", "sum") for v in variables]
    out = list(values)
    groups = (("mean", hvd.Average, lambda t: t), ("only_first_replica", hvd.Sum,
              lambda t: t if hvd.rank() == 0 else tf.zeros_like(t)))
    for kind, op, mine in groups:
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if idx:
            reduced = hvd.grouped_allreduce([mine(values[i]) for i in idx], op=op,
                                            name="mtxcomm.transparent.metrics/" + kind)
            for i, t in zip(idx, reduced):
                out[i] = t
    idx = [i for i, k in enumerate(kinds) if k not in ("mean", "only_first_replica")]
    if idx:
        reduced = hvd.grouped_allreduce([values[i] for i in idx], op=hvd.Sum,
                                        name="mtxcomm.transparent.metrics")
        for i, t in zip(idx, reduced):
            out[i] = t
    return out


def _StartAsRank0(keras, hvd):
    """Last among fit's callbacks: once every callback's on_train_begin has run (a
    BackupAndRestore, kept on rank 0 only, restores the weights and the epoch to resume from
    there), every rank takes rank 0's variables, optimizer state and first epoch, so that all
    ranks run the same epochs from the same weights."""

    class StartAsRank0(hvd.callbacks.BroadcastGlobalVariablesCallback):
        def __init__(self):
            super().__init__(0)

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            first = hvd.broadcast_object(getattr(self.model, "_initial_epoch", None), 0,
                                         name="mtxcomm.transparent.initial_epoch")
            self.model._initial_epoch = first

    return StartAsRank0()


_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def _may_stop_mid_epoch(callbacks, keras, hvd):
    """Whether a callback on some rank could set stop_training in the middle of an epoch: it
    has a batch hook of its own (TerminateOnNaN, a LambdaCallback, a user's callback), and it
    is not one of Keras' callbacks that never stop (the progress bar, History, ModelCheckpoint,
    BackupAndRestore, TensorBoard) nor one of mtxcomm's. Agreed over the ranks (one small
    allreduce, every rank calls fit): the ranks' callbacks may differ."""
    base = keras.callbacks.Callback
    never = tuple(c for c in (getattr(keras.callbacks, name, None) for name in (
        "ProgbarLogger", "History", "ModelCheckpoint", "BackupAndRestore", "TensorBoard"))
        if c is not None)

    def own_hook(c, hook):
        # A method of its class, or a function set on the instance (a LambdaCallback's).
        f = getattr(c, hook, None)
        return getattr(f, "__func__", f) is not getattr(base, hook, None)

    # Exact types: a subclass of ModelCheckpoint with a batch hook of its own may stop.
    mine = any(
        type(c) not in never and not type(c).__module__.startswith("mtxcomm.")
        and any(own_hook(c, h) for h in _BATCH_HOOKS)
        for c in callbacks)
    agreed = hvd.allreduce([1.0 if mine else 0.0], op=hvd.Max,
                           name="mtxcomm.transparent.batch_stops")
    return bool(agreed.numpy()[0] > 0)


def _agree_to_stop(model, hvd, name):
    """One small allreduce: every rank stops when any rank's callbacks set stop_training."""
    stop = hvd.allreduce([1.0 if model.stop_training else 0.0], op=hvd.Max, name=name)
    model.stop_training = bool(stop.numpy()[0] > 0)


def _EpochEndTogether(keras, hvd, writes):
    """Last among fit's callbacks, at the end of each epoch: one small allreduce in which the
    ranks agree to stop when any rank's callbacks set stop_training there (a wall-clock budget
    that runs out on one rank first: the ranks would otherwise run different epochs and stall
    in the next one's first allreduce). It also makes every rank wait for rank 0 there, after
    its file-writing callbacks (ModelCheckpoint, BackupAndRestore, CSVLogger, TensorBoard, kept
    on rank 0 only); with such a callback (writes) fit's end waits for rank 0 too. So a file
    rank 0 wrote (under a temporary name, then renamed) is complete when any rank goes on to
    read it (a script that loads its checkpoint after fit)."""

    class EpochEndTogether(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            _agree_to_stop(self.model, hvd, "mtxcomm.transparent.epoch_end")

        def on_train_end(self, logs=None):
            if writes:
                hvd.allreduce([0.0], name="mtxcomm.transparent.files")

    return EpochEndTogether()


def _BatchEndTogether(keras, hvd):
    """Last among fit's callbacks when a callback could stop training in the middle of an epoch
    (_may_stop_mid_epoch): after every batch the ranks agree to stop when any rank's callbacks
    set stop_training. A TerminateOnNaN that sees a NaN in one rank's share of the batch
    (per-batch logs are each rank's own) then stops every rank after that batch, as the
    1-process run stops; the other ranks would wait in the next batch's allreduce until
    MTXCOMM_STALL_TIMEOUT. One small eager allreduce per batch, only then: without such a
    callback no callback of fit has a batch-end hook, and Keras dispatches the batch hooks
    without waiting for the step's logs."""

    class BatchEndTogether(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            _agree_to_stop(self.model, hvd, "mtxcomm.transparent.batch_end")

    return BatchEndTogether()


def _RowWeightedLogs(rows, keras, hvd):
    """The epoch's training logs of all ranks combined as the 1-process run would report them:
    each rank's values (means over its rows) weighted by the rows it trained on. Validation
    values (val_*) are computed on the whole data by every rank and are left as they are."""
    import numpy as np
    import tensorflow as tf

    class RowWeightedLogs(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            rows.assign(0.0)

        def on_epoch_end(self, epoch, logs=None):
            if not logs or getattr(self.model, "_mtx_logs_combined", False):
                return
            keys = sorted(k for k, v in logs.items()
                          if not k.startswith("val_") and (np.isscalar(v) or np.ndim(v) == 0))
            weight = float(rows.numpy())
            values = [float(logs[k]) * weight for k in keys] + [weight]
            total = hvd.allreduce(tf.constant(values, dtype=tf.float64), op=hvd.Sum,
                                  name="mtxcomm.transparent.logs").numpy()
            if total[-1] > 0:
                for k, v in zip(keys, total[:-1]):
                    logs[k] = float(v / total[-1])

    return RowWeightedLogs()


def _SameWeights(keras, hvd):
    """After epochs 1, 2, 4, 8, ..., checks that every rank holds the same weights, trainable
    and not (a sum and a sum of squares per variable, their maximum and minimum over the ranks):
    the optimizer applies the same averaged gradients on every rank and the train step's
    assignments to non-trainable weights are combined (combined_state), so they can differ only
    when the model changes its weights some other way (a train_step that assigns trainable
    weights itself). Then
    every rank raises, naming the first variable that differs, instead of training ranks that
    have drifted apart and predicting with a mix of them. Variables registered as local
    (register_local_var) are not compared."""
    import numpy as np
    import tensorflow as tf

    class SameWeights(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if (epoch + 1) & epoch:
                return  # after epochs 1, 2, 4, 8, ...: a cost that does not grow with the epochs
            variables = list(self.model.trainable_variables)
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None and getattr(optimizer, "_mtx_local", None):
                local = hvd._local_vars_flags(optimizer, variables)
                variables = [v for v, is_local in zip(variables, local) if not is_local]
            # The non-trainable weights too (moving statistics, frozen layers): the train step
            # combines what it assigns to them (combined_state), and nothing else changes them.
            variables += [v for v in self.model.non_trainable_weights if _is_numeric(v)]
            if not variables:
                return
            sums = []
            for v in variables:  # (NumPy: an eager op per variable costs far more)
                x = np.asarray(v, dtype=np.float64)
                sums += [x.sum(), (x * x).sum()]
            mine = tf.constant(sums, tf.float64)
            # One allreduce: the maximum of the values and of their negations (the minimum).
            both = hvd.allreduce(tf.concat([mine, -mine], 0), op=hvd.Max,
                                 name="mtxcomm.transparent.same_weights").numpy()
            high, low = both[:len(sums)], -both[len(sums):]
            same = (high == low) | (np.isnan(high) & np.isnan(low))
            if same.all():
                return
            first = variables[int(np.argmin(same)) // 2]
            raise RuntimeError(
                "mtxrun --transparent: after epoch %d the ranks hold different values of %s "
                "(and maybe others): the model changed its weights other than through the "
                "optimizer it was compiled with, whose gradients mtxcomm averages over the "
                "ranks, or than through Variable.assign in the train step (whose changes to "
                "non-trainable weights mtxcomm combines over the ranks): a train_step that "
                "assigns trainable weights itself, one that applies gradients with an "
                "optimizer that is neither the compiled one nor an attribute of the model, or "
                "a TensorFlow op writing a weight directly. Average such gradients in the "
                "train_step with mtxcomm.tensorflow.allreduce, or wrap that optimizer in "
                "mtxcomm.tensorflow.keras.DistributedOptimizer (mtxcomm wraps those the model "
                "or a sub-model holds: an attribute, a list or dict of them, a compiled one)." %
                (epoch + 1, getattr(first, "path", None) or first.name))

    return SameWeights()
