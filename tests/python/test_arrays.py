"""The framework-neutral array API (mtxcomm.allreduce and the others) against NumPy, on every
rank: every op and dtype, out= and in place, read-only refusal, alltoall splits, errors,
zero copy; PyTorch CPU tensors when torch is importable, JAX CPU arrays when jax is; one engine
shared with mtxcomm.tensorflow when TensorFlow is importable.

Run with 1, 2 and 3 ranks (tests/python/run_suite.sh):
    mpirun -np 3 --oversubscribe python -m pytest -q -p no:cacheprovider tests/python/test_arrays.py
Every rank runs every test in the same order; a test's collectives come before its asserts.
"""

import array
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import assert_same, expected_reduce, launched_rank, launched_size, rank_values, values

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
if jax is not None:
    import jax.numpy as jnp

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


# ---- process facts ---------------------------------------------------------------------------


def test_process_facts(mc):
    assert mc.is_initialized()
    assert (mc.rank(), mc.size()) == (RANK, SIZE)
    assert 0 <= mc.local_rank() < mc.local_size() <= SIZE
    mc.barrier()


def test_the_package_loads_the_array_module_only_when_used():
    code = (
        "import sys, mtxcomm, mtxcomm.run; "
        "print('mtxcomm._core' in sys.modules, 'mtxcomm._arrays' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX", "PRTE"))}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


# ---- allreduce -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_allreduce_every_op_and_dtype(mc, dtype, op):
    dt = np_dtype(dtype)
    if dt == np.bool_ and op == "avg":
        with pytest.raises(
            mc.InvalidArgumentError, match="op avg is not defined for datatype bool"
        ):
            mc.allreduce(values((3,), dt, RANK), op=op)  # refused on every rank
        return
    shape = (2, 3, 4)
    got = mc.allreduce(values(shape, dt, RANK), op=op)
    want = expected_reduce([values(shape, dt, k) for k in range(SIZE)], op, dt)
    assert isinstance(got, np.ndarray)
    assert_same(got, want, op)


@pytest.mark.parametrize(
    "shape",
    [(), (1,), (0,), (0, 3), (7, 1, 5), (1001,)],
    ids=["scalar", "1", "empty", "empty2d", "3d", "1001"],
)
def test_allreduce_shapes(mc, shape):
    got = mc.allreduce(values(shape, np.float32, RANK), op="sum")
    want = expected_reduce([values(shape, np.float32, k) for k in range(SIZE)], "sum", np.float32)
    assert_same(got, want)


