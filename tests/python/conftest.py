"""Shared setup of the mtxcomm TensorFlow tests.

The suite is run once per rank count, every rank running the same tests in the same order:
    mpirun -np N python -m pytest -q -p no:cacheprovider tests/python/test_ops.py
Each test computes its expected values from hvd.rank()/hvd.size() and checks them on every
rank. Collectives come first in a test and asserts after them, so that a failing assert on one
rank does not leave the other ranks waiting in a collective of the same test.

test_transparent.py is different: it runs in one plain process and launches mtxrun jobs.
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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line per rank, so that the interleaved output of an mpirun session says who failed."""
    counts = {k: len(terminalreporter.stats.get(k, [])) for k in ("passed", "failed", "error", "skipped")}
    failed = [r.nodeid for r in terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])]
    terminalreporter.write_line(
        f"[rank {launched_rank()} of {launched_size()}] "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + (": " + " ".join(failed) if failed else "")
    )
