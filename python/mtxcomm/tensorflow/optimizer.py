"""mtxcomm.tensorflow's gradient averaging for training: DistributedGradientTape,
PartialDistributedGradientTape, DistributedOptimizer (a TensorFlow 1 optimizer here, a Keras 3
one through ``mtxcomm.tensorflow.keras``) and ``_allreduce_gradients``, which they and the Keras
optimizer share (one grouped allreduce eagerly, one overlapping allreduce per gradient in a
graph; None passes through, IndexedSlices are allgathered, worker-local gradients are not
reduced).
"""

import tensorflow as tf

from mtxcomm.tensorflow._gradients import (  # noqa: F401  (re-exported for the tapes' users)
    _allreduce_gradients,
    _check_optimizer_options,
    _local_flags,
    _source_keys,
)
from mtxcomm.tensorflow._ops import Average, _resolve_op
from mtxcomm.tensorflow.compression import Compression


class _DistributedGradientTape:
    """Methods mixed into a copy of the user's GradientTape."""

    def _mtx_split(self, target, sources, output_gradients=None, **kwargs):
        """(flat sources, flat reduced gradients, is-local flags, structure of the grads)."""
        grads = super(self._mtx_base, self).gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads)
        local = _local_flags(flat_sources, self._mtx_local)
        if len(local) != len(flat):
            local = [False] * len(flat)
        out = _allreduce_gradients(
            flat,
            op=self._mtx_op,
            sparse_as_dense=self._mtx_sparse_as_dense,
            compression=self._mtx_compression,
            local=local,
        )
        return flat_sources, out, local, grads

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        _, out, _, grads = self._mtx_split(target, sources, output_gradients, **kwargs)
        return tf.nest.pack_sequence_as(grads, out)

    def register_local_source(self, source):
        """The gradient of source is not reduced over ranks (a variable each rank has its own
        copy of, as in model parallelism); with op=Average it is divided by size()."""
        self._mtx_local |= _source_keys(source)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, **kwargs):
        """([(source, gradient)] of the local sources, [(source, gradient)] of the others),
        gradients as gradient() returns them."""
        flat_sources, out, local, _ = self._mtx_split(target, sources, output_gradients, **kwargs)
        pairs = list(zip(flat_sources, out))
        return (
            [p for p, is_local in zip(pairs, local) if is_local],
            [p for p, is_local in zip(pairs, local) if not is_local],
        )


def DistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=None,
    local_sources=None,
):
    """Returns a tape whose gradient() averages (op) the gradients over ranks: one grouped
    allreduce per call; None gradients pass through; IndexedSlices are allgathered, or
    densified first with sparse_as_dense=True. Sources given in local_sources, or later to
    tape.register_local_source(), keep their own gradient (divided by size() for Average)."""
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError(
            "DistributedGradientTape: gradient_predivide_factor is not "
            "supported; use allreduce's prescale_factor/postscale_factor"
        )
    if process_set is not None or groups is not None:
        raise NotImplementedError(
            "DistributedGradientTape: process sets and groups are not "
            "supported (all gradients go in one group)"
        )
    base = type(gradtape)
    methods = {
        k: getattr(_DistributedGradientTape, k)
        for k in (
            "_mtx_split",
            "gradient",
            "register_local_source",
            "get_local_and_global_gradients",
        )
    }
    cls = type(base.__name__, (base,), dict(methods, _mtx_base=None))
    cls._mtx_base = cls
    tape = base.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._mtx_op = _resolve_op(op, None, "DistributedGradientTape")
    tape._mtx_sparse_as_dense = sparse_as_dense
    tape._mtx_compression = compression
    tape._mtx_local = set()
    for v in local_sources or ():
        tape.register_local_source(v)
    return tape


def PartialDistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=None,
    local_layers=None,
):
    """DistributedGradientTape whose local sources are the trainable weights of local_layers
    (a Keras layer or a list of them)."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    local = [w for layer in local_layers for w in layer.trainable_weights]
    return DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        local_sources=local,
    )


class _LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer) whose compute_gradients averages
    the gradients over ranks."""

    def __init__(self, optimizer, name, use_locking, op, compression, sparse_as_dense):
        self._optimizer = optimizer
        self._mtx_op = op
        self._mtx_compression = compression
        self._mtx_sparse_as_dense = sparse_as_dense
        super().__init__(
            name=name or "Distributed" + type(optimizer).__name__, use_locking=use_locking
        )

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = _allreduce_gradients(
            [g for g, _ in pairs],
            op=self._mtx_op,
            sparse_as_dense=self._mtx_sparse_as_dense,
            compression=self._mtx_compression,
        )
        return list(zip(grads, [v for _, v in pairs]))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=None,
):
    """An optimizer that averages (op) the gradients over ranks before applying them.

    A Keras 3 optimizer goes to mtxcomm.tensorflow.keras.DistributedOptimizer (every option);
    a TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer) is wrapped: its compute_gradients
    returns the averaged gradients (backward_passes_per_step must be 1 there)."""
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        # Loaded on first use, so that a TensorFlow-only script does not import Keras' part.
        from mtxcomm.tensorflow import _keras_optimizer

        return _keras_optimizer.DistributedOptimizer(
            optimizer,
            name=name,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients
            or backward_passes_per_step == 1,
            num_groups=num_groups,
            groups=groups,
            process_set=process_set,
        )
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(
            "DistributedOptimizer expects a Keras 3 optimizer or a "
            "tf.compat.v1.train.Optimizer, got %r" % type(optimizer).__name__
        )
    _check_optimizer_options(process_set, groups, num_groups, gradient_predivide_factor)
    if backward_passes_per_step != 1:
        raise NotImplementedError(
            "DistributedOptimizer: backward_passes_per_step > 1 is "
            "provided for Keras 3 optimizers only"
        )
    return _LegacyDistributedOptimizer(
        optimizer,
        name,
        use_locking,
        _resolve_op(op, None, "DistributedOptimizer"),
        compression,
        sparse_as_dense,
    )
