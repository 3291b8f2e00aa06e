"""Keras 3 callbacks of the Horovod API: broadcast at start, metric averaging, learning-rate
warmup and schedule."""

import keras
import numpy as np
import tensorflow as tf

from mtxcomm.tensorflow._ops import Average, allreduce
from mtxcomm.tensorflow.basics import rank, size
from mtxcomm.tensorflow.functions import broadcast_variables
from mtxcomm.tensorflow.optimizer import _local_flags, _source_keys


def _optimizer_variables(model):
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return []
    if not opt.built and model.trainable_variables:
        opt.build(model.trainable_variables)
    return list(opt.variables)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, sets every rank's model variables and optimizer state to
    root_rank's, so that all replicas start identical (random initialisation differs between
    ranks). Put it first in the callbacks list."""

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__()
        self.root_rank = int(root_rank)
        self.broadcast_done = False
        self._local = set()
        for v in local_variables or ():
            self.register_local_var(v)

    def register_local_var(self, var):
        """var keeps each rank's own value (it is not broadcast)."""
        self._local |= _source_keys(var)

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        variables = list(self.model.variables) + _optimizer_variables(self.model)
        local = _local_flags(variables, self._local)
        broadcast_variables(
            [v for v, is_local in zip(variables, local) if not is_local], self.root_rank
        )
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replaces every numeric value in ``logs`` by its average over
    the ranks (each rank measured only its own data). Put it before callbacks that read the
    logs (ReduceLROnPlateau, ModelCheckpoint, CSVLogger)."""

    def __init__(self, device=""):
        super().__init__()

    def _average(self, logs):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.isscalar(v) or np.ndim(v) == 0)
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        averaged = allreduce(values, op=Average, name="mtxcomm.metric_average")
        for k, v in zip(keys, averaged.numpy()):
            logs[k] = float(v)

    def on_epoch_end(self, epoch, logs=None):
        self._average(logs)


class _LearningRateCallback(keras.callbacks.Callback):
    def _set_lr(self, lr):
        opt = self.model.optimizer
        if isinstance(
            opt.learning_rate, keras.optimizers.schedules.LearningRateSchedule
        ) or callable(getattr(opt, "_learning_rate", None)):
            raise ValueError(
                "%s: the optimizer's learning rate is a schedule; it needs a "
                "number" % type(self).__name__
            )
        opt.learning_rate = lr


class LearningRateScheduleCallback(_LearningRateCallback):
    """Sets the learning rate to initial_lr * multiplier(epoch) for start_epoch <= epoch <
    end_epoch (end_epoch None: to the end); multiplier is a number or a function of the epoch.
    staircase=True: set at the start of each epoch with the integer epoch; False: before each
    batch with the fractional epoch (steps_per_epoch defaults to the one fit() reports).
    Outside the range the rate is left as it is. The optimizer's learning rate must be a number
    or variable, not a schedule."""

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
        verbose=0,
    ):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") or 1

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set_lr(self.initial_lr * self.multiplier(epoch))

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        e = self.current_epoch + float(batch) / self.steps_per_epoch
        self._set_lr(self.initial_lr * self.multiplier(e))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(_LearningRateCallback):
    """Ramps the learning rate from initial_lr / size() to initial_lr over the first
    warmup_epochs epochs, batch by batch (Goyal et al., "Accurate, Large Minibatch SGD:
    Training ImageNet in 1 Hour", 2017): lr(e) = initial_lr / size * (e * (size - 1) /
    warmup_epochs + 1), e the fractional epoch reached at the end of the batch. Afterwards the
    rate is left at initial_lr.
    steps_per_epoch defaults to the one fit() reports. The optimizer's learning rate must be a
    number or variable, not a schedule."""

    def __init__(
        self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0
    ):
        super().__init__()
        if warmup_epochs <= 0:
            raise ValueError("warmup_epochs must be > 0, got %r" % warmup_epochs)
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def multiplier(self, epoch):
        n = size()
        return 1.0 / n * (epoch * (n - 1) / self.warmup_epochs + 1)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") or 1

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch >= self.warmup_epochs:
            return
        # As Horovod: batch b of epoch e uses the rate reached at the end of that batch.
        e = self.current_epoch + float(batch + 1) / self.steps_per_epoch
        self._set_lr(self.initial_lr * self.multiplier(min(e, self.warmup_epochs)))

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == int(np.ceil(self.warmup_epochs)):
            self._set_lr(self.initial_lr)
            if self.verbose and rank() == 0:
                print(
                    "\nEpoch %d: finished gradual learning rate warmup to %g."
                    % (epoch + 1, self.initial_lr)
                )
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))
