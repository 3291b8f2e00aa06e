"""``DistributedOptimizer`` of the Horovod-style API (Horovod's ``horovod/torch/optimizer``):
wraps a torch optimizer so that each gradient is allreduced as soon as backward produces it,
and step() waits for them.
"""

import warnings

import torch

from mtxcomm import _arrays
from mtxcomm.torch._ops import (
    Adasum,
    Average,
    Sum,
    allreduce_async,
    allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)
from mtxcomm.torch.basics import need_init, size
from mtxcomm.torch.compression import Compression

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def _mtx_setup(
        self,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        sparse_as_dense,
        process_set,
    ):
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named):
                raise ValueError(
                    "DistributedOptimizer: named_parameters must be (name, "
                    "parameter) pairs, e.g. model.named_parameters()"
                )
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("DistributedOptimizer: parameter names are not unique")
            by_id = {id(p): n for n, p in named}
            missing = [p for p in params if id(p) not in by_id]
            if missing:
                raise ValueError(
                    "DistributedOptimizer: named_parameters misses %d of the "
                    "optimizer's parameters" % len(missing)
                )
        else:
            # Horovod's names for unnamed parameters: by group and position.
            by_id = {
                id(p): "allreduce.noname.%d.%d" % (gi, pi)
                for gi, g in enumerate(self.param_groups)
                for pi, p in enumerate(g["params"])
            }
        if backward_passes_per_step < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1")
        if op == Adasum:
            raise NotImplementedError(
                "DistributedOptimizer: op=Adasum is not supported in the "
                "torch API; use Average or Sum"
            )
        # Horovod's attribute: parameter -> the name its gradient is reduced under.
        self._parameter_names = {p: by_id[id(p)] for p in params}
        self._mtx_compression = compression
        self._mtx_passes = backward_passes_per_step
        self._mtx_op = op
        self._mtx_predivide = gradient_predivide_factor
        self._mtx_sparse_as_dense = sparse_as_dense
        self._mtx_process_set = process_set
        self._mtx_counts = {}
        self._mtx_handles = {}
        self._mtx_hooks = []
        self._mtx_skip = False
        self._mtx_synchronized = False
        self._mtx_included = process_set is None or process_set.included()
        if self._mtx_included:
            for p in params:
                if p.requires_grad:
                    self._mtx_hooks.append(p.register_post_accumulate_grad_hook(self._mtx_hook))

    def _mtx_set_size(self):
        ps = self._mtx_process_set
        return size() if ps is None else ps.size()

    def _mtx_submit(self, p):
        if p.grad is None:
            # Unused by this rank's backward (another rank's may have used it): reduced as
            # zeros, so that every rank makes the same requests (as Horovod).
            p.grad = torch.zeros_like(p.detach())
        name = "allreduce.%s" % self._parameter_names[p]
        ps = self._mtx_process_set
        grad = p.grad
        if grad.is_sparse and not self._mtx_sparse_as_dense:
            # An allgather of the indices and one of the values (sparse_allreduce_async).
            self._mtx_handles[p] = (
                "sparse",
                sparse_allreduce_async(
                    grad, name=name, op=Average if self._mtx_op == Average else Sum, process_set=ps
                ),
                None,
            )
            return
        if self._mtx_op == Average:
            # Horovod: divide by predivide before the sum, the rest after.
            pre = 1.0 / self._mtx_predivide
            post = self._mtx_predivide / self._mtx_set_size()
            op = Sum
        else:
            pre, post, op = 1.0, 1.0, self._mtx_op
        if grad.is_sparse:  # sparse_as_dense: reduced dense, put back sparse in synchronize
            h = allreduce_async(
                grad.to_dense(),
                name=name,
                op=op,
                prescale_factor=pre,
                postscale_factor=post,
                process_set=ps,
            )
            self._mtx_handles[p] = ("dense", h, None)
            return
        t, ctx = self._mtx_compression.compress(grad)
        h = allreduce_async_(
            t, name=name, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps
        )
        self._mtx_handles[p] = ("in place", h, (t, ctx))

    def _mtx_hook(self, p):
        if p in self._mtx_handles:
            raise AssertionError(
                "DistributedOptimizer: a gradient was computed more than "
                "backward_passes_per_step times before step() (call optimizer.synchronize() "
                "between the backward passes, or raise backward_passes_per_step)"
            )
        n = self._mtx_counts.get(p, 0) + 1
        self._mtx_counts[p] = n
        if n == self._mtx_passes:
            self._mtx_submit(p)

    def synchronize(self):
        """Waits for every gradient's allreduce; afterwards p.grad holds the reduced value.
        A parameter whose hook did not fire since the last synchronize (unused by this rank's
        backward, or fewer passes than backward_passes_per_step) is reduced here (as zeros
        where it has no gradient), so every rank reduces every parameter."""
        if not self._mtx_included:
            self._mtx_synchronized = True
            return
        for g in self.param_groups:
            for p in g["params"]:
                if p.requires_grad and p not in self._mtx_handles:
                    self._mtx_submit(p)
        for p, (kind, h, extra) in list(self._mtx_handles.items()):
            if kind == "sparse":
                _set_grad(p, h())
            elif kind == "dense":
                _set_grad(p, synchronize(h))
            else:
                synchronize(h)
                t, ctx = extra
                if t is not p.grad:
                    p.grad.copy_(self._mtx_compression.decompress(t, ctx))
        self._mtx_handles.clear()
        self._mtx_counts.clear()
        self._mtx_synchronized = True

    def skip_synchronize(self):
        """A context in which step() does not synchronize (call synchronize() yourself first)."""
        opt = self

        class _Skip:
            def __enter__(self):
                opt._mtx_skip = True

            def __exit__(self, *exc):
                opt._mtx_skip = False

        return _Skip()

    def _local_step(self, closure=None):
        """The wrapped optimizer's own step: no reduction."""
        return super().step(closure)

    def step(self, closure=None):
        if not self._mtx_skip:
            if self._mtx_synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() "
                    "context after optimizer.synchronize(): the gradients are "
                    "reduced again (synchronize() then step() inside "
                    "skip_synchronize() reduces them once)",
                    stacklevel=2,
                )
            self.synchronize()
        self._mtx_synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if self._mtx_handles:
            raise AssertionError(
                "DistributedOptimizer: zero_grad() while gradients are being "
                "reduced; call step() or synchronize() first"
            )
        return super().zero_grad(set_to_none=set_to_none)


