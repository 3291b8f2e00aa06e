"""What the array API's tests (test_arrays*.py) share: the ranks, the optional frameworks
(imported before init(), see below), the dtypes and ops tested, small helpers."""

import numpy as np
import pytest
from conftest import launched_rank, launched_size

SIZE = launched_size()
RANK = launched_rank()


MISSING = {}  # module -> why it is not importable (the skip reasons say it)


def _optional(module):
    """The module, or None (the tests that need it are skipped, naming the import error)."""
    try:
        return __import__(module, fromlist=["_"])
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        MISSING[module] = "%s is not importable (%s: %s)" % (module, type(e).__name__, e)
        return None


# Imported before init(), so that no rank lags behind the others inside a collective.
ml_dtypes = _optional("ml_dtypes")
torch = _optional("torch")
jax = _optional("jax")

BF16 = ml_dtypes.bfloat16 if ml_dtypes is not None else None
DTYPES = [
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    "bfloat16",
    np.float32,
    np.float64,
    np.bool_,
]
DTYPE_IDS = [np.dtype(d).name if d != "bfloat16" else d for d in DTYPES]
OPS = ["sum", "avg", "min", "max", "prod"]
needs_torch = pytest.mark.skipif(torch is None, reason=MISSING.get("torch", ""))
needs_jax = pytest.mark.skipif(jax is None, reason=MISSING.get("jax", ""))
multi_rank = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks")


def np_dtype(d):
    if d == "bfloat16":
        if BF16 is None:
            pytest.skip(MISSING["ml_dtypes"] + ": no NumPy bfloat16")
        return np.dtype(BF16)
    return np.dtype(d)


def address(a):
    return np.asarray(a).__array_interface__["data"][0]


def rows_of(d0, n, r):
    return d0 // n + (1 if r < d0 % n else 0)


def a2a_splits(r, n):
    """Rows rank r sends to each rank: (r + j) % 3, and one more to itself."""
    return [(r + j) % 3 + (1 if j == r else 0) for j in range(n)]


def a2a_input(r, n, dt):
    """Rank r's rows: row i holds 10*r + i (so each row says where it came from)."""
    d0 = sum(a2a_splits(r, n))
    rows = (10 * r + np.arange(d0))[:, None] + np.zeros((1, 2), np.int64)
    return (rows % 100 > 0) if np.dtype(dt) == np.bool_ else rows.astype(dt)


def a2a_expected(me, n, dt):
    parts = []
    for j in range(n):
        s = a2a_splits(j, n)
        start = sum(s[:me])
        parts.append(a2a_input(j, n, dt)[start : start + s[me]])
    return np.concatenate(parts), [a2a_splits(j, n)[me] for j in range(n)]
