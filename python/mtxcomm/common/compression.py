"""Horovod's gradient compression (``Compression.none``, ``Compression.fp16``), written once for
every framework.

A compressor's ``compress(tensor)`` returns (the tensor to send, a context) and
``decompress(tensor, context)`` turns what arrived back into the caller's dtype. A framework
subclasses ``FP16Compressor`` with its float16 dtype, its floating-point test and its cast, and
``Compression`` with that subclass as ``fp16`` (``mtxcomm/tensorflow/compression.py``,
``mtxcomm/torch/compression.py``). Compressors are used as classes, never instantiated.
"""


class NoneCompressor:
    """Sends a tensor as it is (the default)."""

    @staticmethod
    def compress(tensor):
        """(tensor, None)."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """tensor."""
        return tensor


class FP16Compressor:
    """Sends a floating-point tensor of another dtype (float32, float64, bfloat16) as float16 and
    casts the result back to that dtype; other tensors (float16, integers, bool) go as they are.

    A framework's subclass sets:
      float16: its float16 dtype;
      is_floating(dtype): whether dtype is a floating-point dtype;
      cast(tensor, dtype): the tensor converted to dtype.
    """

    float16 = None

    @staticmethod
    def is_floating(dtype):
        raise NotImplementedError("FP16Compressor.is_floating: set by the framework's subclass")

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError("FP16Compressor.cast: set by the framework's subclass")

    @classmethod
    def compress(cls, tensor):
        """(the float16 tensor, its original dtype) for another floating-point dtype, else
        (tensor, None)."""
        if cls.is_floating(tensor.dtype) and tensor.dtype != cls.float16:
            return cls.cast(tensor, cls.float16), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        """tensor cast back to ctx (the dtype compress saw), or tensor where ctx is None."""
        return tensor if ctx is None else cls.cast(tensor, ctx)


class Compression:
    """Gradient compression for the wire (Horovod's): ``none`` (the default) or ``fp16``
    (floating-point tensors sent as float16). A framework's subclass sets ``fp16`` to its
    FP16Compressor."""

    none = NoneCompressor
    fp16 = None
