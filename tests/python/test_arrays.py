"""The framework-neutral array API (mtxcomm.allreduce and the others) against NumPy, on every
rank: every op and dtype, out= and in place, read-only refusal, alltoall splits, errors,
zero copy; PyTorch CPU tensors when torch is importable, JAX CPU arrays when jax is; one engine
shared with mtxcomm.tensorflow when TensorFlow is importable.

Run with 1, 2 and 3 ranks (tests/python/run_suite.sh):
    mpirun -np 3 --oversubscribe python -m pytest -q -p no:cacheprovider tests/python/test_arrays.py
Every rank runs every test in the same order; a test's collectives come before its asserts.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from arrays_common import (
    DTYPE_IDS,
    DTYPES,
    OPS,
    RANK,
    SIZE,
    a2a_expected,
    a2a_input,
    a2a_splits,
    address,
    np_dtype,
    rows_of,
)
from conftest import assert_same, expected_reduce, values

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
