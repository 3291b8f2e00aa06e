"""The C++ ``torch.distributed`` backend (``bindings/torch``: ``mtxcomm.torch._c10d``) and the
choice between it and the Python one (``backend.py``): the C++ backend serves when its module
imports and was built for the installed torch; otherwise the Python one does, after one warning
naming the rebuild command. ``MTXCOMM_TORCH_BACKEND=python`` asks for the Python one. The C++
backend of a group runs on a communicator of its own (bootstrapped through the group's store,
``_group.open_comm``) and hands what it does not run natively to the group's Python backend.
"""

import atexit
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world as _c10d_world

from mtxcomm.torch import _group, _work

__all__ = [
    "REBUILD",
    "native_module",
    "warn_fallback",
    "native_backend",
    "python_backend",
    "as_process_group",
    "direct_all_reduce",
    "records_its_own_calls",
]

_NATIVE_KEY = "mtxcomm/c10d"
REBUILD = "pip install --no-build-isolation --force-reinstall ."
_warned = []


def _torch_version():
    return str(torch.__version__)


def native_module():
    """(mtxcomm.torch._c10d, None) when the C++ backend can serve, else (None, why)."""
    choice = os.environ.get("MTXCOMM_TORCH_BACKEND", "auto").strip().lower() or "auto"
    if choice == "python":
        return None, None  # asked for: no warning
    if choice != "auto":
        raise ValueError('MTXCOMM_TORCH_BACKEND="%s" is invalid: use auto or python' % choice)
    try:
        from mtxcomm.torch import _c10d
    except ImportError as e:  # not built (no torch headers at install), or an undefined symbol
        return None, "mtxcomm.torch._c10d does not import (%s)" % e
    built = str(getattr(_c10d, "TORCH_VERSION", "unknown"))
    if built != _torch_version():
        return None, "mtxcomm.torch._c10d was built for torch %s but torch %s is installed" % (
            built,
            _torch_version(),
        )
    return _c10d, None


def devices():
    """The devices the backend registers for: "cuda" too when the C++ backend serves and
    libmtxcomm was built with CUDA (CUDA tensors then run on its device paths)."""
    from mtxcomm import _core

    module, _ = native_module()
    return ["cpu", "cuda"] if module is not None and _core.build_feature("cuda") else ["cpu"]


_TORCH_FR_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def records_its_own_calls(backend_name):
    """Declares backend_name a backend that records its own calls, so that torch.distributed
    does not attach its generic flight-recorder hook to its groups. That hook (torch 2.15+,
    ``_maybe_attach_flight_recorder``) gathers a Python traceback on every call: 11-16 us of a
    small ``dist.all_reduce`` at 2 ranks on the AMD guest of bench/RESULTS.md. mtxcomm
    records every call itself, in each communicator's flight recorder
    (``MTXCOMM_FLIGHT_RECORDER``, docs/debugging.md). torch's hook stays where the user asked
    for torch's recorder (``TORCH_FR_BUFFER_SIZE`` or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` set,
    above 0) or turned mtxcomm's off (``MTXCOMM_FLIGHT_RECORDER=0``). True when declared."""
    own = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if not isinstance(own, set):
        return False  # a torch without the hook
    asked = any(os.environ.get(v, "").strip() not in ("", "0") for v in _TORCH_FR_VARS)
    ours_off = os.environ.get("MTXCOMM_FLIGHT_RECORDER", "").strip() == "0"
    if asked or ours_off:
        own.discard(backend_name)
        return False
    own.add(backend_name)
    return True


def warn_fallback(why):
    if _warned:
        return
    _warned.append(why)
    warnings.warn(
        "mtxcomm: the C++ torch.distributed backend is not used: %s; the Python backend "
        "serves (slower: ~100 us more per call). Rebuild mtxcomm against this torch, from its "
        "source tree: %s (or scripts/setup_python.sh)" % (why, REBUILD),
        RuntimeWarning,
        stacklevel=3,
    )


_INLINE_VAR = "MTXCOMM_TORCH_INLINE_BYTES"


def python_backend(backend):
    """The Python backend behind a group's backend: itself, or the C++ one's fallback."""
    return getattr(backend, "fallback", None) or backend


