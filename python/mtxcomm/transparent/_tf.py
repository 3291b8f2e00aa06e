"""TensorFlow, imported where first used: the package is imported at interpreter start, before
the script, and must not import TensorFlow there."""


def tf_module():
    import tensorflow as tf

    return tf