def adasum_pair(a, b):
    """include/mtxcomm/mtxcomm.h: adasum(a, b), in float64."""
    dot, na, nb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * na) if na > 0 else 1.0
    cb = 1 - dot / (2 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def adasum_tree(arrays, dtype):
    """The header's tree over len(arrays) ranks, each level rounded to dtype."""
    cur = [np.asarray(a).astype(np.float64).reshape(-1) for a in arrays]
    n = len(cur)
    q = 1 << (n.bit_length() - 1)

    def rnd(v):
        return v.astype(dtype).astype(np.float64)

    for r in range(q, n):
        cur[r - q] = rnd(adasum_pair(cur[r - q], cur[r]))
    d = 1
    while d < q:
        cur = [rnd(adasum_pair(cur[min(r, r ^ d)], cur[max(r, r ^ d)])) for r in range(q)] + cur[q:]
        d *= 2
    return cur[0].astype(dtype).reshape(np.asarray(arrays[0]).shape)


@pytest.mark.parametrize(
    "dtype",
    [np.float16, "bfloat16", np.float32, np.float64],
    ids=["float16", "bfloat16", "float32", "float64"],
)
def test_allreduce_adasum(mc, dtype):
    dt = np_dtype(dtype)
    x = (values((3, 5), np.float64, RANK) * (RANK + 1) + 0.25 * RANK).astype(dt)
    got = mc.allreduce(x, op="adasum")
    same = mc.allreduce(values((4,), dt, 1), op=mc.ADASUM)  # equal vectors give the vector
    one_hot = mc.allreduce(np.eye(SIZE, dtype=dt)[RANK], op="adasum")  # orthogonal ones add
    want = adasum_tree(
        [(values((3, 5), np.float64, k) * (k + 1) + 0.25 * k).astype(dt) for k in range(SIZE)], dt
    )
    tol = {2: 2e-2, 4: 1e-5, 8: 1e-12}[dt.itemsize]
    assert got.dtype == dt and got.shape == (3, 5)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    assert_same(same, values((4,), dt, 1))
    assert_same(one_hot, np.ones(SIZE, dt))


def test_adasum_is_refused_for_integers_and_reduce_scatter_on_every_rank(mc):
    with pytest.raises(
        mc.InvalidArgumentError, match="op adasum is not defined for datatype int32"
    ):
        mc.allreduce(values((3,), np.int32, RANK), op="adasum")
    with pytest.raises(ValueError, match="adasum"):
        mc.reduce_scatter(values((SIZE, 2), np.float32, RANK), op="adasum")
    after = mc.allreduce(np.ones(1, np.float32))  # the engine goes on
    np.testing.assert_array_equal(after, [float(SIZE)])


def test_allreduce_op_spellings(mc):
    x = values((4,), np.int32, RANK)
    results = [
        mc.allreduce(x, op=op)
        for op in (mc.SUM, mc.ReduceOp.MAX, "MIN", "Prod", 4, np.int64(2), "average")
    ]
    arrays = [values((4,), np.int32, k) for k in range(SIZE)]
    for got, op in zip(results, ["sum", "max", "min", "prod", "avg", "min", "avg"]):
        assert_same(got, expected_reduce(arrays, op, np.int32), op)
    with pytest.raises(ValueError, match="unknown op 'mean'"):
        mc.allreduce(x, op="mean")
    with pytest.raises(ValueError, match="unknown op 9"):
        mc.allreduce(x, op=9)
    with pytest.raises(TypeError, match="op must be"):
        mc.allreduce(x, op=1.5)


def test_allreduce_out_is_written_and_returned_zero_copy(mc, core):
    x = values((5, 3), np.float64, RANK)
    out = np.full((5, 3), -1.0)
    got = mc.allreduce(x, op="max", out=out)
    engine_in, engine_out = core.last_buffers()
    assert got is out
    assert np.shares_memory(got, out)
    assert (engine_in, engine_out) == (address(x), address(out))
    assert_same(
        out,
        expected_reduce([values((5, 3), np.float64, k) for k in range(SIZE)], "max", np.float64),
    )
    np.testing.assert_array_equal(x, values((5, 3), np.float64, RANK))  # x not written


def test_allreduce_in_place(mc, core):
    x = values((6,), np.int64, RANK)
    got = mc.allreduce(x, out=x)
    engine_in, engine_out = core.last_buffers()
    assert got is x
    assert engine_in == engine_out == address(x)
    assert_same(
        x, expected_reduce([values((6,), np.int64, k) for k in range(SIZE)], "sum", np.int64)
    )
    # A view of the same memory is in place too.
    y = values((2, 3), np.float32, RANK)
    mc.allreduce(y, op="sum", out=y.reshape(6).reshape(2, 3))
    assert_same(
        y, expected_reduce([values((2, 3), np.float32, k) for k in range(SIZE)], "sum", np.float32)
    )


def test_the_input_is_not_copied_and_the_result_is_the_engines_memory(mc, core):
    x = values((1 << 16,), np.float32, RANK)
    got = mc.allreduce(x)
    engine_in, engine_out = core.last_buffers()
    assert engine_in == address(x)
    assert engine_out == address(got)
    assert address(got) % 64 == 0
    assert got.base is not None  # a view over the buffer the engine filled, not a copy of it


def test_a_non_contiguous_input_is_copied_first(mc, core):
    base = values((4, 6), np.float32, RANK)
    x = base[:, ::2]  # strided
    t = base.T  # Fortran order
    got = mc.allreduce(x)
    engine_in, _ = core.last_buffers()
    got_t = mc.allreduce(t)
    want = expected_reduce(
        [values((4, 6), np.float32, k)[:, ::2] for k in range(SIZE)], "sum", np.float32
    )
    want_t = expected_reduce(
        [values((4, 6), np.float32, k).T for k in range(SIZE)], "sum", np.float32
    )
    assert engine_in != address(base)
    assert_same(got, want)
    assert_same(got_t, want_t)
    np.testing.assert_array_equal(base, values((4, 6), np.float32, RANK))


def test_read_only_memory_is_never_written(mc):
    x = values((4,), np.float32, RANK)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        mc.allreduce(x, out=ro)
    xr = values((4,), np.float32, RANK)
    xr.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        mc.allreduce(xr, out=xr)  # in place on a read-only array
    with pytest.raises(ValueError, match="out is read-only"):
        mc.broadcast(xr, out=xr)
    with pytest.raises(ValueError, match="read-only"):
        mc.allreduce(b"\x01\x02\x03\x04", out=b"\x00\x00\x00\x00")
    np.testing.assert_array_equal(ro, 0)
    np.testing.assert_array_equal(xr, values((4,), np.float32, RANK))
    # A read-only input is fine (it is only read).
    got = mc.allreduce(xr)
    assert_same(
        got, expected_reduce([values((4,), np.float32, k) for k in range(SIZE)], "sum", np.float32)
    )


def test_bad_out_arguments_are_refused_before_anything_is_sent(mc):
    x = values((4, 2), np.float32, RANK)
    with pytest.raises(TypeError, match="out has dtype float64 but x has dtype float32"):
        mc.allreduce(x, out=np.zeros((4, 2), np.float64))
    with pytest.raises(ValueError, match=r"out has shape \(8,\) but the result has shape"):
        mc.allreduce(x, out=np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        mc.allreduce(x, out=np.zeros((4, 4), np.float32)[:, ::2])
    big = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="overlaps x"):
        mc.allreduce(big[:8].reshape(4, 2), out=big[4:12].reshape(4, 2))
    with pytest.raises(ValueError, match="overlaps x"):
        mc.allgather(big[:8].reshape(4, 2), out=big[:8].reshape(4, 2))  # no in place
    # Still in step: a collective after the refusals works.
    got = mc.allreduce(x)
    assert_same(
        got,
        expected_reduce([values((4, 2), np.float32, k) for k in range(SIZE)], "sum", np.float32),
    )


# ---- broadcast -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_broadcast_from_every_root(mc, dtype):
    dt = np_dtype(dtype)
    got = [mc.broadcast(values((3, 2), dt, RANK), root=r) for r in range(SIZE)]
    for r in range(SIZE):
        assert_same(got[r], values((3, 2), dt, r))


def test_broadcast_in_place_and_out(mc):
    x = values((5,), np.int16, RANK)
    got = mc.broadcast(x, root=SIZE - 1, out=x)
    out = np.zeros((2, 2), np.float16)
    got2 = mc.broadcast(values((2, 2), np.float16, RANK), root=0, out=out)
    assert got is x
    assert_same(x, values((5,), np.int16, SIZE - 1))
    assert got2 is out
    assert_same(out, values((2, 2), np.float16, 0))


def test_broadcast_root_out_of_range_fails_on_every_rank(mc):
    with pytest.raises(ValueError, match="root_rank %d is not in" % SIZE) as e:
        mc.broadcast(values((2,), np.float32, RANK), root=SIZE)
    assert isinstance(e.value, mc.InvalidArgumentError)
    assert isinstance(e.value, mc.Error)
    assert e.value.code == 1 and e.value.code_name == "MTXCOMM_INVALID_ARGUMENT"
    got = mc.broadcast(values((2,), np.float32, RANK), root=np.int32(SIZE - 1))
    assert_same(got, values((2,), np.float32, SIZE - 1))
    with pytest.raises(TypeError, match="root must be an int"):
        mc.broadcast(values((2,), np.float32, RANK), root="0")


# ---- allgather -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_allgather_uneven_rows(mc, dtype):
    dt = np_dtype(dtype)
    got = mc.allgather(values((RANK + 1, 3), dt, RANK))
    # Rank 0 contributes no rows.
    got0 = mc.allgather(values((RANK, 2), dt, RANK, offset=1))
    want = np.concatenate([values((k + 1, 3), dt, k) for k in range(SIZE)])
    want0 = np.concatenate([values((k, 2), dt, k, offset=1) for k in range(SIZE)])
    assert_same(got, want)
    assert_same(got0, want0)


def test_allgather_out_and_a_wrong_dim0(mc):
    total = sum(k + 1 for k in range(SIZE))
    out = np.zeros((total, 2), np.int32)
    got = mc.allgather(values((RANK + 1, 2), np.int32, RANK), out=out)
    wrong = np.full((total + 1, 2), 7, np.int32)
    with pytest.raises(
        ValueError,
        match=r"out has shape \(%d, 2\) but the result has shape "
        r"\(%d, 2\)" % (total + 1, total),
    ):
        mc.allgather(values((RANK + 1, 2), np.int32, RANK), out=wrong)
    with pytest.raises(ValueError, match="out has shape"):
        mc.allgather(values((RANK + 1, 2), np.int32, RANK), out=np.zeros((total, 3), np.int32))
    after = mc.allgather(values((1,), np.int32, RANK))  # the ranks are still in step
    assert got is out
    assert_same(out, np.concatenate([values((k + 1, 2), np.int32, k) for k in range(SIZE)]))
    np.testing.assert_array_equal(wrong, 7)
    assert_same(after, np.concatenate([values((1,), np.int32, k) for k in range(SIZE)]))


def test_allgather_of_a_scalar_fails_on_every_rank(mc):
    with pytest.raises(mc.InvalidArgumentError, match="at least one dimension"):
        mc.allgather(np.float32(RANK))


# ---- reduce_scatter --------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reduce_scatter_every_op_and_dtype(mc, dtype, op):
    dt = np_dtype(dtype)
    d0 = 2 * SIZE + 1  # not divisible: the first d0 % size ranks get one more row
    if dt == np.bool_ and op == "avg":
        with pytest.raises(
            mc.InvalidArgumentError, match="op avg is not defined for datatype bool"
        ):
            mc.reduce_scatter(values((d0, 2), dt, RANK), op=op)
        return
    got = mc.reduce_scatter(values((d0, 2), dt, RANK), op=op)
    full = expected_reduce([values((d0, 2), dt, k) for k in range(SIZE)], op, dt)
    start = sum(rows_of(d0, SIZE, r) for r in range(RANK))
    assert_same(got, full[start : start + rows_of(d0, SIZE, RANK)], op)


def test_reduce_scatter_fewer_rows_than_ranks_and_out(mc):
    d0 = max(SIZE - 1, 1)
    got = mc.reduce_scatter(values((d0, 3), np.float32, RANK))
    mine = rows_of(4 * SIZE, SIZE, RANK)
    out = np.zeros((mine, 2), np.int64)
    got2 = mc.reduce_scatter(values((4 * SIZE, 2), np.int64, RANK), op="max", out=out)
    full = expected_reduce([values((d0, 3), np.float32, k) for k in range(SIZE)], "sum", np.float32)
    start = sum(rows_of(d0, SIZE, r) for r in range(RANK))
    assert_same(got, full[start : start + rows_of(d0, SIZE, RANK)])
    assert got2 is out
    full2 = expected_reduce(
        [values((4 * SIZE, 2), np.int64, k) for k in range(SIZE)], "max", np.int64
    )
    assert_same(out, full2[RANK * mine : (RANK + 1) * mine], "max")
    with pytest.raises(
        ValueError,
        match=r"out has shape \(1, 2\) but the result has shape "
        r"\(4, 2\)",
    ):
        mc.reduce_scatter(values((4 * SIZE, 2), np.int64, RANK), out=np.zeros((1, 2), np.int64))


# ---- alltoall --------------------------------------------------------------------------------


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


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_alltoall_with_splits(mc, dtype):
    dt = np_dtype(dtype)
    got, received = mc.alltoall(a2a_input(RANK, SIZE, dt), splits=a2a_splits(RANK, SIZE))
    want, want_received = a2a_expected(RANK, SIZE, dt)
    assert_same(got, want)
    assert isinstance(received, np.ndarray) and received.dtype == np.int32
    assert received.tolist() == want_received


def test_alltoall_even_split_and_numpy_splits(mc):
    x = values((2 * SIZE, 3), np.float64, RANK)
    got = mc.alltoall(x)  # no splits: only the result
    got2, received = mc.alltoall(x, splits=np.full(SIZE, 2, np.int64))
    want = np.concatenate(
        [values((2 * SIZE, 3), np.float64, k)[2 * RANK : 2 * RANK + 2] for k in range(SIZE)]
    )
    assert isinstance(got, np.ndarray)
    assert_same(got, want)
    assert_same(got2, want)
    assert received.tolist() == [2] * SIZE


def test_alltoall_bad_splits_fail_on_every_rank_naming_the_rank(mc):
    x = values((SIZE + 1, 2), np.float32, RANK)
    splits = [1] * SIZE  # summing to SIZE, not SIZE + 1 ...
    if RANK == 0 and SIZE > 1:
        splits[0] = 2  # ... but on rank 0 at np > 1
    bad = 1 if SIZE > 1 else 0
    with pytest.raises(
        ValueError,
        match="rank %d passed splits summing to %d, but its "
        "dimension 0 is %d" % (bad, SIZE, SIZE + 1),
    ):
        mc.alltoall(x, splits=splits)
    with pytest.raises(TypeError, match="splits must be a 1-d sequence of ints"):
        mc.alltoall(x, splits=[0.5] * SIZE)
    after = mc.allreduce(np.ones(2, np.float32))
    np.testing.assert_array_equal(after, np.full(2, SIZE, np.float32))


# ---- barrier ---------------------------------------------------------------------------------


def test_barrier(mc):
    for _ in range(3):
        mc.barrier()


# ---- the GIL ---------------------------------------------------------------------------------


@multi_rank
def test_the_gil_is_released_while_a_call_waits(mc):
    import threading
    import time

    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.005)

    if RANK == 1:
        time.sleep(0.5)  # rank 0 waits in the allreduce meanwhile
    t = threading.Thread(target=tick)
    start = len(ticks)
    t.start()
    got = mc.allreduce(np.ones(2, np.float32))
    stop.set()
    t.join()
    assert got.tolist() == [float(SIZE)] * 2
    if RANK == 0:
        assert len(ticks) - start >= 10, "another thread could not run while rank 0 waited"


