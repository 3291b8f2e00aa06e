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
- ``keras.Model.evaluate`` / ``predict``: ``verbose=0`` on ranks other than 0 (each rank
  evaluates the whole data: the results are the same everywhere);
- ``keras.Model.save``, ``save_weights`` and ``keras.saving.save_model``: write on rank 0 only.

Limits: only Keras 3 ``Model.fit`` training is made distributed (a custom training loop with
``tf.GradientTape`` needs ``mtxcomm.tensorflow`` explicitly); every rank reads the whole input
pipeline (data loading is replicated, compute is split); the batch size stays the global batch;
SparseTensor inputs are not split.
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

    mtx.init()
    # One seed for every rank, drawn on rank 0: identical shuffling and initialisation.
    seed = int(np.random.SeedSequence().generate_state(1)[0] % (2 ** 31))
    seed = mtx.broadcast_object(seed, 0, name="mtxcomm.transparent.seed")
    keras.utils.set_random_seed(seed)

    rank = mtx.rank()
    model_cls = keras.Model
    quiet_callbacks = tuple(c for c in (
        getattr(keras.callbacks, "ModelCheckpoint", None),
        getattr(keras.callbacks, "BackupAndRestore", None),
        getattr(keras.callbacks, "TensorBoard", None),
        getattr(keras.callbacks, "CSVLogger", None)) if c is not None)

    original_fit = model_cls.fit
    fit_signature = inspect.signature(original_fit)

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        bound = fit_signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        _make_data_parallel(self, keras, hvd)
        user_callbacks = list(arguments.get("callbacks") or [])
        if rank != 0:
            user_callbacks = [c for c in user_callbacks if not isinstance(c, quiet_callbacks)]
            arguments["verbose"] = 0
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     _RowWeightedLogs(self._mtx_rows, keras, hvd)
                     if hasattr(self, "_mtx_rows") else hvd.callbacks.MetricAverageCallback()]
        callbacks = callbacks + user_callbacks
        arguments["callbacks"] = callbacks
        return original_fit(*bound.args, **bound.kwargs)

    model_cls.fit = fit

    for name in ("evaluate", "predict"):
        original = getattr(model_cls, name)
        sig = inspect.signature(original)

        def quiet(original=original, sig=sig):
            @functools.wraps(original)
            def method(self, *args, **kwargs):
                bound = sig.bind(self, *args, **kwargs)
                if rank != 0:
                    bound.arguments["verbose"] = 0
                return original(*bound.args, **bound.kwargs)
            return method

        setattr(model_cls, name, quiet())

    if rank != 0:
        def skip(*args, **kwargs):
            return None
        model_cls.save = skip
        model_cls.save_weights = skip
        keras.saving.save_model = skip
        keras.models.save_model = skip


def _make_data_parallel(model, keras, hvd):
    import tensorflow as tf

    if model.optimizer is None:
        return  # Keras raises its own error: the model is not compiled
    hvd.DistributedOptimizer(model.optimizer)
    if getattr(model, "_mtx_sharded", False):
        return
    if getattr(model, "jit_compile", False):
        model.jit_compile = False
    original_step = model.train_step
    n, r = hvd.size(), hvd.rank()
    # Rows this rank trained on in the epoch: the weight of its logs (its share of each batch
    # can be uneven). A plain attribute, not a Keras-tracked variable: never saved with the model.
    rows = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    object.__setattr__(model, "_mtx_rows", rows)

    def train_step(data):
        flat = tf.nest.flatten(data)
        first = next(t for t in flat if t is not None)
        batch = tf.shape(first, out_type=tf.int64)[0]
        start = batch * r // n
        end = batch * (r + 1) // n
        count = end - start
        # A share of no rows (a last batch smaller than the ranks): one row, weighted 0.
        start = tf.where(count > 0, start, tf.zeros_like(start))
        end = tf.where(count > 0, end, tf.ones_like(end))

        def take(t):
            if t is None:
                return None
            if isinstance(t, tf.SparseTensor):
                raise ValueError("mtxrun --transparent cannot split SparseTensor inputs")
            return t[start:end]

        local = tf.nest.pack_sequence_as(data, [take(t) for t in flat])
        rows.assign_add(tf.cast(count, tf.float64))
        hvd._step_state.grad_scale = tf.cast(count * n, tf.float32) / tf.cast(batch, tf.float32)
        # A rank with no rows of this batch trains on one row weighted 0; its metrics (loss
        # tracker included) must not count that row: they are put back after the step.
        metric_vars = [v for m in model.metrics for v in m.variables]
        before = [tf.identity(v.value if hasattr(v, "value") else v) for v in metric_vars]
        try:
            logs = original_step(local)
        finally:
            hvd._step_state.grad_scale = None

        def restore():
            for v, b in zip(metric_vars, before):
                v.assign(b)
            return tf.constant(True)

        tf.cond(count > 0, lambda: tf.constant(False), restore)
        return logs

    model.train_step = train_step
    model._mtx_sharded = True
    model.train_function = None


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
            if not logs:
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
