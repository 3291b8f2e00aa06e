"""mtxcomm.tensorflow.keras: DistributedOptimizer, DistributedGradientTape and the callbacks.

Run with 1 and 2 ranks (see tests/python/README.md):
    mpirun -np 2 python -m pytest -q -p no:cacheprovider tests/python/test_keras.py
Every rank runs every test; the expected values (a 1-process reference training on the whole
global batches, mean gradients over ranks) are computed locally on each rank without
collectives, the distributed results are then compared on every rank.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_common import (
    SIZE,
    STEPS,
    B,
    assert_equal_across_ranks,
    global_data,
    local_rows,
    loss_fn,
    make_model,
    max_abs_diff,
    rank0_initial_weights,
    reference_fit,
    weights_of,
)

# ---------------------------------------------------------------------------------------------
# DistributedOptimizer: N ranks on their shares == 1 process on the global batches


def test_distributed_optimizer_fit_matches_single_process(hvd, hvdk):
    x, y = global_data()
    mine = local_rows(len(x), hvd.rank())
    model = make_model(seed=hvd.rank())  # rank-different initial weights, broadcast below
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    model.compile(optimizer=opt, loss=loss_fn())
    hvd.broadcast_variables(model.variables, root_rank=0)
    model.fit(x[mine], y[mine], batch_size=B, epochs=2, shuffle=False, verbose=0)
    final = weights_of(model)
    assert_equal_across_ranks(hvd, final, "dopt_fit")

    ref = reference_fit(rank0_initial_weights(), x, y, keras.optimizers.SGD(0.1, momentum=0.9), 2)
    init = rank0_initial_weights()
    assert max_abs_diff(final, init) > 1e-2, "training did not change the weights"
    assert max_abs_diff(final, ref) <= 1e-5, (
        f"differs from the 1-process run by {max_abs_diff(final, ref)}"
    )


def test_distributed_optimizer_custom_loop_adam_matches_single_process(hvd, hvdk):
    x, y = global_data()
    mine = local_rows(len(x), hvd.rank())
    lf = loss_fn()

    def train(model, opt, xs, ys, batch):
        for i in range(STEPS):
            xb, yb = xs[i * batch : (i + 1) * batch], ys[i * batch : (i + 1) * batch]
            with tf.GradientTape() as tape:
                loss = lf(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    model = make_model(seed=hvd.rank())
    hvd.broadcast_variables(model.variables, root_rank=0)
    train(model, hvdk.DistributedOptimizer(keras.optimizers.Adam(1e-2)), x[mine], y[mine], B)
    final = weights_of(model)
    assert_equal_across_ranks(hvd, final, "dopt_loop")

    ref_model = make_model(seed=0)
    train(ref_model, keras.optimizers.Adam(1e-2), x, y, SIZE * B)
    ref = weights_of(ref_model)
    assert max_abs_diff(final, ref) <= 1e-5, (
        f"differs from the 1-process run by {max_abs_diff(final, ref)}"
    )


def test_distributed_optimizer_none_gradients_pass_through(hvd, hvdk):
    r = hvd.rank()
    unused_a = tf.Variable(np.full((2,), 7.0, np.float32))
    used = tf.Variable(np.zeros((3,), np.float32))
    unused_b = tf.Variable(np.full((2, 2), -1.0, np.float32))
    variables = [unused_a, used, unused_b]
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(used * np.array([1.0, 2.0, 3.0], np.float32) * (r + 1))
    grads = tape.gradient(loss, variables)
    assert grads[0] is None and grads[2] is None
    opt.apply_gradients(zip(grads, variables))
    mean_scale = (SIZE + 1) / 2.0  # mean over ranks k of (k + 1)
    np.testing.assert_allclose(used.numpy(), -mean_scale * np.array([1.0, 2.0, 3.0]), rtol=1e-6)
    np.testing.assert_array_equal(unused_a.numpy(), np.full((2,), 7.0, np.float32))
    np.testing.assert_array_equal(unused_b.numpy(), np.full((2, 2), -1.0, np.float32))


# ---------------------------------------------------------------------------------------------
# sparse gradients (Embedding -> IndexedSlices)

VOCAB, DIM = 10, 3


def rank_ids(k):
    return np.array([(2 * k + j) % VOCAB for j in range(4)] + [k % VOCAB], np.int64)


def rank_coef(k):
    return (np.arange(5 * DIM, dtype=np.float32).reshape(5, DIM) + 1.0) * (k + 1) * 0.1


def dense_embedding_grad(k):
    g = np.zeros((VOCAB, DIM), np.float64)
    np.add.at(g, rank_ids(k), rank_coef(k).astype(np.float64))
    return g


def mean_embedding_grad():
    return sum(dense_embedding_grad(k) for k in range(SIZE)) / SIZE


def embedding_and_loss(rank):
    emb = keras.layers.Embedding(
        VOCAB, DIM, embeddings_initializer=keras.initializers.RandomUniform(seed=5)
    )
    emb.build((None,))
    ids, coef = tf.constant(rank_ids(rank)), tf.constant(rank_coef(rank))
    return emb, lambda: tf.reduce_sum(emb(ids) * coef)


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["sparse", "sparse_as_dense"])
def test_distributed_optimizer_embedding_gradients(hvd, hvdk, sparse_as_dense):
    emb, loss = embedding_and_loss(hvd.rank())
    before = emb.embeddings.numpy().copy()
    with tf.GradientTape() as tape:
        value = loss()
    grads = tape.gradient(value, [emb.embeddings])
    assert isinstance(grads[0], tf.IndexedSlices), "the Embedding gradient should be IndexedSlices"
    opt = hvdk.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=1.0), sparse_as_dense=sparse_as_dense
    )
    opt.apply_gradients(zip(grads, [emb.embeddings]))
    np.testing.assert_allclose(
        before - emb.embeddings.numpy(), mean_embedding_grad(), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["sparse", "sparse_as_dense"])
def test_distributed_gradient_tape_embedding(hvd, sparse_as_dense):
    emb, loss = embedding_and_loss(hvd.rank())
    with tf.GradientTape() as tape:
        value = loss()
    tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
    (grad,) = tape.gradient(value, [emb.embeddings])
    if sparse_as_dense:
        assert not isinstance(grad, tf.IndexedSlices), "sparse_as_dense=True returned IndexedSlices"
    else:
        assert isinstance(grad, tf.IndexedSlices), (
            f"sparse gradient came back as {type(grad).__name__}"
        )
    np.testing.assert_allclose(
        tf.convert_to_tensor(grad).numpy(), mean_embedding_grad(), rtol=1e-5, atol=1e-6
    )


# ---------------------------------------------------------------------------------------------
# DistributedGradientTape


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_distributed_gradient_tape(hvd, op):
    r = hvd.rank()
    v = tf.Variable([1.0, 2.0, 3.0])
    unused = tf.Variable([5.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((r + 1) * v * v)  # d/dv = 2 (r+1) v
    kw = {} if op == "Average" else {"op": hvd.Sum}
    tape = hvd.DistributedGradientTape(tape, **kw)
    grads = tape.gradient(loss, [v, unused])
    total = SIZE * (SIZE + 1) / 2.0  # sum over ranks k of (k + 1)
    scale = 2 * (total / SIZE if op == "Average" else total)
    assert grads[1] is None, "gradient of an unused variable should stay None"
    np.testing.assert_allclose(grads[0].numpy(), scale * np.array([1.0, 2.0, 3.0]), rtol=1e-6)


def test_distributed_gradient_tape_in_function(hvd):
    r = hvd.rank()
    v = tf.Variable([1.0, -1.0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((r + 1.0) * v * v)
        return hvd.DistributedGradientTape(tape).gradient(loss, [v])[0]

    got = [step().numpy() for _ in range(3)]
    for g in got:
        np.testing.assert_allclose(g, (SIZE + 1) * np.array([1.0, -1.0]), rtol=1e-6)


def collective_overlaps(fn, *args):
    """{op type: [overlap attr, ...]} of the collectives in fn's traced graph (and the graphs
    of the functions it calls)."""
    found = {}
    graph = fn.get_concrete_function(*args).graph
    graphs = [graph] + [f.graph for f in graph._functions.values() if hasattr(f, "graph")]
    for g in graphs:
        for op in g.get_operations():
            if op.type.startswith("Mtxcomm") and op.type != "MtxcommProcessInfo":
                found.setdefault(op.type, []).append(op.get_attr("overlap"))
    return found


def test_gradient_collectives_of_a_traced_step_overlap_the_backward_pass(hvd, hvdk):
    """A traced step's gradient allreduces (DistributedGradientTape, DistributedOptimizer, also
    an Embedding's IndexedSlices allgathers and the gradient of a collective) carry overlap=True:
    they always run on the engine's thread and fuse. A collective the step itself waits for
    (a plain allreduce, a broadcast) carries overlap=False: a small one may run on the calling
    thread when its peers are there."""
    r = hvd.rank()
    v = tf.Variable([1.0, -1.0])
    emb = keras.layers.Embedding(10, 3)
    emb.build((None,))
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1))
    opt.build([v, emb.embeddings])

    @tf.function
    def tape_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((r + 1.0) * v * v) + tf.reduce_sum(emb(tf.constant([1, 2])))
        return hvd.DistributedGradientTape(tape).gradient(loss, [v, emb.embeddings])

    @tf.function
    def optimizer_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((r + 1.0) * v * v)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        return v

    @tf.function
    def through_a_collective(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(hvd.allreduce(x * x, op=hvd.Sum, name="overlap_fwd"))
        return tape.gradient(y, x)

    @tf.function
    def plain(x):
        return hvd.allreduce(x, name="overlap_plain"), hvd.broadcast(x, 0, name="overlap_bc")

    x = tf.constant([1.0, 2.0])
    tape_ops = collective_overlaps(tape_step)
    assert tape_ops.get("MtxcommAllreduce") == [True], tape_ops
    assert tape_ops.get("MtxcommAllgather") == [True, True], tape_ops
    assert collective_overlaps(optimizer_step).get("MtxcommAllreduce") == [True]
    fwd_bwd = collective_overlaps(through_a_collective, x)
    assert sorted(fwd_bwd.get("MtxcommAllreduce", [])) == [False, True], fwd_bwd
    assert collective_overlaps(plain, x) == {
        "MtxcommAllreduce": [False],
        "MtxcommBroadcast": [False],
    }
    # The traced steps still compute the right values.
    grads = tape_step()
    np.testing.assert_allclose(grads[0].numpy(), (SIZE + 1) * np.array([1.0, -1.0]), rtol=1e-6)
    np.testing.assert_allclose(through_a_collective(x).numpy(), 2 * SIZE * x.numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# mixed precision: LossScaleOptimizer around or inside DistributedOptimizer


@pytest.mark.parametrize("nesting", ["lso_wraps_dopt", "dopt_wraps_lso"])
def test_loss_scale_optimizer(hvd, hvdk, nesting):
    policy = "mixed_float16"
    x, y = global_data()
    mine = local_rows(len(x), hvd.rank())
    lr = 0.5

    def lso(inner):
        # a moderate initial scale: no overflowed (skipped) step, so the reference is comparable
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**8)

    if nesting == "lso_wraps_dopt":
        opt = lso(hvdk.DistributedOptimizer(keras.optimizers.SGD(lr)))
    else:
        opt = hvdk.DistributedOptimizer(lso(keras.optimizers.SGD(lr)))
    model = make_model(seed=hvd.rank(), policy=policy)
    model.compile(optimizer=opt, loss=loss_fn())
    hvd.broadcast_variables(model.variables, root_rank=0)
    model.fit(x[mine], y[mine], batch_size=B, epochs=1, shuffle=False, verbose=0)
    final = weights_of(model)
    assert_equal_across_ranks(hvd, final, f"lso_{nesting}")

    init = rank0_initial_weights(policy)
    ref = reference_fit(init, x, y, lso(keras.optimizers.SGD(lr)), 1, policy)
    assert all(np.all(np.isfinite(w)) for w in final)
    moved = max_abs_diff(ref, init)
    assert moved > 1e-2, "the reference did not train"
    # float16 arithmetic differs between B-row and global batches; averaging twice (or not at
    # all) would be off by ~(1 - 1/size) of the step
    assert max_abs_diff(final, ref) <= 0.05 * moved, (
        f"differs from the 1-process mixed-precision run by {max_abs_diff(final, ref)} "
        f"(step {moved})"
    )


# ---------------------------------------------------------------------------------------------
# backward_passes_per_step


def test_backward_passes_per_step_2(hvd, hvdk):
    r = hvd.rank()
    v = tf.Variable(np.zeros((4,), np.float32))
    opt = hvdk.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=1.0), backward_passes_per_step=2
    )

    def coef(k, step):
        return np.array([1.0, 2.0, 3.0, 4.0], np.float32) * (k + 1) + step

    history = []
    for step in range(4):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * coef(r, step))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        history.append(v.numpy().copy())

    def mean_grad(step):
        return sum(coef(k, step).astype(np.float64) for k in range(SIZE)) / SIZE

    np.testing.assert_array_equal(history[0], np.zeros(4), err_msg="step 1 applied an update")
    first = -history[1]
    summed = mean_grad(0) + mean_grad(1)
    # Horovod sums the passes (average_aggregated_gradients=False); averaging them is accepted too
    if np.allclose(first, summed, rtol=1e-6):
        factor = 1.0
    elif np.allclose(first, summed / 2, rtol=1e-6):
        factor = 0.5
    else:
        pytest.fail(f"update after 2 passes {first}, want {summed} (sum) or {summed / 2} (mean)")
    np.testing.assert_array_equal(history[2], history[1], err_msg="step 3 applied an update")
    np.testing.assert_allclose(
        history[1] - history[3], factor * (mean_grad(2) + mean_grad(3)), rtol=1e-6
    )
