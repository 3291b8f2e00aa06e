"""``keras.Model.fit`` made data-parallel (:func:`_wrap_fit`): the ranks' data compared
(``_checks``), the model's optimizers and steps made data-parallel (``_data_parallel``), fit's own
callbacks around the script's (``_callbacks``; on ranks other than 0 ``verbose`` is 0 and the
callbacks that write files are dropped), the input sharded (``_input``), and, when training
first starts, the garbage collector frozen (:func:`_freeze_garbage_collector`)."""

import functools
import inspect

from ._callbacks import (
    _BatchEndTogether,
    _EpochEndTogether,
    _may_stop_mid_epoch,
    _RowWeightedLogs,
    _SameWeights,
    _StartAsRank0,
)
from ._checks import _same_data_everywhere, _stall_hint
from ._data_parallel import _make_data_parallel
from ._input import _shard_input
from ._save import _rank_0_only
from ._tf import tf_module


def _wrap_fit(model_cls, keras, mtx, hvd, rank):
    """Replaces model_cls.fit by the data-parallel fit (see the module docstring)."""
    from mtxcomm.tensorflow import _keras_iterators as iterators

    quiet_callbacks = tuple(
        c
        for c in (
            getattr(keras.callbacks, "ModelCheckpoint", None),
            getattr(keras.callbacks, "BackupAndRestore", None),
            getattr(keras.callbacks, "TensorBoard", None),
            getattr(keras.callbacks, "CSVLogger", None),
        )
        if c is not None
    )

    original_fit = model_cls.fit
    fit_signature = inspect.signature(original_fit)

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        bound = fit_signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        _same_data_everywhere("fit", arguments, ("x", "y", "sample_weight", "validation_data"), mtx)
        _make_data_parallel(self, keras, hvd)
        user_callbacks = list(arguments.get("callbacks") or [])
        writes = any(isinstance(c, quiet_callbacks) for c in user_callbacks)
        if rank != 0:
            user_callbacks = [c for c in user_callbacks if not isinstance(c, quiet_callbacks)]
            arguments["verbose"] = 0
        # Ours first where they combine the epoch's logs (the user's callbacks then read the
        # combined ones); the start-of-training broadcast last, after every user callback's
        # on_train_begin (a BackupAndRestore restores weights and the epoch on rank 0 there).
        callbacks = [
            _RowWeightedLogs(self._mtx_rows, keras, hvd)
            if hasattr(self, "_mtx_rows")
            else hvd.callbacks.MetricAverageCallback(),
            _SameWeights(keras, hvd),
        ]
        callbacks = (
            callbacks
            + user_callbacks
            + [_StartAsRank0(keras, hvd), _EpochEndTogether(keras, hvd, writes)]
        )
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
