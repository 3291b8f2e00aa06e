"""The array API's buffers: a caller's array (NumPy, PyTorch CPU tensor, JAX CPU array, DLPack
object or buffer-protocol object) as a host view the engine reads or writes without a copy
(``_input``, ``_output`` with its overlap check), the C API's datatype codes, and the result
handed back in the caller's array family (``_wrap``). Imports no framework: a torch or JAX
module is taken from ``sys.modules``, where the caller's array put it.
"""

import sys

import numpy as np

# The C API's mtxcomm_datatype_t, by NumPy (kind, itemsize); bfloat16 (ml_dtypes) by name.
_NUMPY_CODES = {
    ("i", 1): 0,
    ("u", 1): 1,
    ("i", 4): 2,
    ("u", 4): 3,
    ("i", 8): 4,
    ("u", 8): 5,
    ("f", 2): 6,
    ("f", 4): 8,
    ("f", 8): 9,
    ("i", 2): 10,
    ("u", 2): 11,
    ("b", 1): 12,
}
_BFLOAT16, _BOOL = 7, 12
_SUPPORTED = (
    "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16 "
    "(ml_dtypes.bfloat16, torch.bfloat16), float32, float64, bool"
)


def _dtype_code(dtype, what, name):
    dtype = np.dtype(dtype)
    code = None
    if dtype.isnative:
        code = _NUMPY_CODES.get((dtype.kind, dtype.itemsize))
        if code is None and dtype.name == "bfloat16" and dtype.itemsize == 2:
            code = _BFLOAT16
    if code is None:
        shown = str(dtype) if dtype.isnative else "%s (non-native byte order)" % dtype.str
        raise TypeError(
            "mtxcomm.%s: %s has dtype %s, which mtxcomm does not support; "
            "supported: %s" % (what, name, shown, _SUPPORTED)
        )
    return code


_torch_table = None


def _torch_dtypes(torch):
    """torch dtype -> (mtxcomm code, the dtype NumPy sees it as through DLPack, or None)."""
    global _torch_table
    if _torch_table is None:
        table = {
            torch.int8: (0, None),
            torch.uint8: (1, None),
            torch.int16: (10, None),
            torch.int32: (2, None),
            torch.int64: (4, None),
            torch.float16: (6, None),
            torch.float32: (8, None),
            torch.float64: (9, None),
            # NumPy has no bfloat16 and its DLPack bool support varies: same-size views.
            torch.bfloat16: (_BFLOAT16, torch.int16),
            torch.bool: (_BOOL, torch.uint8),
        }
        for name, code in (("uint16", 11), ("uint32", 3), ("uint64", 5)):
            if hasattr(torch, name):
                table[getattr(torch, name)] = (code, None)
        _torch_table = table
    return _torch_table


# ---- arrays in and out -----------------------------------------------------------------------

_DLPACK_DEVICES = {
    1: "CPU",
    2: "CUDA",
    3: "CUDA host",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm host",
    13: "CUDA managed",
    14: "oneAPI",
}


class _Array:
    """A caller's array as a NumPy view of host memory: ``array`` (C-contiguous and aligned
    unless for_out), ``code`` (mtxcomm dtype), ``family`` ("numpy", "torch" or "jax": the type
    results come back in), ``torch_dtype`` (a torch input's dtype), ``copied`` (the input was not
    contiguous: array is a copy)."""

    __slots__ = ("array", "code", "family", "torch_dtype", "copied", "obj")

    def __init__(self, array, code, family, obj, torch_dtype=None):
        self.array, self.code, self.family, self.obj = array, code, family, obj
        self.torch_dtype = torch_dtype
        self.copied = False


def _device_error(what, name, where):
    return ValueError(
        "mtxcomm.%s: %s is on a %s device; the array API takes host (CPU) memory "
        "only (GPU tensors: the torch backend, or TensorFlow's ops): copy it to the host "
        "first (e.g. tensor.cpu(), jax.device_get, cupy.asnumpy)" % (what, name, where)
    )


