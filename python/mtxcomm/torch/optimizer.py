"""``DistributedOptimizer`` of the Horovod-style API (Horovod's ``horovod/torch/optimizer``):
wraps a torch optimizer so that each gradient is allreduced as soon as backward produces it,
and step() waits for them.
"""

from mtxcomm import _arrays
from mtxcomm.torch.compression import Compression
from mtxcomm.torch._ops import Adasum, Average, Sum, allreduce_async_, synchronize
from mtxcomm.torch.basics import need_init, size

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def _mtx_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor):
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named):
                raise ValueError("DistributedOptimizer: named_parameters must be (name, "
                                 "parameter) pairs, e.g. model.named_parameters()")
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("DistributedOptimizer: parameter names are not unique")
            by_id = {id(p): n for n, p in named}
            missing = [p for p in params if id(p) not in by_id]
            if missing:
                raise ValueError("DistributedOptimizer: named_parameters misses %d of the "
                                 "optimizer's parameters" % len(missing))
        else:
            by_id = {id(p): "param.%d.%d" % (gi, pi)
                     for gi, g in enumerate(self.param_groups) for pi, p in enumerate(g["params"])}
        if backward_passes_per_step < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1")
        if op == Adasum:
            raise NotImplementedError("DistributedOptimizer: op=Adasum is not supported in the "
                                      "torch API; use Average or Sum")
        self._mtx_names = by_id
        self._mtx_compression = compression
        self._mtx_passes = backward_passes_per_step
        self._mtx_op = op
        self._mtx_predivide = gradient_predivide_factor
        self._mtx_counts = {}
        self._mtx_handles = {}
        self._mtx_hooks = []
        self._mtx_skip = False
        for p in params:
            if p.requires_grad:
                self._mtx_hooks.append(p.register_post_accumulate_grad_hook(self._mtx_hook))

    def _mtx_submit(self, p):
        grad = p.grad
        name = "allreduce.%s" % self._mtx_names[id(p)]
        if self._mtx_op == Average:
            # Horovod: divide by predivide before the sum, the rest after.
            pre = 1.0 / self._mtx_predivide
            post = self._mtx_predivide / size()
            op = Sum
        else:
            pre, post, op = 1.0, 1.0, self._mtx_op
        t, ctx = self._mtx_compression.compress(grad)
        if t is grad:
            h = allreduce_async_(grad, name=name, op=op, prescale_factor=pre,
                                 postscale_factor=post)
        else:
            h = allreduce_async_(t, name=name, op=op, prescale_factor=pre, postscale_factor=post)
        self._mtx_handles[p] = (h, t, ctx)

    def _mtx_hook(self, p):
        if p in self._mtx_handles and self._mtx_handles[p][0] is not None:
            raise AssertionError(
                "DistributedOptimizer: a gradient was computed twice before step() (call "
                "optimizer.synchronize() between the backward passes, or set "
                "backward_passes_per_step)")
        n = self._mtx_counts.get(p, 0) + 1
        self._mtx_counts[p] = n
        if n == self._mtx_passes:
            self._mtx_counts[p] = 0
            self._mtx_submit(p)

    def synchronize(self):
        """Waits for every gradient's allreduce; afterwards p.grad holds the reduced value."""
        for g in self.param_groups:
            for p in g["params"]:
                if (p.requires_grad and p.grad is not None and p not in self._mtx_handles
                        and self._mtx_counts.get(p, 0) == 0):
                    # A parameter whose hook did not fire this step (unused): still reduced, so
                    # the ranks agree on the request sequence.
                    self._mtx_submit(p)
        for p, (h, t, ctx) in list(self._mtx_handles.items()):
            synchronize(h)
            if t is not p.grad:
                p.grad.copy_(self._mtx_compression.decompress(t, ctx))
        self._mtx_handles.clear()

    def skip_synchronize(self):
        """A context in which step() does not synchronize (call synchronize() yourself first)."""
        opt = self

        class _Skip:
            def __enter__(self):
                opt._mtx_skip = True

            def __exit__(self, *exc):
                opt._mtx_skip = False
        return _Skip()

    def step(self, closure=None):
        if not self._mtx_skip:
            self.synchronize()
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if self._mtx_handles:
            raise AssertionError("DistributedOptimizer: zero_grad() while gradients are being "
                                 "reduced; call step() or synchronize() first")
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None):
    """optimizer, made to reduce each gradient over all ranks as soon as backward produces it
    (one asynchronous allreduce per parameter, named after it; the engine fuses those ready
    together) and to wait for them in step(). op: Average (default) or Sum.
    backward_passes_per_step: gradients accumulated locally (summed in p.grad, as PyTorch
    does) over that many backward passes before one reduction, as Horovod (no division by the
    number of passes). Returns an instance of a subclass of the optimizer's
    class sharing its state (param_groups, state)."""
    need_init("DistributedOptimizer")
    if not compression:
        compression = Compression.none
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    dist_opt = cls.__new__(cls)
    dist_opt.__dict__ = optimizer.__dict__
    dist_opt._mtx_setup(named_parameters, compression, backward_passes_per_step,
                        _arrays._op(op, "DistributedOptimizer"), gradient_predivide_factor)
    return dist_opt