# ---- buffer protocol -------------------------------------------------------------------------


def test_buffer_protocol_inputs_give_numpy_results(mc):
    raw = bytes([RANK, 1, 2, 3])
    got = mc.allreduce(raw, op="max")
    floats = mc.allreduce(array.array("f", [1.0, float(RANK)]))
    out = bytearray(4)
    got_out = mc.broadcast(memoryview(bytes([9, RANK, 7, 6])), root=0, out=out)
    assert isinstance(got, np.ndarray) and got.dtype == np.uint8
    assert got.tolist() == [SIZE - 1, 1, 2, 3]
    assert floats.dtype == np.float32
    assert floats.tolist() == [float(SIZE), float(sum(range(SIZE)))]
    assert got_out is out and list(out) == [9, 0, 7, 6]


# ---- errors ----------------------------------------------------------------------------------


def test_unsupported_dtypes_and_objects_are_type_errors(mc):
    with pytest.raises(TypeError, match="dtype complex64"):
        mc.allreduce(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="dtype >f4 \\(non-native byte order\\)"):
        mc.allreduce(np.zeros(3, ">f4"))
    with pytest.raises(TypeError, match="dtype <U1"):
        mc.allreduce(np.array(["a"]))
    with pytest.raises(TypeError, match="must be an array.*got list"):
        mc.allreduce([1.0, 2.0])
    if ml_dtypes is not None:
        with pytest.raises(TypeError, match="float8_e4m3fn"):
            mc.allreduce(np.zeros(3, ml_dtypes.float8_e4m3fn))