def _view(x, what, name):
    """An _Array over x's memory (no copy)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise _device_error(what, name, str(x.device))
        if x.layout != torch.strided:
            raise TypeError(
                "mtxcomm.%s: %s is a %s torch tensor; only dense (strided) tensors "
                "are supported" % (what, name, x.layout)
            )
        found = _torch_dtypes(torch).get(x.dtype)
        if found is None:
            raise TypeError(
                "mtxcomm.%s: %s has dtype %s, which mtxcomm does not support; "
                "supported: %s" % (what, name, x.dtype, _SUPPORTED)
            )
        code, as_dtype = found
        t = x.detach()
        if as_dtype is not None:
            t = t.view(as_dtype)
        return _Array(np.from_dlpack(t), code, "torch", x, torch_dtype=x.dtype)
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        platforms = {d.platform for d in x.devices()}
        if platforms != {"cpu"}:
            raise _device_error(what, name, "/".join(sorted(platforms)))
        try:
            a = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError):
            a = np.asarray(x)  # bfloat16: NumPy has no DLPack code for it (ml_dtypes view)
        if a.flags.writeable:
            a = a.view()
            a.flags.writeable = False  # JAX arrays are immutable
        return _Array(a, _dtype_code(a.dtype, what, name), "jax", x)
    if isinstance(x, np.ndarray):
        return _Array(x, _dtype_code(x.dtype, what, name), "numpy", x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device = x.__dlpack_device__()
        kind = int(device[0])
        if kind != 1:
            raise _device_error(
                what, name, "%s (DLPack device %d)" % (_DLPACK_DEVICES.get(kind, "non-CPU"), kind)
            )
        a = np.from_dlpack(x)
        return _Array(a, _dtype_code(a.dtype, what, name), "numpy", x)
    try:
        mv = memoryview(x)
    except TypeError:
        raise TypeError(
            "mtxcomm.%s: %s must be an array: an object with __dlpack__ (a NumPy "
            "array, a PyTorch CPU tensor, a JAX CPU array) or with the buffer "
            "protocol (bytes, bytearray, array.array); got %s" % (what, name, type(x).__name__)
        ) from None
    a = np.asarray(mv)
    return _Array(a, _dtype_code(a.dtype, what, name), "numpy", x)


def _input(x, what):
    """The input x, C-contiguous and aligned (a copy only when it is not)."""
    v = _view(x, what, "x")
    a = v.array
    if not (a.flags.c_contiguous and a.flags.aligned):
        v.array = np.ascontiguousarray(a)
        if not v.array.flags.aligned:
            v.array = v.array.copy()
        v.copied = True
    return v


def _output(out, x, what, shape=None):
    """out as a writable _Array of x's dtype (and of shape, when given); ValueError or TypeError
    naming the problem. Nothing is written before the call runs."""
    if out is None:
        return None
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(out, jax.Array):
        raise ValueError(
            "mtxcomm.%s: out is a JAX array; JAX arrays are immutable, so mtxcomm "
            "never writes them: omit out and use the returned array" % what
        )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor) and out.requires_grad:
        raise ValueError(
            "mtxcomm.%s: out requires grad; writing it in place would bypass "
            "autograd: pass a tensor that does not require grad (or out.detach())" % what
        )
    o = _view(out, what, "out")
    a = o.array
    if not a.flags.writeable:
        raise ValueError(
            "mtxcomm.%s: out is read-only (%s); mtxcomm never writes memory its "
            "producer does not allow writing: pass a writable array, or omit out"
            % (what, type(out).__name__)
        )
    if not (a.flags.c_contiguous and a.flags.aligned):
        raise ValueError(
            "mtxcomm.%s: out must be C-contiguous and aligned (got strides %s); "
            "omit out, or pass a contiguous array" % (what, a.strides)
        )
    if o.code != x.code:
        raise TypeError(
            "mtxcomm.%s: out has dtype %s but x has dtype %s"
            % (what, _shown_dtype(o), _shown_dtype(x))
        )
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(
            "mtxcomm.%s: out has shape %s but the result has shape %s"
            % (what, tuple(a.shape), tuple(shape))
        )
    return o


def _shown_dtype(v):
    return str(v.torch_dtype) if v.torch_dtype is not None else str(v.array.dtype)


def _span(a):
    start = a.__array_interface__["data"][0]
    return start, start + a.nbytes


def _check_overlap(x, o, what, in_place_ok):
    """in place (out is x's memory, exactly) where allowed; any other overlap is an error."""
    if o is None or x.array.nbytes == 0 or o.array.nbytes == 0:
        return
    xs, os_ = _span(x.array), _span(o.array)
    if xs[0] >= os_[1] or os_[0] >= xs[1]:
        return
    if in_place_ok and xs == os_:
        return
    raise ValueError(
        "mtxcomm.%s: out overlaps x%s; pass a separate out%s"
        % (
            what,
            "" if not in_place_ok else " without being exactly x's memory",
            "" if not in_place_ok else ", or out=x for in place",
        )
    )


def _framework(name):
    """A framework's module, which the caller's array already loaded (this module imports no
    framework of its own: tools/check_layers.py)."""
    return sys.modules[name]


def _wrap(v, array):
    """The result array (NumPy, over memory the engine filled) in v's family."""
    if v.family == "torch":
        t = _framework("torch").from_dlpack(array)
        return t.view(v.torch_dtype) if t.dtype != v.torch_dtype else t
    if v.family == "jax":
        jnp = _framework("jax.numpy")
        try:
            return jnp.from_dlpack(array)
        except (BufferError, TypeError, RuntimeError, ValueError):
            return jnp.asarray(array)  # bfloat16 (no DLPack code in NumPy): a copy
    return array


def _wrap_splits(v, received):
    a = np.asarray(received, dtype=np.int32)
    if v.family == "torch":
        return _framework("torch").from_numpy(a)
    if v.family == "jax":
        return _framework("jax.numpy").asarray(a)
    return a