def native_backend(module, opts, py_backend):
    """The C++ backend of a group (opts: register_backend's), over py_backend; collective
    over the group's ranks (its communicator is bootstrapped through the group's store)."""
    size = opts.group_size
    ranks = list(opts.global_ranks_in_group) if opts.global_ranks_in_group else list(range(size))
    comm, (inline_bytes,) = _group.open_comm(
        opts.store, opts.group_rank, ranks, opts.timeout, _NATIVE_KEY, read=(_INLINE_VAR,)
    )
    seconds = _work.group_seconds(opts.timeout)
    native = module.MtxcommBackend(
        opts.group_rank,
        size,
        comm.value,
        py_backend,
        seconds if seconds is not None else 0.0,
        int(float(inline_bytes)),  # validated by the library at the communicator's init
    )
    # Closed at exit (a group never destroyed): its communicator's threads end before the
    # library's static ones are destroyed. Those closed already (destroy_process_group) go.
    _native_backends[:] = [b for b in _native_backends if b.comm_address] + [native]
    return native


_native_backends = []


def as_process_group(backend, opts, caller):
    """What the creator returns: the C++ backend's own ProcessGroup (whose getBackendName() is
    "mtxcomm") when the group being made has no other backend, else the backend itself.
    caller: the creator's caller's frame (torch's _new_process_group_helper), whose
    backend_config says which backend each device of the group gets; a group such as
    "cpu:mtxcomm,cuda:nccl" needs PyTorch's own ProcessGroup to hold both."""
    if python_backend(backend) is backend:
        return backend  # the Python backend alone
    config = caller.f_locals.get("backend_config") if caller is not None else None
    try:
        device_backends = set(config.get_device_backend_map().values())
    except AttributeError:  # another torch's helper: keep PyTorch's ProcessGroup
        return backend
    if device_backends != {"mtxcomm"}:
        return backend
    module = sys.modules[type(backend).__module__]  # mtxcomm.torch._c10d
    return module.ProcessGroup(opts.store, opts.group_rank, opts.group_size, backend)


_OPS = {
    dist.ReduceOp.SUM: 0,  # mtxcomm_op_t
    dist.ReduceOp.PRODUCT: 1,
    dist.ReduceOp.MIN: 2,
    dist.ReduceOp.MAX: 3,
    dist.ReduceOp.AVG: 4,
}
_direct = {}  # process group -> its C++ backend's allreduce_direct


def direct_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None):
    """Allreduces ``tensor`` in place across ``group`` (default: the default group) and returns
    it, on the calling thread, without torch.distributed's dispatch: the C++ backend's call of
    ``mtxcomm_allreduce`` on the group's communicator, after the calls already queued on it.
    For tensor-parallel inference, where a few microseconds per call count (as DeepSpeed's
    ``inference_all_reduce``). ``tensor``: contiguous, dense, on the CPU, of a dtype mtxcomm has
    (``ValueError`` otherwise); ``op``: SUM, AVG, PRODUCT, MIN or MAX. Collective: every rank
    of the group calls it in the same order as its other calls on the group. No autograd, no
    ``Work``. Needs the C++ backend (``RuntimeError`` under the Python one)."""
    pg = group if group is not None else _c10d_world.default_pg
    call = _direct.get(pg)
    if call is None:
        call = _direct_call(pg)
    try:
        code = _OPS[op]
    except (KeyError, TypeError):
        raise ValueError(
            "mtxcomm.torch.direct_all_reduce: op %r is not one of SUM, AVG, PRODUCT, MIN, MAX"
            % (op,)
        ) from None
    call(tensor, code)
    return tensor


def _direct_call(pg):
    if pg is None:
        raise RuntimeError(
            "mtxcomm.torch.direct_all_reduce: no process group (init_process_group first)"
        )
    if not isinstance(pg, dist.ProcessGroup):
        raise ValueError(
            "mtxcomm.torch.direct_all_reduce: group %r is not a process group of this rank "
            "(GroupMember.NON_GROUP_MEMBER: this rank is not in it)" % (pg,)
        )
    backend = pg._get_backend(torch.device("cpu"))
    call = getattr(backend, "allreduce_direct", None)
    if call is None:
        raise RuntimeError(
            "mtxcomm.torch.direct_all_reduce needs the group's C++ mtxcomm backend; this group "
            "runs %s.%s (the Python backend: MTXCOMM_TORCH_BACKEND=python, or mtxcomm.torch._c10d "
            "not built)" % (type(backend).__module__, type(backend).__name__)
        )
    _direct.clear()  # one group at a time in practice; no destroyed group kept alive
    _direct[pg] = call
    return call


@atexit.register
def _close_native_backends():
    for b in reversed(_native_backends):
        try:
            b.close()
        except Exception:  # noqa: BLE001 - at exit: the others still close
            pass
    del _native_backends[:]
