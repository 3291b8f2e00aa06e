"""Helpers Horovod's TensorFlow module exposes as ``horovod.tensorflow.util``."""

import tensorflow as tf


def _executing_eagerly():
    """True when TensorFlow runs eagerly (not while a graph or tf.function is built)."""
    return tf.executing_eagerly()
