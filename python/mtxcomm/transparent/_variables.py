"""Reading a model's weights: its layers (:func:`_layers`), a Keras variable's own dtype and
value (not the autocast ones), whether it holds numbers, its value as read in the step's graph,
and which non-trainable weights a step's assignments are combined over the ranks for
(:func:`_own_state`)."""

from ._tf import tf_module


def _layers(model):
    """The model and every layer inside it (Keras' own walk; the model alone where a Keras
    without it)."""
    try:
        return list(model._flatten_layers(include_self=True))
    except Exception:
        return [model]


def _own_state(model, keras):
    """ids of the model's numeric non-trainable weights whose assignments in a step are
    combined over the ranks (_DataParallelSteps.combined_state): all but
    BatchNormalization's moving statistics, which the layer already computes from the global
    batch (_synchronise_batch_norm). Metric and random-seed state are not weights."""
    bn_cls = getattr(keras.layers, "BatchNormalization", None)
    synchronised = {
        id(v)
        for layer in _layers(model)
        if bn_cls is not None and isinstance(layer, bn_cls)
        for v in layer.non_trainable_weights
    }
    return {
        id(v) for v in model.non_trainable_weights if id(v) not in synchronised and _is_numeric(v)
    }


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
