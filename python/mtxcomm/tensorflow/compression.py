"""Gradient compression for mtxcomm.tensorflow (Horovod's ``hvd.Compression``): ``none`` (the
default) sends tensors as they are, ``fp16`` sends float32, float64 and bfloat16 tensors as
float16 and casts the result back. The logic is ``mtxcomm.common.compression``'s; this module
gives it TensorFlow's dtypes and cast.
"""

import tensorflow as tf

from mtxcomm.common import compression as _common


class FP16Compressor(_common.FP16Compressor):
    """Floating-point tensors (tf.float32, tf.float64, tf.bfloat16) go as tf.float16 and come
    back in their dtype; other tensors go as they are."""

    float16 = tf.float16

    @staticmethod
    def is_floating(dtype):
        return dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class Compression(_common.Compression):
    """Gradient compression for the wire: ``none`` or ``fp16`` (float tensors sent as float16)."""

    none = _common.NoneCompressor
    fp16 = FP16Compressor
