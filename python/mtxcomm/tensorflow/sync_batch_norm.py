"""Synchronised batch normalisation for Keras 3 (Horovod's SyncBatchNormalization)."""

import keras
import tensorflow as tf
from keras import ops

from mtxcomm.tensorflow._ops import Sum, allreduce


def _sum_over_ranks(t, grad_scale):
    """allreduce(t, Sum). Its gradient (the upstream gradients of every rank, summed) assumes
    every rank's loss counts alike; grad_scale (this rank's factor on its gradients, for an
    uneven share of the global batch) weighs rank q's upstream gradient by its factor s_q and
    divides by this rank's own (which its gradients are multiplied by afterwards):
    sum_q s_q g_q / s_r, 0 where s_r = 0 (a rank with no rows, whose rows weigh nothing)."""
    if grad_scale is None:
        return allreduce(t, op=Sum)

    @tf.custom_gradient
    def weighted(x):
        def grad(g):
            scale = tf.cast(grad_scale, g.dtype)
            return tf.math.divide_no_nan(allreduce(g * scale, op=Sum), scale)

        return allreduce(x, op=Sum), grad

    return weighted(t)


def global_moments(layer, inputs, mask, row_weight=None, grad_scale=None):
    """(mean, variance) per channel of the global batch (every rank's rows of this step) for the
    BatchNormalization layer: the per-channel sums and counts are allreduced, then the sums of
    squared deviations from the global mean; biased variance, as BatchNormalization's own.
    mask: the layer's mask (None: every row counts); row_weight: a 0/1 scalar multiplying this
    rank's rows (0: the rank holds a stand-in row of an empty share, which must not count);
    grad_scale: this rank's gradient factor (_sum_over_ranks). Two allreduces per call, inside
    the step; the gradient flows through both."""
    axes = layer._reduction_axes
    if mask is None:
        weights = ops.ones_like(inputs)
    else:
        weights = ops.cast(
            ops.broadcast_to(ops.expand_dims(mask, -1), ops.shape(inputs)), inputs.dtype
        )
    if row_weight is not None:
        weights = weights * ops.cast(row_weight, inputs.dtype)
    local_sum = ops.sum(inputs * weights, axes)
    local_count = ops.sum(weights, axes)
    total = _sum_over_ranks(tf.stack([local_sum, local_count]), grad_scale)
    count = ops.maximum(total[1], 1.0)
    mean = total[0] / count
    broadcast_mean = mean
    for a in sorted(axes):
        broadcast_mean = ops.expand_dims(broadcast_mean, a)
    centred = (inputs - broadcast_mean) * weights
    squares = _sum_over_ranks(ops.sum(ops.square(centred), axes), grad_scale)
    return mean, squares / count


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose batch statistics, in training, are those of the global batch
    (every rank's examples): global_moments above. Inference uses the moving statistics, as
    BatchNormalization does. Horovod's ``fused`` argument is accepted and ignored (Keras 3 has
    no fused kernel). Every rank must call the layer the same number of times per step."""

    def __init__(self, *args, fused=None, **kwargs):
        super().__init__(*args, **kwargs)

    def _moments(self, inputs, mask):
        return global_moments(self, inputs, mask)
