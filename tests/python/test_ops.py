"""The collective ops of mtxcomm.tensorflow against NumPy, on every rank.

Run with 1, 2 and 3 ranks (see tests/python/README.md):
    mpirun -np 3 --oversubscribe python -m pytest -q -p no:cacheprovider tests/python/test_ops.py
Every rank runs every test in the same order; the expected values of a test are computed
locally from rank()/size() for every rank k in range(size()).
"""

import numpy as np
import pytest
import tensorflow as tf
from conftest import STATE, launched_rank, launched_size, rank_values
from ops_common import (
    DTYPES,
    OPS,
    SHAPES,
    SIZE,
    assert_reduced,
    expected_reduce,
    npt,
    op_const,
    trunc_div,
    wide,
)

# ---------------------------------------------------------------------------------------------
# basic state


def test_is_initialized_rank_size(hvd):
    assert STATE.get("initialized_before_init") is False, "is_initialized() was True before init()"
    assert hvd.is_initialized() is True
    assert hvd.size() == launched_size()
    assert hvd.rank() == launched_rank()
    assert 0 <= hvd.rank() < hvd.size()


def test_local_rank_and_size(hvd):
    import os

    # every rank of these runs is on this one node
    want_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", str(launched_rank())))
    want_size = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", str(launched_size())))
    assert hvd.local_rank() == want_rank
    assert hvd.local_size() == want_size
    assert hvd.local_size() == hvd.size()
    assert hvd.local_rank() == hvd.rank()


def test_op_constants_distinct(hvd):
    consts = [op_const(hvd, op) for op in OPS]
    assert len(set(consts)) == len(OPS), f"op constants not distinct: {dict(zip(OPS, consts))}"


def adasum_pair(a, b):
    """Maleki et al.'s adaptive sum of two vectors, in float64 (a term's coefficient is 1 when
    its norm is 0)."""
    dot, na, nb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2.0 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2.0 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def adasum_tree(vectors):
    """The library's tree (docs/algorithms.md#adasum): ranks >= q (the largest power of two <=
    n) fold onto r - q, then recursive doubling among the q lower ranks, lower rank first."""
    v = [np.asarray(x, np.float64).ravel() for x in vectors]
    n = len(v)
    q = 1
    while q * 2 <= n:
        q *= 2
    for r in range(q, n):
        v[r - q] = adasum_pair(v[r - q], v[r])
    d = 1
    while d < q:
        v = [
            adasum_pair(v[r], v[r ^ d]) if r & d == 0 else adasum_pair(v[r ^ d], v[r])
            for r in range(q)
        ] + v[q:]
        d *= 2
    return v[0]


def adasum_input(k, shape):
    rng = np.random.default_rng(100 + k)
    return rng.normal(size=shape) + (k % 2)  # correlated parts: the coefficients matter


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64], ids=lambda d: d.name)
def test_adasum_matches_the_formula(hvd, dtype):
    assert hvd.Adasum not in [op_const(hvd, op) for op in OPS]
    shape = (4, 5)
    x = tf.constant(adasum_input(hvd.rank(), shape), dtype=dtype)
    got = hvd.allreduce(x, op=hvd.Adasum, name=f"adasum_{dtype.name}")
    want = adasum_tree([adasum_input(k, shape) for k in range(SIZE)]).reshape(shape)
    assert got.dtype == dtype
    rtol = {tf.float16: 2e-2, tf.float32: 1e-5, tf.float64: 1e-12}[dtype]
    np.testing.assert_allclose(wide(got.numpy()), want, rtol=rtol, atol=rtol)
    if SIZE > 1:  # it is not the sum nor the average
        total = np.sum([adasum_input(k, shape) for k in range(SIZE)], axis=0)
        assert not np.allclose(want, total) and not np.allclose(want, total / SIZE)


def test_adasum_grouped_and_tape_combine_each_tensor_alone(hvd):
    r = hvd.rank()
    a, b = adasum_input(r, (3,)), adasum_input(r + 7, (6,))
    got = hvd.grouped_allreduce([tf.constant(a), tf.constant(b)], op=hvd.Adasum, name="adasum_g")
    want_a = adasum_tree([adasum_input(k, (3,)) for k in range(SIZE)])
    want_b = adasum_tree([adasum_input(k + 7, (6,)) for k in range(SIZE)])
    np.testing.assert_allclose(got[0].numpy(), want_a, rtol=1e-12)
    np.testing.assert_allclose(got[1].numpy(), want_b, rtol=1e-12)
    w = tf.Variable(np.zeros(3))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * tf.constant(a))
    grad = hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w])[0]
    np.testing.assert_allclose(grad.numpy(), want_a, rtol=1e-12)


