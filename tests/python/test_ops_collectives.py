"""mtxcomm.tensorflow's allgather, reducescatter, broadcast and sparse (IndexedSlices)
allreduce against NumPy, on every rank. Run like test_ops.py, in the same session."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import rank_values
from ops_common import (
    SHAPES,
    SIZE,
    assert_reduced,
    expected_reduce,
    npt,
    op_const,
    scatter_rows,
    wide,
)

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