class _FakeDeviceArray:
    """A DLPack producer on a CUDA device (what CuPy reports)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("must not be read")

    def __dlpack_device__(self):
        return (2, 0)


def test_a_device_array_is_refused(mc):
    with pytest.raises(ValueError, match="CUDA .*host \\(CPU\\) memory only"):
        mc.allreduce(_FakeDeviceArray())


@multi_rank
def test_ranks_that_disagree_get_an_error_naming_both_and_the_next_call_works(mc):
    with pytest.raises(mc.InvalidUsageError, match="disagree on the shapes") as shapes:
        mc.allreduce(np.zeros(RANK + 1, np.float32))
    with pytest.raises(mc.InvalidUsageError, match="disagree on the collective") as kinds:
        if RANK == 0:
            mc.allreduce(np.zeros(2, np.float32))
        else:
            mc.broadcast(np.zeros(2, np.float32), root=0)
    with pytest.raises(RuntimeError, match="disagree on the dtypes"):
        mc.allreduce(np.zeros(2, np.float32 if RANK == 0 else np.float64))
    after = mc.allreduce(np.ones(3, np.int32))
    message = str(shapes.value)
    assert "rank 0 has allreduce(sum) of float32[1]" in message, message
    assert "rank 1 has allreduce(sum) of float32[2]" in message, message
    assert "array call #" in message, message
    assert shapes.value.code == 2 and isinstance(shapes.value, RuntimeError)
    assert "broadcast(root 0)" in str(kinds.value)
    np.testing.assert_array_equal(after, np.full(3, SIZE, np.int32))


@multi_rank
def test_a_broadcast_where_every_rank_names_itself_root_fails_on_every_rank(mc):
    # The C API's broadcast over shared memory returns before its peers enter it and finds
    # such a disagreement at the next call or at destroy; through the array API the engine
    # compares the roots before any byte moves, so the call itself fails, on every rank, and
    # no rank's array is written.
    x = np.full(5, RANK + 1, np.float32)
    with pytest.raises(mc.InvalidUsageError, match="disagree on the root") as e:
        mc.broadcast(x, root=RANK, out=x)
    for r in range(SIZE):
        assert "rank %d has broadcast(root %d)" % (r, r) in str(e.value), str(e.value)
    np.testing.assert_array_equal(x, np.full(5, RANK + 1, np.float32))
    np.testing.assert_array_equal(mc.broadcast(x, root=0), np.ones(5, np.float32))


def test_an_error_at_shutdown_is_raised_and_fails_the_exit():
    """What the engine's destroy returns (a check an earlier call left pending that finds the
    ranks disagreeing) is raised by shutdown(); at exit, where Python would print an exception
    and exit with 0, it is written to standard error and the exit status is 1."""
    if RANK != 0 or SIZE != 1:
        pytest.skip("runs once, in the np=1 session")
    import mtxcomm

    message = "rank 0 of 2: mtxcomm_comm_destroy (transport shm): the ranks disagree on the call"
    with pytest.raises(mtxcomm.InvalidUsageError, match="disagree on the call"):
        mtxcomm._shutdown_or_exit(lambda: (2, message), at_exit=False)
    mtxcomm._shutdown_or_exit(lambda: (0, ""), at_exit=False)
    code = (
        "import atexit, mtxcomm\n"
        "atexit.register(mtxcomm._shutdown_or_exit, lambda: (2, %r), at_exit=True)\n"
        "print('END OF PROGRAM')\n" % message
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX", "PRTE"))}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert "END OF PROGRAM" in out.stdout, out.stdout
    assert "mtxcomm: error at exit: " + message in out.stderr, out.stderr


def test_error_classes_map_the_codes():
    import builtins

    from mtxcomm import _arrays

    cases = {
        1: (ValueError, "InvalidArgumentError"),
        2: (RuntimeError, "InvalidUsageError"),
        3: (RuntimeError, "Error"),
        4: (RuntimeError, "RemoteError"),
        5: (builtins.TimeoutError, "TimeoutError"),
        7: (RuntimeError, "Error"),
    }
    for code, (base, name) in cases.items():
        e = _arrays._error(code, "mtxcomm x failed on rank 3: why")
        assert type(e).__name__ == name and isinstance(e, base), (code, type(e))
        assert e.code == code and str(e) == "mtxcomm x failed on rank 3: why"


def test_timeout_and_remote_errors_in_a_job_of_their_own(tmp_path):
    """A 2-rank job over the file store (not under mpirun): a call one rank never makes fails
    after MTXCOMM_STALL_TIMEOUT with mtxcomm.TimeoutError on the rank that made it, the engine
    goes on, and a rank that shuts down while another waits gives it mtxcomm.RemoteError."""
    if RANK != 0 or SIZE != 1:
        pytest.skip("runs once, in the np=1 session")
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import mtxcomm
        flag = sys.argv[1]
        mtxcomm.init()
        r = mtxcomm.rank()
        if r == 0:
            t0 = time.time()
            try:
                mtxcomm.allreduce(np.ones(3, np.float32))
                print("STALL_NO_ERROR", flush=True)
            except mtxcomm.TimeoutError as e:
                print("STALL %.1f %d %s %s: %s" % (time.time() - t0, e.code,
                      isinstance(e, TimeoutError), e.code_name, e), flush=True)
            open(flag, "w").close()
        else:
            deadline = time.time() + 120
            while not os.path.exists(flag) and time.time() < deadline:
                time.sleep(0.05)
        mtxcomm.barrier()
        print("AFTER %d %d" % (r, int(mtxcomm.allreduce(np.ones(1, np.int32))[0])), flush=True)
        if r == 0:
            # The call that waited when rank 1 shut down, then one made after: the same error,
            # naming the request either way.
            for _ in range(2):
                try:
                    mtxcomm.allreduce(np.ones(2, np.float32))
                    print("REMOTE_NO_ERROR", flush=True)
                except mtxcomm.RemoteError as e:
                    print("REMOTE %d %s: %s" % (e.code, isinstance(e, mtxcomm.Error), e),
                          flush=True)
        else:
            mtxcomm.shutdown()
        mtxcomm.shutdown()
        try:
            mtxcomm.rank()
        except mtxcomm.InvalidUsageError as e:
            print("DOWN %d %s" % (r, e), flush=True)
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX", "PRTE"))}
    env.update(
        MTXCOMM_SIZE="2",
        MTXCOMM_STORE="file:%s" % (tmp_path / "store"),
        MTXCOMM_STALL_TIMEOUT="2",
        MTXCOMM_STALL_WARNING="0",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "flag")],
            env=dict(env, MTXCOMM_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the job hung:\n" + "\n".join(outs))
    text = "\n".join(outs)
    assert [p.returncode for p in procs] == [0, 0], text
    stall = [line for line in outs[0].splitlines() if line.startswith("STALL ")]
    assert len(stall) == 1, text
    seconds, code, builtin, name = stall[0].split()[1:5]
    assert 1.5 <= float(seconds) <= 60 and code == "5" and builtin == "True", stall
    assert name == "MTXCOMM_TIMEOUT:" and "rank 1" in stall[0], stall
    assert "AFTER 0 2" in outs[0] and "AFTER 1 2" in outs[1], text
    remote = [line for line in outs[0].splitlines() if line.startswith("REMOTE ")]
    assert len(remote) == 2 and all(x.startswith("REMOTE 4 True") for x in remote), text
    assert all("allreduce '" in x and "rank 1 called shutdown()" in x for x in remote), remote
    assert "DOWN 0" in outs[0] and "DOWN 1" in outs[1] and "not initialised" in text, text


# ---- PyTorch ---------------------------------------------------------------------------------

TORCH_DTYPES = [
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "bool",
]


def torch_values(shape, name, rank, offset=0):
    tdt = getattr(torch, name)
    if name == "bool":
        return torch.from_numpy(values(shape, np.bool_, rank, offset))
    base = rank_values(shape, np.int64, rank, offset)
    return torch.from_numpy(np.abs(base) if name.startswith("uint") else base).to(tdt)


def from_torch(t):
    """A torch tensor's values as NumPy (bfloat16 through float32, exact for these values)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16) if BF16 is not None else t.float().numpy()
    return t.numpy()