def test_adasum_refusals(hvd):
    with pytest.raises(tf.errors.InvalidArgumentError, match="adasum"):
        hvd.allreduce(tf.constant([1, 2], tf.int32), op=hvd.Adasum, name="adasum_int").numpy()
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.reducescatter(tf.ones([2 * SIZE]), op=hvd.Adasum)
    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allreduce(x, op=hvd.Adasum, name="adasum_nograd")
    with pytest.raises(NotImplementedError, match="Adasum"):
        tape.gradient(y, x)


def test_ranks_agree(hvd):
    got = hvd.allgather(tf.constant([hvd.rank()], tf.int32), name="ranks_agree").numpy()
    np.testing.assert_array_equal(got, np.arange(SIZE, dtype=np.int32))


# ---------------------------------------------------------------------------------------------
# allreduce


@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_allreduce(hvd, op, dtype, shape_id):
    shape = SHAPES[shape_id]
    x = tf.constant(rank_values(shape, npt(dtype), hvd.rank()), dtype=dtype)
    got = hvd.allreduce(x, op=op_const(hvd, op), name=f"ar_{op}_{dtype.name}_{shape_id}")
    want = expected_reduce([rank_values(shape, npt(dtype), k) for k in range(SIZE)], op, dtype)
    assert_reduced(got, want, dtype, op)


@pytest.mark.parametrize("dtype", [tf.uint32, tf.uint64], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["Sum", "Max"])
def test_allreduce_wide_unsigned(hvd, op, dtype):
    x = tf.constant(rank_values((6,), npt(dtype), hvd.rank()), dtype=dtype)
    got = hvd.allreduce(x, op=op_const(hvd, op), name=f"ar_u_{op}_{dtype.name}")
    want = expected_reduce([rank_values((6,), npt(dtype), k) for k in range(SIZE)], op, dtype)
    assert_reduced(got, want, dtype, op)


def test_allreduce_default_op_is_average(hvd):
    x = tf.constant([float(hvd.rank()), 1.0, -2.0 * hvd.rank()], tf.float32)
    got = hvd.allreduce(x).numpy()  # unnamed: the binding names it the same on every rank
    mean_rank = (SIZE - 1) / 2.0
    np.testing.assert_allclose(got, [mean_rank, 1.0, -2.0 * mean_rank], rtol=1e-6)


def test_allreduce_variable_input(hvd):
    v = tf.Variable(np.full((2, 2), hvd.rank() + 1, np.float32))
    got = hvd.allreduce(v, op=hvd.Sum, name="ar_variable")
    np.testing.assert_array_equal(got.numpy(), np.full((2, 2), SIZE * (SIZE + 1) / 2, np.float32))


@pytest.mark.parametrize("dtype", [tf.int8, tf.uint8, tf.int32, tf.int64], ids=lambda d: d.name)
def test_integer_average_truncates_toward_zero(hvd, dtype):
    r = hvd.rank()
    first = 1 if r == 0 else 0
    row = [r + 1, -(r + 1), first, -first, 4 * first, -4 * first, 5, -5, 2 * r + 1, -(2 * r + 1)]
    if dtype.is_unsigned:
        row = [abs(v) for v in row]
    got = hvd.allreduce(
        tf.constant(row, dtype=dtype), op=hvd.Average, name=f"ar_trunc_{dtype.name}"
    )
    sums = np.zeros(len(row), np.int64)
    for k in range(SIZE):
        fk = 1 if k == 0 else 0
        rk = [k + 1, -(k + 1), fk, -fk, 4 * fk, -4 * fk, 5, -5, 2 * k + 1, -(2 * k + 1)]
        if dtype.is_unsigned:
            rk = [abs(v) for v in rk]
        sums += np.array(rk, np.int64)
    want = trunc_div(sums, SIZE)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy().astype(np.int64), want)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_half_accumulates_in_float32(hvd, dtype):
    # Rank 0 holds a large value, the others small ones that each vanish when added to it in
    # the 16-bit type but not in float32: 2048 + 1 + 1 is 2048 with float16 partial sums and
    # 2050 when accumulated in float32 and rounded once (bfloat16: 256 + 1 + 1 -> 258).
    big = 2048.0 if dtype == tf.float16 else 256.0
    vals = [big, 1.0, 1.0, 3.0] if hvd.rank() == 0 else [1.0, 1.0, 1.0, 0.5]
    got = hvd.allreduce(tf.constant(vals, dtype=dtype), op=hvd.Sum, name=f"ar_half_{dtype.name}")
    acc = np.array([big, 1.0, 1.0, 3.0], np.float32) + (SIZE - 1) * np.array(
        [1.0, 1.0, 1.0, 0.5], np.float32
    )
    want = acc.astype(npt(dtype))  # one rounding of the float32 sum
    assert got.dtype == dtype
    np.testing.assert_array_equal(wide(got.numpy()), wide(want))


