"""Gradient compression for mtxcomm.torch (Horovod's ``hvd.Compression``): ``none`` (the
default) sends tensors as they are, ``fp16`` sends float32, float64 and bfloat16 tensors as
float16 and casts the result back. The logic is ``mtxcomm.common.compression``'s; this module
gives it torch's dtypes and cast.
"""

import torch

from mtxcomm.common import compression as _common


class FP16Compressor(_common.FP16Compressor):
    """Floating-point tensors (torch.float32, torch.float64, torch.bfloat16) go as
    torch.float16 and come back in their dtype; other tensors go as they are."""

    float16 = torch.float16

    @staticmethod
    def is_floating(dtype):
        return dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        return tensor.to(dtype)


class Compression(_common.Compression):
    """Gradient compression for allreduce and DistributedOptimizer (Horovod's)."""

    none = _common.NoneCompressor
    fp16 = FP16Compressor
