"""The Keras 3 optimizer of mtxcomm.tensorflow.keras (``DistributedOptimizer``,
``PartialDistributedOptimizer``): the wrapped optimizer averages the gradients over ranks (one
allreduce per gradient, overlapping the backward pass in a graph) before applying them, with
Horovod's options (compression, backward_passes_per_step, local variables). Below both
``mtxcomm.tensorflow.optimizer`` (whose DistributedOptimizer hands Keras 3 optimizers here) and
the keras package, which re-exports it.
"""

import functools
import threading
import warnings

import tensorflow as tf

from mtxcomm.tensorflow import _keras_iterators as _iterators
from mtxcomm.tensorflow._gradients import (
    _allreduce_gradients,
    _check_optimizer_options,
    _local_flags,
    _source_keys,
)
from mtxcomm.tensorflow._ops import Average, _resolve_op
from mtxcomm.tensorflow.compression import Compression

# Transparent mode sets, while a train step is traced, the factor each rank's gradients are
# multiplied by before averaging (its share of an uneven global batch).
_step_state = threading.local()


def _current_grad_scale():
    return getattr(_step_state, "grad_scale", None)


def _distributed_apply(self, grads, trainable_variables=None):
    cls = self._mtx_dist_class
    grads = list(grads)
    if getattr(_step_state, "averaged", False):  # a LossScaleOptimizer around us averaged them
        if self._mtx_passes > 1:
            raise NotImplementedError(
                "backward_passes_per_step > 1 inside a LossScaleOptimizer: wrap the "
                "LossScaleOptimizer instead, DistributedOptimizer(LossScaleOptimizer(opt), ...)"
            )
        return super(cls, self).apply(grads, trainable_variables)
    if self._mtx_passes == 1:
        grads = _allreduce_gradients(
            grads,
            op=self._mtx_op,
            sparse_as_dense=self._mtx_sparse_as_dense,
            compression=self._mtx_compression,
            scale=_current_grad_scale(),
            local=_local_vars_flags(self, trainable_variables),
        )
        return super(cls, self).apply(grads, trainable_variables)
    return _accumulate_then_apply(self, cls, grads, trainable_variables)


def _local_vars_flags(self, trainable_variables):
    if not self._mtx_local:
        return None
    if trainable_variables is None:
        trainable_variables = self._trainable_variables
    return _local_flags(list(trainable_variables), self._mtx_local)


def _register_local_var(self, var):
    """The gradient of var is not reduced over ranks (a variable each rank keeps its own, as in
    model parallelism); with op=Average it is divided by size() as the others are."""
    self._mtx_local |= _source_keys(var)


def _accumulate_then_apply(self, cls, grads, trainable_variables):
    """backward_passes_per_step = k > 1: gradients are summed locally for k calls; every k-th
    call averages the sum over the k passes and over the ranks (one allreduce) and applies it.
    The other calls change no weight and no optimizer step."""
    if trainable_variables is None:
        trainable_variables = self._trainable_variables
    trainable_variables = list(trainable_variables)
    if not self.built:
        self.build(trainable_variables)
    scale = _current_grad_scale()
    accs = self._mtx_accumulators
    for g, v in zip(grads, trainable_variables):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        if scale is not None:
            g = g * tf.cast(scale, g.dtype)
        accs[self._get_variable_index(v)].assign_add(g)
    self._mtx_pass.assign_add(1)
    k = self._mtx_passes

    def update():
        summed = [
            None if g is None else accs[self._get_variable_index(v)] / k
            for g, v in zip(grads, trainable_variables)
        ]
        averaged = _allreduce_gradients(
            [None if s is None else tf.convert_to_tensor(s) for s in summed],
            op=self._mtx_op,
            compression=self._mtx_compression,
            local=_local_vars_flags(self, trainable_variables),
        )
        super(cls, self).apply(averaged, trainable_variables)
        for a in accs:
            a.assign(tf.zeros_like(a))
        return tf.constant(True)

    tf.cond(tf.equal(self._mtx_pass % k, 0), update, lambda: tf.constant(False))


def _distributed_build(self, variables):
    cls = self._mtx_dist_class
    super(cls, self).build(variables)
    if self._mtx_passes > 1 and not getattr(self, "_mtx_accumulators", None):
        self._mtx_accumulators = [
            self.add_variable_from_reference(v, name="mtxcomm_accumulated_gradient")
            for v in variables
        ]
        self._mtx_pass = self.add_variable(
            (), initializer="zeros", dtype="int64", name="mtxcomm_backward_pass"
        )


def _patch_loss_scale_optimizer():
    """LossScaleOptimizer(DistributedOptimizer(opt)): the loss-scale optimizer decides on its
    own whether the gradients are finite and skips the inner optimizer when they are not. Ranks
    could then decide differently and the inner allreduce would pair with another step. So such
    an outer optimizer averages the (scaled; averaging is linear) gradients first, every rank
    sees the same values and takes the same branch, and the inner one does not average again."""
    import keras

    lso = keras.optimizers.LossScaleOptimizer
    if getattr(lso, "_mtx_patched", False):
        return
    original_apply = lso.apply

    def apply(self, grads, trainable_variables=None):
        inner = getattr(self, "inner_optimizer", None)
        if (
            getattr(inner, "_mtx_dist_class", None) is None
            or getattr(self, "_mtx_dist_class", None) is not None
        ):
            return original_apply(self, grads, trainable_variables)
        grads = _allreduce_gradients(
            list(grads),
            op=inner._mtx_op,
            sparse_as_dense=inner._mtx_sparse_as_dense,
            compression=inner._mtx_compression,
            scale=_current_grad_scale(),
        )
        _step_state.averaged = True
        try:
            return original_apply(self, grads, trainable_variables)
        finally:
            _step_state.averaged = False

    lso.apply = apply
    lso._mtx_patched = True