@needs_torch
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_allreduce_every_dtype(mc, name):
    if not hasattr(torch, name):
        pytest.skip("this torch has no %s" % name)
    op = "max" if name == "bool" else "sum"
    got = mc.allreduce(torch_values((3, 4), name, RANK), op=op)
    assert isinstance(got, torch.Tensor) and got.dtype == getattr(torch, name)
    want = expected_reduce(
        [from_torch(torch_values((3, 4), name, k)) for k in range(SIZE)],
        op,
        from_torch(torch_values((1,), name, 0)).dtype,
    )
    assert_same(from_torch(got), want)


@needs_torch
def test_torch_zero_copy_in_place_and_out(mc, core):
    t = torch_values((4, 5), "float32", RANK)
    got = mc.allreduce(t)
    engine_in, engine_out = core.last_buffers()
    inplace = torch_values((6,), "bfloat16", RANK)
    same = mc.allreduce(inplace, out=inplace)
    engine_in2, engine_out2 = core.last_buffers()
    out = torch.zeros(3, dtype=torch.int64)
    got_out = mc.broadcast(torch_values((3,), "int64", RANK), root=0, out=out)
    want = expected_reduce(
        [from_torch(torch_values((4, 5), "float32", k)) for k in range(SIZE)], "sum", np.float32
    )
    assert engine_in == t.data_ptr()
    assert engine_out == got.data_ptr()  # the result wraps the engine's buffer: no copy
    assert_same(got.numpy(), want)
    assert same is inplace and engine_in2 == engine_out2 == inplace.data_ptr()
    assert (
        from_torch(inplace).astype(np.float64).tolist()
        == expected_reduce(
            [from_torch(torch_values((6,), "bfloat16", k)) for k in range(SIZE)],
            "sum",
            from_torch(inplace).dtype,
        )
        .astype(np.float64)
        .tolist()
    )
    assert got_out is out and out.tolist() == torch_values((3,), "int64", 0).tolist()