@pytest.mark.parametrize(
    "dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64], ids=lambda d: d.name
)
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_prescale_postscale(hvd, op, dtype):
    x = tf.constant(rank_values((7,), npt(dtype), hvd.rank(), offset=1), dtype=dtype)
    got = hvd.allreduce(
        x,
        op=op_const(hvd, op),
        name=f"ar_scale_{op}_{dtype.name}",
        prescale_factor=0.5,
        postscale_factor=3.0,
    )
    per_rank = [wide(rank_values((7,), npt(dtype), k, offset=1)) * 0.5 for k in range(SIZE)]
    want = np.sum(per_rank, axis=0) * 3.0
    if op == "Average":
        want = want / SIZE
    assert got.dtype == dtype
    rtol = {tf.float16: 2e-3, tf.bfloat16: 1.6e-2, tf.float32: 1e-6, tf.float64: 1e-12}[dtype]
    np.testing.assert_allclose(wide(got.numpy()), want, rtol=rtol, atol=0)


# ---------------------------------------------------------------------------------------------
# grouped allreduce


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_grouped_allreduce_mixed_dtypes(hvd, op):
    specs = [
        (tf.float32, (3,)),
        (tf.int32, (2, 2)),
        (tf.float16, (4,)),
        (tf.float64, ()),
        (tf.int64, (0,)),
        (tf.bfloat16, (2, 3)),
    ]
    tensors = [tf.constant(rank_values(s, npt(d), hvd.rank()), dtype=d) for d, s in specs]
    got = hvd.grouped_allreduce(tensors, op=op_const(hvd, op), name=f"grouped_mixed_{op}")
    assert isinstance(got, (list, tuple)) and len(got) == len(specs)
    for (d, s), g in zip(specs, got):
        want = expected_reduce([rank_values(s, npt(d), k) for k in range(SIZE)], op, d)
        assert_reduced(g, want, d, op)


def grouped_float32_collectives(hvd, sizes, op, name):
    """grouped_allreduce of float32 vectors of the given sizes with op ("Sum", "Average"): checks
    every result and returns how many collectives the engine ran for it."""
    tensors = [tf.constant(rank_values((n,), np.float32, hvd.rank())) for n in sizes]
    before = hvd._collective_count()
    got = hvd.grouped_allreduce(tensors, op=op_const(hvd, op), name=name)
    after = hvd._collective_count()
    for t, g in zip(tensors, got):
        want = expected_reduce(
            [rank_values(tuple(t.shape), np.float32, k) for k in range(SIZE)], op, tf.float32
        )
        assert_reduced(g, want, tf.float32, op)
    return after - before


def test_grouped_allreduce_is_one_collective(hvd):
    ran = grouped_float32_collectives(hvd, (3, 5, 1, 8), "Sum", "grouped_one")
    assert ran == 1, f"grouped_allreduce of 4 float32 tensors ran {ran} collectives"


def test_grouped_allreduce_reduces_tensors_of_1mib_and_more_alone(hvd):
    # bindings/common/executor.h, kAloneBytes: a tensor of at least 1 MiB is reduced from its own
    # buffers (no copy into the fusion buffer and back); the small ones between are still fused.
    sizes = (3, 1 << 18, 5, 7, (1 << 18) + 1, 2)  # float32: 1 MiB and 1 MiB + 4 B among small
    ran = grouped_float32_collectives(hvd, sizes, "Average", "grouped_alone")
    # [3] | [1 MiB] | [5, 7] | [1 MiB + 4] | [2]
    assert ran == 5, f"ran {ran} collectives, want 5"