def _install_no_xla_train_step(model_cls):
    """Once: a model whose optimizer is a DistributedOptimizer builds its train step without
    XLA (compile(jit_compile=True)), with one warning: mtxcomm's collective ops have no XLA
    kernel, and TensorFlow would fail the first step ("No registered 'MtxcommAllreduce'
    OpKernel for XLA_CPU_JIT devices"). The rest of the model (evaluate, predict) keeps it."""
    if model_cls.__dict__.get("_mtx_no_xla_train_step", False):
        return
    original = model_cls.make_train_function

    @functools.wraps(original)
    def make_train_function(self, force=False):
        if (
            (force or getattr(self, "train_function", None) is None)
            and getattr(self, "jit_compile", False) is True
            and getattr(getattr(self, "optimizer", None), "_mtx_dist_class", None)
        ):
            warnings.warn(
                "mtxcomm.tensorflow.keras: the train step of this model is built "
                "without XLA (jit_compile): its DistributedOptimizer's collective ops "
                "have no XLA kernel",
                stacklevel=2,
            )
            self.jit_compile = False
            try:
                return original(self, force=force)
            finally:
                self.jit_compile = True
        return original(self, force=force)

    model_cls.make_train_function = make_train_function
    model_cls._mtx_no_xla_train_step = True


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=True,
    num_groups=0,
    groups=None,
    process_set=None,
):
    """Makes a Keras 3 optimizer average every gradient over the ranks (op), exactly once per
    applied step, before the optimizer uses it (so clipping, weight decay and loss scaling see
    the averaged gradient). The optimizer is changed in place and returned.

    - None gradients pass through; IndexedSlices (e.g. from Embedding) are allgathered and
      averaged, or densified first with ``sparse_as_dense=True``.
    - All gradients of a step go in one grouped allreduce (one collective per dtype).
    - Works wrapping, or wrapped by, ``keras.optimizers.LossScaleOptimizer``.
    - ``backward_passes_per_step=k``: gradients are accumulated locally for k steps, then their
      mean is averaged over ranks and applied (an effective batch k times larger).
    - From the first call on, ``Model.fit`` destroys each finished epoch's tf.data iterator on a
      background thread instead of the training thread (``_keras_iterators.py``: with one core per
      rank that destruction idled every rank 110-180 ms per epoch).
    Raises ValueError for a non-Keras-3 optimizer, NotImplementedError for Horovod options
    mtxcomm does not provide (process sets, groups, gradient_predivide_factor != 1).
    """
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            "DistributedOptimizer expects a Keras 3 optimizer "
            "(keras.optimizers.Optimizer), got %r" % type(optimizer).__name__
        )
    _check_optimizer_options(process_set, groups, num_groups, gradient_predivide_factor)
    if not average_aggregated_gradients and backward_passes_per_step > 1:
        raise NotImplementedError(
            "DistributedOptimizer: accumulated gradients are always "
            "averaged over the backward passes"
        )
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be >= 1, got %r" % backward_passes_per_step)
    # Model.fit's epoch iterators are destroyed off the training thread (_keras_iterators.py).
    _iterators.install(keras.Model, tf)
    _install_no_xla_train_step(keras.Model)
    if getattr(optimizer, "_mtx_dist_class", None) is not None:
        return optimizer  # already distributed: averaging twice would be wrong
    inner = getattr(optimizer, "inner_optimizer", None)
    if getattr(inner, "_mtx_dist_class", None) is not None:
        return optimizer  # a LossScaleOptimizer around a distributed one averages already
    _patch_loss_scale_optimizer()
    if backward_passes_per_step > 1 and optimizer.built:
        raise ValueError(
            "DistributedOptimizer(backward_passes_per_step > 1) must wrap the "
            "optimizer before its first step"
        )
    base = type(optimizer)
    cls = type(
        base.__name__,
        (base,),
        {
            "apply": _distributed_apply,
            "build": _distributed_build,
            "register_local_var": _register_local_var,
        },
    )
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    cls._mtx_dist_class = cls
    optimizer.__class__ = cls
    optimizer._mtx_op = _resolve_op(op, None, "DistributedOptimizer")
    optimizer._mtx_sparse_as_dense = bool(sparse_as_dense)
    optimizer._mtx_compression = compression
    optimizer._mtx_passes = int(backward_passes_per_step)
    optimizer._mtx_local = set()
    return optimizer


def PartialDistributedOptimizer(
    optimizer,
    name=None,
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=True,
    groups=None,
    process_set=None,
    local_layers=None,
    scale_local_gradients=True,
):
    """DistributedOptimizer whose worker-local variables are the trainable weights of
    local_layers (a Keras layer or a list of them): their gradients are not reduced (divided by
    size() with Average when scale_local_gradients)."""
    if not scale_local_gradients:
        raise NotImplementedError(
            "PartialDistributedOptimizer: local gradients are always "
            "scaled as the reduced ones are (scale_local_gradients=True)"
        )
    opt = DistributedOptimizer(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
    )
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        for w in layer.trainable_weights:
            opt.register_local_var(w)
    return opt
