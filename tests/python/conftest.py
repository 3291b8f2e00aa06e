"""Shared setup of the mtxcomm TensorFlow tests.

The suite is run once per rank count, every rank running the same tests in the same order:
    mpirun -np N python -m pytest -q -p no:cacheprovider tests/python/test_ops.py
Each test computes its expected values from hvd.rank()/hvd.size() and checks them on every
rank. Collectives come first in a test and asserts after them, so that a failing assert on one
rank does not leave the other ranks waiting in a collective of the same test.

test_transparent*.py are different: they run in one plain process and launch mtxrun jobs.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Whether is_initialized() was False before init() (recorded by the hvd fixture).
STATE = {}


def _import(module):
    try:
        return __import__(module, fromlist=["_"])
    except Exception as e:  # the binding is not built/installed: fail, never skip
        pytest.fail(
            f"cannot import {module}: {type(e).__name__}: {e}\n"
            f"(python: {sys.executable}; install the package into this environment)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def hvd():
    """mtxcomm.tensorflow, initialized once per session; shut down (and checked) at the end."""
    mod = _import("mtxcomm.tensorflow")
    STATE["initialized_before_init"] = mod.is_initialized()
    mod.init()
    yield mod
    mod.shutdown()
    assert not mod.is_initialized(), "is_initialized() is still True after shutdown()"


@pytest.fixture(scope="session")
def hvdk(hvd):
    """mtxcomm.tensorflow.keras (the same engine, initialized by the hvd fixture)."""
    mod = _import("mtxcomm.tensorflow.keras")
    mod.init()  # Horovod scripts call init() on the keras module too; it must be idempotent
    return mod


@pytest.fixture(scope="session")
def mc():
    """mtxcomm's array API, initialised once per session; shut down at the end."""
    import mtxcomm

    assert not mtxcomm.is_initialized()
    mtxcomm.init()
    mtxcomm.init()  # a second init is a no-op
    yield mtxcomm
    mtxcomm.shutdown()
    assert not mtxcomm.is_initialized()


@pytest.fixture(scope="session")
def core(mc):
    from mtxcomm import _core

    return _core


# The jobs of test_transparent*.py write into one folder per test module.
@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("transparent")


def launched_size():
    """Ranks as the launcher sees them (1 without mpirun)."""
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def launched_rank():
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def rank_values(shape, dtype, rank, offset=0):
    """A deterministic array of SHAPE for RANK: small values exact in every dtype tested."""
    n = int(np.prod(shape)) if len(shape) else 1
    base = (np.arange(n) % 7) - 3 + (rank % 3) + offset  # in [-3, 5 + offset]
    if np.dtype(dtype).kind == "u":
        base = np.abs(base)
    return base.reshape(shape).astype(dtype)


def values(shape, dtype, rank, offset=0):
    """Rank's deterministic array (small values, exact in every dtype)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rank_values(shape, np.int64, rank, offset) > 0
    return rank_values(shape, dtype, rank, offset)  # non-negative for unsigned dtypes


def trunc_div(s, n):
    return np.sign(s) * (np.abs(s) // n)


def expected_reduce(arrays, op, dtype):
    """The reduction the library specifies: integers exact (avg truncating toward zero), 16-bit
    floats accumulated in float32 and rounded once, bool logical."""
    dtype = np.dtype(dtype)
    n = len(arrays)
    if dtype == np.bool_:
        stack = np.stack([np.asarray(a, dtype=bool) for a in arrays])
        return (stack.any(0) if op in ("sum", "max") else stack.all(0)).astype(bool)
    if dtype.kind in "iu":
        stack = np.stack([np.asarray(a).astype(np.int64) for a in arrays])
        r = {
            "sum": lambda: stack.sum(0),
            "avg": lambda: trunc_div(stack.sum(0), n),
            "min": lambda: stack.min(0),
            "max": lambda: stack.max(0),
            "prod": lambda: stack.prod(0),
        }[op]()
        return np.asarray(r).astype(dtype)
    acc = np.float32 if dtype.itemsize == 2 else dtype.type
    stack = np.stack([np.asarray(a).astype(acc) for a in arrays])
    r = {
        "sum": lambda: stack.sum(0),
        "avg": lambda: stack.sum(0) / acc(n),
        "min": lambda: stack.min(0),
        "max": lambda: stack.max(0),
        "prod": lambda: stack.prod(0),
    }[op]()
    return np.asarray(r).astype(dtype)


def assert_same(got, want, op="sum"):
    got = np.asarray(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if op == "avg" and want.dtype.kind not in "iub":
        tol = {2: 1e-2, 4: 1e-6, 8: 1e-14}[want.dtype.itemsize]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol)
    else:
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line per rank, so that the interleaved output of an mpirun session says who failed."""
    counts = {
        k: len(terminalreporter.stats.get(k, [])) for k in ("passed", "failed", "error", "skipped")
    }
    failed = [
        r.nodeid
        for r in terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    ]
    terminalreporter.write_line(
        f"[rank {launched_rank()} of {launched_size()}] "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + (": " + " ".join(failed) if failed else "")
    )


@pytest.fixture(scope="session")
def torch_group():
    """The default process group over the "mtxcomm" backend, made once per session for the torch
    test files (test_torch.py, test_torch_hvd.py) and destroyed at its end."""
    import datetime

    import torch.distributed as dist

    import mtxcomm.torch  # noqa: F401  (registers the backend)

    assert "mtxcomm" in dist.Backend.backend_list
    dist.init_process_group("mtxcomm", timeout=datetime.timedelta(seconds=120))
    yield dist.group.WORLD
    dist.destroy_process_group()
