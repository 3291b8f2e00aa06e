"""The gradients' allreduce that every training wrapper of mtxcomm.tensorflow shares: the
gradient tapes and the TensorFlow 1 optimizer (optimizer.py), the Keras 3 optimizer
(_keras_optimizer.py) and the Keras callbacks: one grouped allreduce eagerly, one overlapping
allreduce per gradient in a graph; None passes through, IndexedSlices are allgathered,
worker-local gradients are not reduced. Also the check of the optimizer options mtxcomm does not
support.
"""

import tensorflow as tf

from mtxcomm.tensorflow._ops import Average, _overlapping, allreduce, grouped_allreduce
from mtxcomm.tensorflow.basics import size
from mtxcomm.tensorflow.compression import Compression


def _local_gradient(g, op):
    """A worker-local variable's gradient is not reduced; with Average it is divided by size()
    as the reduced ones are (Horovod's scale_local_gradients)."""
    if g is None or op != Average:
        return g
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(
            g.values / tf.cast(size(), g.values.dtype), g.indices, g.dense_shape
        )
    return g / tf.cast(size(), g.dtype)


def _allreduce_gradients(
    grads,
    op=Average,
    sparse_as_dense=False,
    compression=Compression.none,
    scale=None,
    name=None,
    local=None,
):
    """Averages (op) a list of gradients with one grouped allreduce. None passes through;
    IndexedSlices are allgathered (or densified with sparse_as_dense). ``scale`` multiplies
    every gradient first (transparent mode weights uneven batch shares with it). ``local``:
    flags of the gradients of worker-local variables, which are not reduced."""
    grads = list(grads)
    out = list(grads)
    dense_idx = []
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if local is not None and local[i]:
            out[i] = _local_gradient(g, op)
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                g = tf.convert_to_tensor(g)
            else:
                if scale is not None:
                    g = tf.IndexedSlices(
                        g.values * tf.cast(scale, g.values.dtype), g.indices, g.dense_shape
                    )
                with _overlapping():
                    out[i] = allreduce(g, op=op)
                continue
        if scale is not None:
            g = g * tf.cast(scale, g.dtype)
        dense_idx.append(i)
        dense.append(g)
    if dense:
        if tf.executing_eagerly():
            # Eagerly every op waits for its result: one request for all of them.
            reduced = grouped_allreduce(dense, op=op, compression=compression, name=name)
        else:
            # In a graph (tf.function, Keras' train_step) one op per gradient, not chained: each
            # starts as soon as its gradient exists, so the allreduce of a late layer overlaps
            # the backward pass of the earlier ones; the engine fuses those ready together.
            with _overlapping():
                reduced = [
                    allreduce(
                        g,
                        op=op,
                        compression=compression,
                        name=None if name is None else "%s/%d" % (name, k),
                    )
                    for k, g in enumerate(dense)
                ]
        for i, r in zip(dense_idx, reduced):
            out[i] = r
    return out


def _source_keys(v):
    """Identities of a gradient source: the object and, for a Keras variable, the TensorFlow
    variable it holds (either may be passed to register_local_source or as a source)."""
    keys = {id(v)}
    inner = getattr(v, "_value", None)
    if inner is not None:
        keys.add(id(inner))
    return keys


def _local_flags(variables, local_keys):
    return [bool(local_keys and _source_keys(v) & local_keys) for v in variables]


def _check_optimizer_options(process_set, groups, num_groups, gradient_predivide_factor):
    """Horovod options of DistributedOptimizer that mtxcomm does not provide."""
    if process_set is not None or groups is not None or num_groups:
        raise NotImplementedError(
            "DistributedOptimizer: process sets and groups are not "
            "supported (all gradients go in one group)"
        )
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError(
            "DistributedOptimizer: gradient_predivide_factor is not supported"
        )
