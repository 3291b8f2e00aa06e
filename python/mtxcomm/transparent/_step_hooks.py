"""Keras methods replaced once, when ``keras`` is imported, that behave differently only inside
a transparent step (train, test or predict: they read ``hvd._step_state``, which the steps of
``_data_parallel`` set) and are unchanged outside one:

- ``keras.metrics.Mean.update_state``: a value per batch weighted by this rank's share of the
  rows (:func:`_weigh_batch_means`);
- ``keras.Model._aggregate_additional_loss``: with a loss summed over the rows, the additional
  losses weighted by the share (:func:`_share_additional_losses`);
- ``keras.Variable.assign``: the first assignment to each of the model's own non-trainable
  weights recorded, for the step to combine over the ranks (:func:`_record_state_assignments`);
- ``keras.random.SeedGenerator.next``: this rank folded into the seed of every draw
  (:func:`_draw_apart`);
- ``keras.layers.BatchNormalization._moments``: the global batch's statistics
  (:func:`_synchronise_batch_norm`)."""

from ._tf import tf_module
from ._variables import _value_in


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
            per_output or self is getattr(model, "_loss_tracker", None)
        ):
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


def _record_state_assignments(keras, hvd):
    """In a transparent train, test or predict step, the first assignment to each of the
    model's own non-trainable weights (_own_state) records the weight and its value before
    it, for _DataParallelSteps.combined_state; other assignments (the optimizer's, the
    metrics') are left alone."""
    variable_cls = getattr(keras, "Variable", None)
    original = getattr(variable_cls, "assign", None)
    if original is None or getattr(original, "_mtx_recorded", False):
        return

    def assign(self, value):
        before = getattr(hvd._step_state, "state_before", None)
        if (
            before is not None
            and id(self) not in before
            and id(self) in (hvd._step_state.state_candidates or ())
        ):
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
        return global_moments(
            self,
            inputs,
            mask,
            row_weight=weight,
            grad_scale=getattr(hvd._step_state, "grad_scale", None),
        )

    _moments._mtx_global = True
    layer_cls._moments = _moments
