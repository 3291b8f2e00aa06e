"""The collective ops of mtxcomm.tensorflow against NumPy, on every rank.

Run with 1, 2 and 3 ranks (see tests/python/README.md):
    mpirun -np 3 --oversubscribe python -m pytest -q -p no:cacheprovider tests/python/test_ops.py
Every rank runs every test in the same order; the expected values of a test are computed
locally from rank()/size() for every rank k in range(size()).
"""

import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import STATE, launched_rank, launched_size, rank_values

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


# ---------------------------------------------------------------------------------------------
# allgather


@pytest.mark.parametrize(
    "dtype",
    [tf.int8, tf.uint8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64],
    ids=lambda d: d.name,
)
@pytest.mark.parametrize("trailing", [(), (3,), (2, 3)], ids=["1d", "2d", "3d"])
def test_allgather_rank_r_gives_r_plus_1_rows(hvd, dtype, trailing):
    def part(k):
        return rank_values((k + 1,) + trailing, npt(dtype), k, offset=k)

    got = hvd.allgather(
        tf.constant(part(hvd.rank()), dtype=dtype), name=f"ag_{dtype.name}_{len(trailing)}"
    )
    want = np.concatenate([part(k) for k in range(SIZE)], axis=0)
    assert got.dtype == dtype
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(wide(got.numpy()), wide(want))


def test_allgather_with_empty_contributions(hvd):
    # rank r contributes r rows: rank 0 none
    def part(k):
        return np.full((k, 2), k, np.float32)

    got = hvd.allgather(tf.constant(part(hvd.rank())), name="ag_empty_rank0")
    want = np.concatenate([part(k) for k in range(SIZE)], axis=0)
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(got.numpy(), want)


# ---------------------------------------------------------------------------------------------
# reducescatter


