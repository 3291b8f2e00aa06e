"""Synchronised batch normalisation for Keras 3 (Horovod's SyncBatchNormalization)."""

import keras
import tensorflow as tf
from keras import ops

from mtxcomm import tensorflow as _mtx


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose batch statistics, in training, are those of the global batch
    (every rank's examples): the per-channel sums and counts are allreduced, then the sums of
    squared deviations from the global mean (two collectives per call, inside the step; the
    gradient flows through both). Inference uses the moving statistics, as BatchNormalization
    does. Horovod's ``fused`` argument is accepted and ignored (Keras 3 has no fused kernel).
    Every rank must call the layer the same number of times per step."""

    def __init__(self, *args, fused=None, **kwargs):
        super().__init__(*args, **kwargs)

    def _moments(self, inputs, mask):
        axes = self._reduction_axes
        if mask is None:
            weights = ops.ones_like(inputs)
        else:
            weights = ops.cast(ops.broadcast_to(ops.expand_dims(mask, -1), ops.shape(inputs)),
                               inputs.dtype)
        local_sum = ops.sum(inputs * weights, axes)
        local_count = ops.sum(weights, axes)
        total = _mtx.allreduce(tf.stack([local_sum, local_count]), op=_mtx.Sum)
        count = ops.maximum(total[1], 1.0)
        mean = total[0] / count
        broadcast_mean = mean
        for a in sorted(axes):
            broadcast_mean = ops.expand_dims(broadcast_mean, a)
        centred = (inputs - broadcast_mean) * weights
        squares = _mtx.allreduce(ops.sum(ops.square(centred), axes), op=_mtx.Sum)
        return mean, squares / count
