"""The C++ ``torch.distributed`` backend (``bindings/torch``: ``mtxcomm.torch._c10d``) and the
choice between it and the Python one (``backend.py``): the C++ backend serves when its module
imports and was built for the installed torch; otherwise the Python one does, after one warning
naming the rebuild command. ``MTXCOMM_TORCH_BACKEND=python`` asks for the Python one. The C++
backend of a group runs on a communicator of its own (bootstrapped through the group's store,
``_group.open_comm``) and hands what it does not run natively to the group's Python backend.
"""

import atexit
import os
import warnings

import torch

from mtxcomm.torch import _group, _work

__all__ = ["REBUILD", "native_module", "warn_fallback", "native_backend", "python_backend"]

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
    seconds = _work.to_seconds(opts.timeout)
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


@atexit.register
def _close_native_backends():
    for b in reversed(_native_backends):
        try:
            b.close()
        except Exception:  # noqa: BLE001 - at exit: the others still close
            pass
    del _native_backends[:]
