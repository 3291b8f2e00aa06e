"""Torch tensors as the engine's buffers: the checks a tensor passes before the engine gets its
address, torch dtype and c10d ``ReduceOp`` to mtxcomm's codes, and ``Buf``, a tensor's contiguous
1-D view for the engine with the copy back into a caller's non-contiguous tensor.

Used by the backend (``backend.py``) and the Horovod-style API (``_ops.py``); the error messages
are the backend's ("mtxcomm backend: ...") for both, as before the split.
"""

import torch
from torch._C._distributed_c10d import ReduceOp

from mtxcomm import _arrays

__all__ = ["SUPPORTED", "FAST_CODES", "OP_CODES", "code", "check", "Buf", "c10d_op"]

SUPPORTED = (
    "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, "
    "float32, float64, bool (complex64/complex128 for SUM, AVG, PREMUL_SUM)"
)

# torch dtype -> mtxcomm datatype (the real dtypes; complex tensors travel as their reals).
FAST_CODES = {dt: code for dt, (code, _) in _arrays._torch_dtypes(torch).items()}


def code(t, what):
    """mtxcomm's datatype code of tensor t (a real dtype); TypeError naming what otherwise."""
    c = FAST_CODES.get(t.dtype)
    if c is None:
        raise TypeError(
            "mtxcomm backend: %s: a tensor of dtype %s, which mtxcomm does not "
            "support; supported: %s" % (what, t.dtype, SUPPORTED)
        )
    return c


def check(t, what):
    """Raises unless t is a dense CPU torch.Tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            "mtxcomm backend: %s: expected a torch.Tensor, got %s" % (what, type(t).__name__)
        )
    if t.device.type != "cpu":
        raise ValueError(
            "mtxcomm backend: %s: a tensor on %s; this (Python) backend runs torch "
            "collectives on CPU tensors (CUDA tensors: the C++ backend over a CUDA build of "
            'mtxcomm, or init_process_group("cpu:mtxcomm,cuda:nccl"))' % (what, t.device)
        )
    if t.layout != torch.strided:
        raise ValueError(
            "mtxcomm backend: %s: a %s tensor; only dense (strided) tensors" % (what, t.layout)
        )


class Buf:
    """A tensor as a contiguous buffer for the engine: ``view`` (1-D, mtxcomm's dtype), and on
    finish the result copied back into the caller's tensor when it was not contiguous."""

    def __init__(self, t, what, complex_ok=False):
        check(t, what)
        self.tensor = t
        self.contig = t if t.is_contiguous() else t.contiguous()
        view = self.contig
        if view.is_complex():
            if not complex_ok:
                raise TypeError(
                    "mtxcomm backend: %s: complex tensors take SUM, AVG or PREMUL_SUM only" % what
                )
            view = torch.view_as_real(view)
        self._dims = list(view.shape)
        self.view = view.reshape(-1)
        self.code = code(self.view, what)

    def ptr(self):
        return self.view.data_ptr()

    def shape(self):
        """The flat shape [elements] (the backend's requests: c10d checks shapes itself)."""
        return [self.view.numel()]

    def dims(self):
        """The tensor's own shape (a complex tensor's with a last dimension of 2), for requests
        whose shapes the engine must check across ranks (the Horovod-style API)."""
        return list(self._dims)

    def copy_back(self):
        if self.contig is not self.tensor:
            self.tensor.copy_(self.contig)


OP_CODES = {
    ReduceOp.SUM: _arrays.SUM,
    ReduceOp.PRODUCT: _arrays.PROD,
    ReduceOp.MIN: _arrays.MIN,
    ReduceOp.MAX: _arrays.MAX,
    ReduceOp.AVG: _arrays.AVG,
}


def c10d_op(reduce_op, what, tensors):
    """(mtxcomm op, premul factor or None) of a c10d ReduceOp."""
    op_type = getattr(reduce_op, "op", reduce_op)
    if op_type == ReduceOp.PREMUL_SUM:
        factor = getattr(reduce_op, "factor", None)
        if factor is None:
            raise ValueError("mtxcomm backend: %s: PREMUL_SUM without a factor" % what)
        return _arrays.SUM, factor
    c = OP_CODES.get(op_type)
    if c is None:
        raise ValueError(
            "mtxcomm backend: %s: reduce op %s is not supported (SUM, AVG, MIN, "
            "MAX, PRODUCT, PREMUL_SUM)" % (what, op_type)
        )
    if any(t.is_complex() for t in tensors) and c not in (_arrays.SUM, _arrays.AVG):
        raise ValueError(
            "mtxcomm backend: %s: %s of complex tensors is not defined" % (what, op_type)
        )
    return c, None
