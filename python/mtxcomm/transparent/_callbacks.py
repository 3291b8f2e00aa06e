"""The callbacks fit adds around the script's own: the epoch's training logs weighted by the rows
each rank trained on (:func:`_RowWeightedLogs`), a check that every rank holds the same weights
(:func:`_SameWeights`), the start from rank 0's weights, optimizer state and epoch
(:func:`_StartAsRank0`), and the ranks agreeing to stop together at the end of an epoch
(:func:`_EpochEndTogether`) and, where a callback could stop mid-epoch, of a batch
(:func:`_BatchEndTogether`, :func:`_may_stop_mid_epoch`)."""

from ._variables import _is_numeric


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
            first = hvd.broadcast_object(
                getattr(self.model, "_initial_epoch", None),
                0,
                name="mtxcomm.transparent.initial_epoch",
            )
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
    never = tuple(
        c
        for c in (
            getattr(keras.callbacks, name, None)
            for name in (
                "ProgbarLogger",
                "History",
                "ModelCheckpoint",
                "BackupAndRestore",
                "TensorBoard",
            )
        )
        if c is not None
    )

    def own_hook(c, hook):
        # A method of its class, or a function set on the instance (a LambdaCallback's).
        f = getattr(c, hook, None)
        return getattr(f, "__func__", f) is not getattr(base, hook, None)

    # Exact types: a subclass of ModelCheckpoint with a batch hook of its own may stop.
    mine = any(
        type(c) not in never
        and not type(c).__module__.startswith("mtxcomm.")
        and any(own_hook(c, h) for h in _BATCH_HOOKS)
        for c in callbacks
    )
    agreed = hvd.allreduce(
        [1.0 if mine else 0.0], op=hvd.Max, name="mtxcomm.transparent.batch_stops"
    )
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
            keys = sorted(
                k
                for k, v in logs.items()
                if not k.startswith("val_") and (np.isscalar(v) or np.ndim(v) == 0)
            )
            weight = float(rows.numpy())
            values = [float(logs[k]) * weight for k in keys] + [weight]
            total = hvd.allreduce(
                tf.constant(values, dtype=tf.float64), op=hvd.Sum, name="mtxcomm.transparent.logs"
            ).numpy()
            if total[-1] > 0:
                for k, v in zip(keys, total[:-1]):
                    logs[k] = float(v / total[-1])

    return RowWeightedLogs()


def _SameWeights(keras, hvd):
    """After epochs 1, 2, 4, 8, ..., checks that every rank holds the same weights, trainable
    and not (a sum and a sum of squares per variable, their maximum and minimum over the ranks):
    the optimizer applies the same averaged gradients on every rank and the train step's
    assignments to non-trainable weights are combined (_DataParallelSteps.combined_state), so
    they can differ only when the model changes its weights some other way (a train_step that
    assigns trainable weights itself). Then every rank raises, naming the first variable that
    differs, instead of training ranks that have drifted apart and predicting with a mix of
    them. Variables registered as local (register_local_var) are not compared."""
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
            both = hvd.allreduce(
                tf.concat([mine, -mine], 0), op=hvd.Max, name="mtxcomm.transparent.same_weights"
            ).numpy()
            high, low = both[: len(sums)], -both[len(sums) :]
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
                "or a sub-model holds: an attribute, a list or dict of them, a compiled one)."
                % (epoch + 1, getattr(first, "path", None) or first.name)
            )

    return SameWeights()