@needs_torch
def test_torch_non_contiguous_grad_and_device_tensors(mc):
    base = torch_values((3, 4), "float64", RANK)
    got = mc.allreduce(base.t())  # non-contiguous: copied first
    leaf = torch.ones(2, requires_grad=True)
    got_grad = mc.allreduce(leaf)  # read through detach()
    want = expected_reduce(
        [from_torch(torch_values((3, 4), "float64", k)).T for k in range(SIZE)], "sum", np.float64
    )
    assert_same(got.numpy(), want)
    assert got_grad.tolist() == [float(SIZE)] * 2 and not got_grad.requires_grad
    with pytest.raises(ValueError, match="out requires grad"):
        mc.allreduce(leaf, out=leaf)
    with pytest.raises(ValueError, match="meta.*host \\(CPU\\) memory only"):
        mc.allreduce(torch.empty(3, device="meta"))
    with pytest.raises(TypeError, match="torch.complex64"):
        mc.allreduce(torch.zeros(2, dtype=torch.complex64))


@needs_torch
def test_torch_allgather_reduce_scatter_alltoall(mc):
    gathered = mc.allgather(torch_values((RANK + 1, 2), "float16", RANK))
    d0 = 2 * SIZE + 1
    scattered = mc.reduce_scatter(torch_values((d0, 2), "int32", RANK), op="min")
    x = torch.from_numpy(a2a_input(RANK, SIZE, np.int64))
    exchanged, received = mc.alltoall(x, splits=torch.tensor(a2a_splits(RANK, SIZE)))
    assert isinstance(gathered, torch.Tensor) and gathered.dtype == torch.float16
    assert_same(
        gathered.numpy(),
        np.concatenate([from_torch(torch_values((k + 1, 2), "float16", k)) for k in range(SIZE)]),
    )
    full = expected_reduce(
        [from_torch(torch_values((d0, 2), "int32", k)) for k in range(SIZE)], "min", np.int32
    )
    start = sum(rows_of(d0, SIZE, r) for r in range(RANK))
    assert_same(scattered.numpy(), full[start : start + rows_of(d0, SIZE, RANK)], "min")
    want, want_received = a2a_expected(RANK, SIZE, np.int64)
    assert isinstance(exchanged, torch.Tensor) and isinstance(received, torch.Tensor)
    assert_same(exchanged.numpy(), want)
    assert received.dtype == torch.int32 and received.tolist() == want_received