def scatter_rows(dim0, size):
    """Rows of each rank: the first dim0 % size ranks get one more."""
    return [dim0 // size + (1 if k < dim0 % size else 0) for k in range(size)]


@pytest.mark.parametrize(
    "dtype", [tf.int32, tf.float16, tf.float32, tf.float64], ids=lambda d: d.name
)
@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("dim0_id", ["2size+1", "size-1", "size", "1"])
def test_reducescatter(hvd, op, dtype, dim0_id):
    dim0 = {"2size+1": 2 * SIZE + 1, "size-1": max(SIZE - 1, 0), "size": SIZE, "1": 1}[dim0_id]
    shape = (dim0, 2, 3)
    x = tf.constant(rank_values(shape, npt(dtype), hvd.rank()), dtype=dtype)
    got = hvd.reducescatter(x, op=op_const(hvd, op), name=f"rs_{op}_{dtype.name}_{dim0_id}")
    full = expected_reduce([rank_values(shape, npt(dtype), k) for k in range(SIZE)], op, dtype)
    rows = scatter_rows(dim0, SIZE)
    start = sum(rows[: hvd.rank()])
    want = full[start : start + rows[hvd.rank()]]
    assert_reduced(got, want, dtype, op)


def test_reducescatter_default_op_is_average(hvd):
    x = tf.constant(np.full((2 * SIZE, 2), hvd.rank(), np.float32))
    got = hvd.reducescatter(x, name="rs_default")
    np.testing.assert_allclose(
        got.numpy(), np.full((2, 2), (SIZE - 1) / 2.0, np.float32), rtol=1e-6
    )


# ---------------------------------------------------------------------------------------------
# broadcast


@pytest.mark.parametrize("shape_id", ["scalar", "1d", "3d", "empty"])
@pytest.mark.parametrize(
    "dtype",
    [tf.int8, tf.uint8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64],
    ids=lambda d: d.name,
)
def test_broadcast_from_each_root(hvd, dtype, shape_id):
    shape = SHAPES[shape_id]
    results = []
    for root in range(SIZE):
        x = tf.constant(rank_values(shape, npt(dtype), hvd.rank(), offset=hvd.rank()), dtype=dtype)
        results.append(hvd.broadcast(x, root_rank=root, name=f"bc_{dtype.name}_{shape_id}_{root}"))
    for root, got in enumerate(results):
        want = rank_values(shape, npt(dtype), root, offset=root)
        assert got.dtype == dtype
        assert tuple(got.shape) == want.shape
        np.testing.assert_array_equal(wide(got.numpy()), wide(want), err_msg=f"root {root}")


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_variables(hvd, root):
    root_rank = 0 if root == "first" else SIZE - 1
    r = hvd.rank()
    variables = [
        tf.Variable(np.full((3, 2), r, np.float32)),
        tf.Variable(np.arange(4, dtype=np.int64) * (r + 1)),
        tf.Variable(np.float64(r) + 0.5),
        tf.Variable(np.full((2,), r, np.float16)),
    ]
    hvd.broadcast_variables(variables, root_rank=root_rank)
    np.testing.assert_array_equal(variables[0].numpy(), np.full((3, 2), root_rank, np.float32))
    np.testing.assert_array_equal(
        variables[1].numpy(), np.arange(4, dtype=np.int64) * (root_rank + 1)
    )
    assert variables[2].numpy() == np.float64(root_rank) + 0.5
    np.testing.assert_array_equal(variables[3].numpy(), np.full((2,), root_rank, np.float16))


# ---------------------------------------------------------------------------------------------
# sparse (IndexedSlices)


def rank_slices(k):
    """IndexedSlices of a (10, 4) tensor held by rank k: k+2 rows, some indices repeated."""
    idx = np.array([(3 * k + 2 * j) % 10 for j in range(k + 2)] + [k % 10], np.int64)
    vals = (np.arange(len(idx) * 4, dtype=np.float32).reshape(len(idx), 4) + k) * 0.25
    return idx, vals


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_allreduce_indexed_slices_equals_dense(hvd, op):
    idx, vals = rank_slices(hvd.rank())
    slices = tf.IndexedSlices(
        tf.constant(vals), tf.constant(idx), dense_shape=tf.constant([10, 4], tf.int64)
    )
    got = hvd.allreduce(slices, op=op_const(hvd, op), name=f"ar_sparse_{op}")
    dense_ref = hvd.allreduce(
        tf.convert_to_tensor(slices), op=op_const(hvd, op), name=f"ar_sparse_dense_{op}"
    )

    want = np.zeros((10, 4), np.float64)
    for k in range(SIZE):
        ik, vk = rank_slices(k)
        np.add.at(want, ik, vk.astype(np.float64))
    if op == "Average":
        want /= SIZE
    assert isinstance(got, tf.IndexedSlices), (
        f"allreduce of IndexedSlices returned {type(got).__name__}"
    )
    dense = tf.convert_to_tensor(got).numpy()
    np.testing.assert_allclose(dense, want, rtol=1e-6)
    np.testing.assert_allclose(dense, dense_ref.numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# gradients


def tape_grad(fn, x, use_function):
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = fn(x)
        return tape.gradient(loss, x)

    if use_function:
        run = tf.function(run)
    return run(x)


MODES = ["eager", "function"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_allreduce_gradient(hvd, op, mode):
    # total loss sum_k sum((k+1) * reduce(x)) -> d/dx_r = sum_k (k+1) (Sum) or its mean (Average)
    r = hvd.rank()
    x = tf.constant(rank_values((2, 3), np.float32, r))
    w = tf.constant(np.full((2, 3), r + 1, np.float32))
    grad = tape_grad(
        lambda x: tf.reduce_sum(
            w * hvd.allreduce(x, op=op_const(hvd, op), name=f"g_ar_{op}_{mode}")
        ),
        x,
        mode == "function",
    )
    total = SIZE * (SIZE + 1) / 2.0
    want = total if op == "Sum" else total / SIZE
    np.testing.assert_allclose(grad.numpy(), np.full((2, 3), want, np.float32), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_gradient(hvd, mode):
    # the root's input receives the average of every rank's upstream gradient (Horovod's
    # gradient); other inputs zero
    r = hvd.rank()
    grads = []
    for root in range(SIZE):
        x = tf.constant(np.full((4,), r, np.float32))
        w = tf.constant(np.arange(4, dtype=np.float32) + r + 1)
        grads.append(
            tape_grad(
                lambda x: tf.reduce_sum(
                    w * hvd.broadcast(x, root_rank=root, name=f"g_bc_{root}_{mode}")
                ),
                x,
                mode == "function",
            )
        )
    for root, grad in enumerate(grads):
        want = sum(np.arange(4, dtype=np.float32) + k + 1 for k in range(SIZE)) / SIZE
        if r != root:
            want = np.zeros(4, np.float32)
        np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, err_msg=f"root {root}")


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient(hvd, mode):
    # rank r contributes r+1 rows; loss_k = sum(W_k * allgather(x)), W_k = (k+1) * B; the
    # upstream gradients are averaged over ranks (Horovod's gradient), then split by rows
    r = hvd.rank()
    total_rows = SIZE * (SIZE + 1) // 2
    b = np.arange(total_rows * 2, dtype=np.float32).reshape(total_rows, 2) + 1
    x = tf.constant(np.full((r + 1, 2), r, np.float32))
    w = tf.constant(b * (r + 1))
    grad = tape_grad(
        lambda x: tf.reduce_sum(w * hvd.allgather(x, name=f"g_ag_{mode}")), x, mode == "function"
    )
    start = r * (r + 1) // 2
    want = b[start : start + r + 1] * ((SIZE + 1) / 2.0)
    assert tuple(grad.shape) == (r + 1, 2)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_gradient(hvd, op, mode):
    # loss_k = sum(W_k * y_k) for rank k's slice y_k -> Horovod's gradient: d/dx_r =
    # concat_k W_k, times size() for Sum
    r = hvd.rank()
    dim0 = 2 * SIZE + 1
    rows = scatter_rows(dim0, SIZE)

    def wk(k):
        return (np.arange(rows[k] * 2, dtype=np.float32).reshape(rows[k], 2) + 1) * (k + 1)

    x = tf.constant(rank_values((dim0, 2), np.float32, r))
    w = tf.constant(wk(r))
    grad = tape_grad(
        lambda x: tf.reduce_sum(
            w * hvd.reducescatter(x, op=op_const(hvd, op), name=f"g_rs_{op}_{mode}")
        ),
        x,
        mode == "function",
    )
    want = np.concatenate([wk(k) for k in range(SIZE)], axis=0)
    if op == "Sum":
        want = want * SIZE
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# tf.function: every call runs its collectives, none is pruned


def test_function_called_10_times_runs_10_collectives(hvd):
    @tf.function
    def f(x):
        return hvd.allreduce(x, op=hvd.Sum, name="fn_used")

    x = tf.constant(np.full((3,), hvd.rank() + 1, np.float32))
    before = hvd._collective_count()
    results = [f(x).numpy() for _ in range(10)]
    after = hvd._collective_count()
    for got in results:
        np.testing.assert_array_equal(got, np.full((3,), SIZE * (SIZE + 1) / 2, np.float32))
    assert after - before == 10, f"10 calls ran {after - before} collectives"


def test_function_unused_allreduce_still_runs(hvd):
    @tf.function
    def g(x):
        hvd.allreduce(x, op=hvd.Sum, name="fn_unused")  # result unused: must not be pruned
        return x + 1.0

    x = tf.constant(np.full((3,), hvd.rank(), np.float32))
    before = hvd._collective_count()
    results = [g(x).numpy() for _ in range(10)]
    after = hvd._collective_count()
    for got in results:
        np.testing.assert_array_equal(got, np.full((3,), hvd.rank() + 1, np.float32))
    assert after - before == 10, (
        f"10 calls of a function with an unused allreduce ran {after - before} collectives"
    )


def test_function_mixed_ops_values(hvd):
    # several different collectives in one graph, called a few times
    @tf.function
    def h(x):
        s = hvd.allreduce(x, op=hvd.Sum, name="fn_mix_ar")
        g = hvd.allgather(tf.reshape(x, [1, -1]), name="fn_mix_ag")
        b = hvd.broadcast(x, root_rank=SIZE - 1, name="fn_mix_bc")
        return s, g, b

    x = tf.constant(np.array([hvd.rank(), 1.0], np.float32))
    outs = [h(x) for _ in range(3)]
    for s, g, b in outs:
        np.testing.assert_array_equal(s.numpy(), [SIZE * (SIZE - 1) / 2, SIZE])
        np.testing.assert_array_equal(g.numpy(), [[k, 1.0] for k in range(SIZE)])
        np.testing.assert_array_equal(b.numpy(), [SIZE - 1, 1.0])


def test_function_2000_small_allreduces_fuse(hvd):
    # Inside tf.function the collectives are not chained in program order: those ready together
    # are negotiated together and fused into few collectives.
    xs = [tf.constant([float(i + hvd.rank())]) for i in range(2000)]

    @tf.function
    def many(xs):
        return [hvd.allreduce(x, op=hvd.Sum, name="fuse_%d" % i) for i, x in enumerate(xs)]

    before = hvd._collective_count()
    out = many(xs)
    ran = hvd._collective_count() - before
    for i, o in enumerate(out):
        assert o.numpy()[0] == sum(i + k for k in range(SIZE)), i
    if SIZE > 1:
        assert ran < 200, f"2000 allreduces in one tf.function ran {ran} collectives"


def test_function_opposite_orders_on_two_ranks_do_not_deadlock(hvd):
    a = tf.constant([1.0 + hvd.rank()])
    b = tf.constant([10.0 * (hvd.rank() + 1)])

    @tf.function
    def two(a, b):
        # Even ranks issue A then B, odd ranks B then A; B's input also depends on A's on odd
        # ranks only as program order, not data.
        if hvd.rank() % 2 == 0:
            x = hvd.allreduce(a, op=hvd.Sum, name="order_A")
            y = hvd.allreduce(b, op=hvd.Sum, name="order_B")
        else:
            y = hvd.allreduce(b, op=hvd.Sum, name="order_B")
            x = hvd.allreduce(a, op=hvd.Sum, name="order_A")
        return x, y

    x, y = two(a, b)
    assert x.numpy()[0] == sum(1.0 + k for k in range(SIZE))
    assert y.numpy()[0] == sum(10.0 * (k + 1) for k in range(SIZE))


def test_cpu_share_is_positive(hvd):
    assert hvd.cpu_share() >= 1


# ---------------------------------------------------------------------------------------------
# mismatched calls between ranks: a clear error naming the tensor and ranks, never a hang.
# Kept last in the file: a failure here must not leave state that breaks other tests.

multi_rank = pytest.mark.skipif(SIZE < 2, reason="mismatches need at least 2 ranks")


def check_mismatch_error(excinfo, name):
    msg = str(excinfo.value)
    assert name in msg, f"error does not name the tensor {name!r}: {msg}"
    assert re.search(r"rank", msg, re.IGNORECASE), f"error does not name the ranks: {msg}"


@multi_rank
def test_mismatched_shapes_raise(hvd):
    x = tf.zeros((3 + hvd.rank(),), tf.float32)
    with pytest.raises(tf.errors.OpError) as excinfo:
        hvd.allreduce(x, op=hvd.Sum, name="mismatch_shape_tensor").numpy()
    check_mismatch_error(excinfo, "mismatch_shape_tensor")


@multi_rank
def test_mismatched_dtypes_raise(hvd):
    x = tf.zeros((4,), tf.float32 if hvd.rank() == 0 else tf.float64)
    with pytest.raises(tf.errors.OpError) as excinfo:
        hvd.allreduce(x, op=hvd.Sum, name="mismatch_dtype_tensor").numpy()
    check_mismatch_error(excinfo, "mismatch_dtype_tensor")


@multi_rank
def test_mismatched_allgather_trailing_dims_raise(hvd):
    x = tf.zeros((2, 3 + hvd.rank()), tf.float32)
    with pytest.raises(tf.errors.OpError) as excinfo:
        hvd.allgather(x, name="mismatch_allgather_tensor").numpy()
    check_mismatch_error(excinfo, "mismatch_allgather_tensor")


@multi_rank
def test_works_after_mismatch(hvd):
    got = hvd.allreduce(tf.constant([1.0, hvd.rank()]), op=hvd.Sum, name="after_mismatch")
    np.testing.assert_array_equal(got.numpy(), [SIZE, SIZE * (SIZE - 1) / 2])
