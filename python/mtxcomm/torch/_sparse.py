"""The sparse (COO) ``all_reduce`` of the ``"mtxcomm"`` backend, as Gloo makes it: a mixin of
``MtxcommBackend`` (``backend.py``) over its submitter."""

import torch
import torch.distributed as dist

from mtxcomm import _core
from mtxcomm.torch import _tensors

__all__ = ["SparseAllreduce"]


class SparseAllreduce:
    """allreduce of one sparse COO tensor, for MtxcommBackend (which provides ``_submit``,
    ``_submit_each``, ``_work`` and ``size``)."""

    def _sparse_allreduce(self, t, reduce_op):
        """SUM of a sparse COO tensor, as Gloo makes it: every rank's entries gathered (their
        counts first, then the indices and the values by two allgathers of uneven size), summed
        by coalescing, and copied into t (sparse, so its entries may change)."""
        what = "allreduce (sparse)"
        if reduce_op.op != dist.ReduceOp.SUM:
            raise ValueError(
                "mtxcomm backend: %s: a sparse tensor takes SUM only (as with Gloo), not %s"
                % (what, reduce_op.op)
            )
        s = t.detach().coalesce()
        idx = s._indices().t().contiguous()  # (nnz, sparse dims)
        val = s._values().contiguous()  # (nnz, dense dims...)
        n, sd = self.size(), idx.shape[1]
        nnz = torch.tensor([idx.shape[0]], dtype=torch.int64)
        counts = torch.empty(n, dtype=torch.int64)
        c = _tensors.code(nnz, what)
        p = self._submit(
            _core.KIND_ALLGATHER, [nnz.data_ptr()], c, [[1]], [counts.data_ptr()], [[n]]
        )
        w = self._work(what, [p], [counts], (nnz, counts))
        w.wait()
        total = int(counts.sum())
        gi = torch.empty(total * sd, dtype=torch.int64)
        gv = torch.empty((total,) + tuple(val.shape[1:]), dtype=val.dtype)
        bi, bv = _tensors.Buf(idx.reshape(-1), what), _tensors.Buf(val, what, complex_ok=True)
        oi, ov = _tensors.Buf(gi, what), _tensors.Buf(gv, what, complex_ok=True)
        calls = [
            ((_core.KIND_ALLGATHER, [b.ptr()], b.code, [b.shape()], [o.ptr()], [o.shape()]), {})
            for b, o in ((bi, oi), (bv, ov))
        ]
        keep = (bi, bv, oi, ov)
        pendings = self._submit_each(calls, keep)

        def finish(_):
            summed = torch.sparse_coo_tensor(
                gi.view(total, sd).t(), gv, t.size(), check_invariants=False
            ).coalesce()
            t.copy_(summed)

        return self._work(what, pendings, [t], keep, finish)