# ---- JAX -------------------------------------------------------------------------------------


@needs_jax
def test_jax_arrays(mc, core):
    x = jnp.asarray(values((4, 3), np.float32, RANK))
    got = mc.allreduce(x, op="max")
    engine_in, _ = core.last_buffers()
    b = jnp.asarray(values((5,), np.float32, RANK)).astype(jnp.bfloat16)
    got_b = mc.allreduce(b)
    gathered = mc.allgather(jnp.asarray(values((RANK + 1,), np.int32, RANK)))
    assert isinstance(got, jax.Array)
    assert engine_in == x.unsafe_buffer_pointer()  # read in place
    assert_same(
        np.asarray(got),
        expected_reduce([values((4, 3), np.float32, k) for k in range(SIZE)], "max", np.float32),
    )
    assert isinstance(got_b, jax.Array) and got_b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got_b, np.float64),
        expected_reduce([values((5,), np.float32, k) for k in range(SIZE)], "sum", np.float32),
    )
    assert_same(
        np.asarray(gathered), np.concatenate([values((k + 1,), np.int32, k) for k in range(SIZE)])
    )
    with pytest.raises(ValueError, match="JAX arrays are immutable"):
        mc.allreduce(x, out=x)


# ---- one engine with mtxcomm.tensorflow --------------------------------------------------------


