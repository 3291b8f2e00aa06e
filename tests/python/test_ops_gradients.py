"""mtxcomm.tensorflow: the gradients of the ops, tf.function (every call runs its collectives),
and mismatched calls between ranks. Run like test_ops.py, in the same session."""

import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import rank_values
from ops_common import (
    SIZE,
    op_const,
    scatter_rows,
)

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
