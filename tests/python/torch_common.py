"""What the torch test files share (test_torch.py: the "mtxcomm" torch.distributed backend;
test_torch_hvd.py: the Horovod-style mtxcomm.torch): the job's size and this rank, the dtypes and
ops under test, and the closed-form values the results are checked against."""

import os

import numpy as np
import pytest
from conftest import assert_same, expected_reduce, values

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed (scripts/setup_python.sh "
    "installs it; --no-torch leaves it out)",
)
import torch.distributed as dist  # noqa: E402

SIZE = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))
multi_rank = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks")

DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]
IDS = [str(d).replace("torch.", "") for d in DTYPES]
OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "prod": dist.ReduceOp.PRODUCT,
}
NP = {torch.bfloat16: np.float32, torch.bool: np.bool_}


def backend():
    """The default group's mtxcomm backend object itself (its Works are mtxcomm's)."""
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def np_dtype(dt):
    if dt in NP:
        return NP[dt]
    return torch.empty(0, dtype=dt).numpy().dtype


def tensor_of(shape, dt, rank, offset=0):
    """Rank's deterministic tensor (small values, exact in every dtype)."""
    a = values(shape, np_dtype(dt), rank, offset)
    return torch.from_numpy(np.array(a, copy=True)).to(dt)


def as_np(t):
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def want_reduce(shape, dt, op, offset=0):
    arrays = [values(shape, np_dtype(dt), r, offset) for r in range(SIZE)]
    if dt == torch.bfloat16:
        # bfloat16: accumulated in float32 and rounded once, as float16 (conftest).
        got = expected_reduce(arrays, op, np.float32)
        return torch.from_numpy(got).to(torch.bfloat16).float().numpy()
    return expected_reduce(arrays, op, np_dtype(dt))


def check(got, want, op, dt):
    g = as_np(got)
    if dt == torch.bfloat16:
        w = np.asarray(want, dtype=np.float32)
        if op == "avg":
            np.testing.assert_allclose(g, w, rtol=1e-2)
        else:
            np.testing.assert_array_equal(g, w)
        return
    assert_same(g, np.asarray(want), op)
