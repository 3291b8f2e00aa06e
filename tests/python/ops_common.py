"""What the tests of mtxcomm.tensorflow's ops (test_ops*.py) share: the dtypes, shapes and ops
tested and the expected reductions."""

import numpy as np
import tensorflow as tf
from conftest import launched_size

SIZE = launched_size()

# dtypes every op must handle; uint32/uint64 are tested separately (TF has fewer kernels).
DTYPES = [
    tf.int8,
    tf.uint8,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
]
SHAPES = {"scalar": (), "1d": (5,), "3d": (2, 3, 4), "empty": (0,), "empty2d": (0, 3)}
OPS = ["Sum", "Average", "Min", "Max", "Product"]


def npt(dtype):
    """The NumPy type of a tf.DType (ml_dtypes.bfloat16 for bfloat16)."""
    return dtype.as_numpy_dtype


def is_float(dtype):
    return dtype.is_floating


def wide(a):
    """Values of A in float64 (exact for every value these tests use)."""
    return np.asarray(a).astype(np.float64)


def trunc_div(s, n):
    """Integer division truncating toward zero (C semantics), elementwise on int64."""
    s = np.asarray(s, dtype=np.int64)
    return np.sign(s) * (np.abs(s) // n)


def expected_reduce(arrays, op, dtype):
    """Reduction of the per-rank ARRAYS as the binding specifies it, in DTYPE.

    Integers reduce exactly (int64) and Average truncates toward zero; float16/bfloat16
    accumulate in float32 and are rounded once to their type; float32/float64 exactly here
    (the inputs are small integers), so only Average's division can differ by an ulp.
    """
    n = len(arrays)
    if dtype.is_integer:
        stack = np.stack([np.asarray(a).astype(np.int64) for a in arrays])
        if op == "Sum":
            r = stack.sum(0)
        elif op == "Average":
            r = trunc_div(stack.sum(0), n)
        elif op == "Min":
            r = stack.min(0)
        elif op == "Max":
            r = stack.max(0)
        else:
            r = stack.prod(0)
        return r.astype(npt(dtype))
    acc = np.float32 if dtype in (tf.float16, tf.bfloat16) else np.float64
    stack = np.stack([np.asarray(a).astype(acc) for a in arrays])
    if op == "Sum":
        r = stack.sum(0)
    elif op == "Average":
        r = stack.sum(0) / acc(n)
    elif op == "Min":
        r = stack.min(0)
    elif op == "Max":
        r = stack.max(0)
    else:
        r = stack.prod(0)
    return r.astype(npt(dtype))


def assert_reduced(got, want, dtype, op):
    got = tf.convert_to_tensor(got)
    assert got.dtype == dtype, f"result dtype {got.dtype.name}, want {dtype.name}"
    assert tuple(got.shape) == want.shape, f"result shape {tuple(got.shape)}, want {want.shape}"
    g = got.numpy()
    if dtype.is_integer or op != "Average":
        # exact: integers, and Sum/Min/Max/Product of small integral floats
        np.testing.assert_array_equal(wide(g), wide(want))
    else:
        rtol = {tf.float16: 1e-3, tf.bfloat16: 8e-3, tf.float32: 1e-6, tf.float64: 1e-12}[dtype]
        np.testing.assert_allclose(wide(g), wide(want), rtol=rtol, atol=0)


def op_const(hvd, op):
    return getattr(hvd, op)


def scatter_rows(dim0, size):
    """Rows of each rank: the first dim0 % size ranks get one more."""
    return [dim0 // size + (1 if k < dim0 % size else 0) for k in range(size)]