def _set_grad(p, reduced):
    """p.grad = reduced, in p.grad's layout (a sparse gradient stays sparse)."""
    if p.grad.is_sparse:
        p.grad = (reduced if reduced.is_sparse else reduced.to_sparse()).coalesce()
    else:
        p.grad.copy_(reduced)


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=None,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=None,
):
    """optimizer, made to reduce each gradient over the ranks (of process_set, default all) as
    soon as backward produces it (one asynchronous allreduce per parameter, named after it; the
    engine fuses those ready together) and to wait for them in step(). op: Average (default)
    or Sum. backward_passes_per_step: gradients accumulated locally (summed in p.grad, as
    PyTorch does) over that many backward passes before one reduction, as Horovod (no division
    by the number of passes). Sparse gradients (an Embedding(sparse=True)) are reduced as
    sparse_allreduce_async does, or, with sparse_as_dense, by a dense allreduce (the gradient
    stays sparse). On a rank outside process_set, step() is the optimizer's own. Returns an
    instance of a subclass of the optimizer's class sharing its state (param_groups,
    state)."""
    need_init("DistributedOptimizer")
    if not compression:
        compression = Compression.none
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    dist_opt = cls.__new__(cls)
    dist_opt.__dict__ = optimizer.__dict__
    dist_opt._mtx_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        _arrays._op(op, "DistributedOptimizer"),
        gradient_predivide_factor,
        sparse_as_dense,
        process_set,
    )
    return dist_opt