def test_one_engine_and_communicator_with_mtxcomm_tensorflow(mc, core):
    if SIZE > 2:
        pytest.skip("run at np=1 and 2: importing TensorFlow costs about 10 s of CPU per rank")
    try:
        import tensorflow as tf

        import mtxcomm.tensorflow as hvd
    except Exception as e:  # noqa: BLE001
        pytest.skip("mtxcomm.tensorflow is not importable: %s: %s" % (type(e).__name__, e))
    assert hvd.is_initialized()  # started by mtxcomm.init()
    hvd.init()  # a no-op: the engine runs
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (
        mc.rank(),
        mc.size(),
        mc.local_rank(),
        mc.local_size(),
    )
    before = core.collective_count()
    tf_sum = hvd.allreduce(tf.constant([1.0, float(RANK)]), op=hvd.Sum, name="arrays.tf").numpy()
    np_sum = mc.allreduce(np.array([1.0, float(RANK)], np.float32))
    after = core.collective_count()
    with open("/proc/self/maps") as f:
        engines = {line.split()[-1] for line in f if "libmtxcomm_engine" in line}
    assert len(engines) == 1, engines
    assert after - before == 2  # both calls counted by the one engine
    assert hvd._collective_count() == after
    np.testing.assert_array_equal(tf_sum, np_sum)
    np.testing.assert_array_equal(np_sum, [float(SIZE), float(sum(range(SIZE)))])
