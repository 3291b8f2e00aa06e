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
from conftest import launched_size

SIZE = launched_size()
B = 8  # rows per rank in each global batch
STEPS = 6  # global batches per epoch
FEATURES, CLASSES = 8, 4


# ---------------------------------------------------------------------------------------------
# helpers


def make_model(seed, policy=None):
    """A small dense classifier whose initial weights depend only on SEED."""
    kw = {"dtype": policy} if policy else {}
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(
                16,
                activation="tanh",
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
                bias_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=seed + 100),
                **kw,
            ),
            keras.layers.Dense(
                CLASSES,
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 200),
                dtype="float32",  # logits in float32 also under a mixed policy
            ),
        ]
    )


def global_data(steps=STEPS, seed=1234):
    """STEPS global batches of SIZE*B rows, the same on every rank."""
    rng = np.random.default_rng(seed)
    n = steps * SIZE * B
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    return x, y


def local_rows(n, rank, steps=STEPS):
    """Indices of RANK's share: rows [rank*B, (rank+1)*B) of every global batch of SIZE*B."""
    g = SIZE * B
    return np.concatenate(
        [np.arange(i * g + rank * B, i * g + (rank + 1) * B) for i in range(steps)]
    )


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def weights_of(model):
    return [np.array(w) for w in model.get_weights()]


def gather_rows(hvd, arrays, name):
    """For each array, the list of every rank's copy (via allgather)."""
    out = []
    for i, a in enumerate(arrays):
        flat = tf.reshape(tf.convert_to_tensor(a), [1, -1])
        got = hvd.allgather(flat, name=f"{name}_{i}").numpy()
        out.append([got[k].reshape(np.shape(a)) for k in range(SIZE)])
    return out


def assert_equal_across_ranks(hvd, arrays, name):
    for i, copies in enumerate(gather_rows(hvd, arrays, name)):
        for k in range(1, SIZE):
            assert np.array_equal(copies[0], copies[k]), f"weight {i}: rank {k} differs from rank 0"


def max_abs_diff(a_list, b_list):
    return max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
        for a, b in zip(a_list, b_list)
    )


def reference_fit(init_weights, x, y, optimizer, epochs, policy=None):
    """The 1-process run: the same model on the whole global batches, plain optimizer."""
    model = make_model(0, policy)
    model.set_weights(init_weights)
    model.compile(optimizer=optimizer, loss=loss_fn())
    model.fit(x, y, batch_size=SIZE * B, epochs=epochs, shuffle=False, verbose=0)
    return weights_of(model)


def rank0_initial_weights(policy=None):
    return weights_of(make_model(0, policy))


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


# ---------------------------------------------------------------------------------------------
# callbacks


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs = []
        self.lrs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs or {}))

    def on_train_batch_end(self, batch, logs=None):
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def test_broadcast_global_variables_callback(hvd, hvdk):
    x, y = global_data(steps=3)
    model = make_model(seed=hvd.rank())  # different on every rank
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss=loss_fn())
    model.fit(
        x,
        y,
        batch_size=SIZE * B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    final = weights_of(model)
    assert_equal_across_ranks(hvd, final, "bcast_cb")
    for i, (got, want) in enumerate(zip(final, rank0_initial_weights())):
        np.testing.assert_array_equal(
            got, want, err_msg=f"weight {i} is not rank 0's initial value"
        )


def test_broadcast_callback_with_distributed_optimizer_keeps_ranks_equal(hvd, hvdk):
    x, y = global_data()
    mine = local_rows(len(x), hvd.rank())
    model = make_model(seed=10 + hvd.rank())
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(1e-2)), loss=loss_fn())
    model.fit(
        x[mine],
        y[mine],
        batch_size=B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    assert_equal_across_ranks(hvd, weights_of(model), "bcast_cb_dopt")


def test_metric_average_callback(hvd, hvdk):
    x, y = global_data(steps=3, seed=77 + hvd.rank())  # different data: different losses per rank
    model = make_model(seed=3)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn(), metrics=["accuracy"])
    before, after = Recorder(), Recorder()
    history = model.fit(
        x,
        y,
        batch_size=B,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[before, hvdk.callbacks.MetricAverageCallback(), after],
    )
    keys = ["loss", "accuracy"]
    local = np.array([[logs[k] for k in keys] for logs in before.epoch_logs], np.float64)
    every = hvd.allgather(tf.constant(local[None]), name="metric_avg_check").numpy()  # (size, 2, 2)
    want = every.mean(axis=0)
    got = np.array([[logs[k] for k in keys] for logs in after.epoch_logs], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg="logs after MetricAverageCallback")
    np.testing.assert_allclose(history.history["loss"], want[:, 0], rtol=1e-5, err_msg="History")
    if SIZE > 1:
        assert not np.allclose(every[0], every[1]), (
            "test data should give different losses per rank"
        )


@pytest.mark.parametrize("steps_per_epoch", [None, 4], ids=["autodetect", "given"])
def test_learning_rate_warmup_callback(hvd, hvdk, steps_per_epoch):
    initial_lr, warmup, spe, epochs = 0.2, 2, 4, 3
    x, y = global_data(steps=spe)
    model = make_model(seed=0)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=initial_lr))
    model.compile(optimizer=opt, loss=loss_fn())
    rec = Recorder()
    model.fit(
        x,
        y,
        batch_size=SIZE * B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvdk.callbacks.LearningRateWarmupCallback(
                initial_lr, warmup_epochs=warmup, verbose=0, steps_per_epoch=steps_per_epoch
            ),
            rec,
        ],
    )
    # Horovod's schedule: at batch b of epoch e,
    # lr = initial_lr / size * (t * (size-1) / warmup + 1)
    # with t = e + (b + 1) / steps_per_epoch, ending at initial_lr; unchanged after the warmup.
    want = []
    for e in range(epochs):
        for b in range(spe):
            if e < warmup:
                t = e + (b + 1) / spe
                want.append(initial_lr / SIZE * (t * (SIZE - 1) / warmup + 1))
            else:
                want.append(initial_lr)
    np.testing.assert_allclose(rec.lrs, want, rtol=1e-6)


@pytest.mark.parametrize("staircase", [True, False], ids=["staircase", "smooth"])
def test_learning_rate_schedule_callback(hvd, hvdk, staircase):
    initial_lr, spe, epochs = 0.1, 4, 4
    x, y = global_data(steps=spe)
    model = make_model(seed=0)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=initial_lr), loss=loss_fn())
    rec = Recorder()
    model.fit(
        x,
        y,
        batch_size=SIZE * B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvdk.callbacks.LearningRateScheduleCallback(
                initial_lr,
                multiplier=lambda e: 0.5**e,
                start_epoch=1,
                end_epoch=3,
                staircase=staircase,
            ),
            rec,
        ],
    )
    want, lr = [], initial_lr
    for e in range(epochs):
        for b in range(spe):
            if 1 <= e < 3:
                lr = initial_lr * 0.5 ** (e if staircase else e + b / spe)
            want.append(lr)  # outside [start, end) the rate stays as it was
    np.testing.assert_allclose(rec.lrs, want, rtol=1e-6)


def test_broadcast_callback_keeps_local_variables(hvd, hvdk):
    x, y = global_data(steps=2)
    model = make_model(seed=hvd.rank())
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss=loss_fn())
    local = model.layers[-1].kernel
    mine = keras.ops.convert_to_numpy(local).copy()
    model.fit(
        x,
        y,
        batch_size=SIZE * B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local])],
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(local), mine)
    first = weights_of(model)[0]
    np.testing.assert_array_equal(first, rank0_initial_weights()[0])


def test_partial_distributed_optimizer_keeps_local_gradients(hvd, hvdk):
    r = hvd.rank()
    shared = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    local = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    shared.build((None, 1))
    local.build((None, 1))
    opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[local])
    # gradient (r + 1) for both kernels: the shared one is averaged, the local one divided by size
    opt.apply([tf.fill([1, 1], r + 1.0), tf.fill([1, 1], r + 1.0)], [shared.kernel, local.kernel])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(shared.kernel), [[-(SIZE + 1) / 2.0]])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(local.kernel), [[-(r + 1.0) / SIZE]])


def test_sync_batch_normalization_equals_batch_norm_on_the_global_batch(hvd, hvdk):
    r = hvd.rank()
    rng = np.random.default_rng(5)
    full = rng.normal(size=(SIZE * 3, 4)).astype(np.float32) * 3 + 1
    mine = full[r * 3 : (r + 1) * 3]
    bn = keras.layers.BatchNormalization(axis=1, momentum=0.5)
    sync = hvdk.SyncBatchNormalization(axis=1, momentum=0.5, fused=False)
    want = keras.ops.convert_to_numpy(bn(full, training=True))[r * 3 : (r + 1) * 3]
    got = keras.ops.convert_to_numpy(sync(mine, training=True))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(sync.moving_mean),
        keras.ops.convert_to_numpy(bn.moving_mean),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(sync.moving_variance),
        keras.ops.convert_to_numpy(bn.moving_variance),
        rtol=1e-5,
    )
    assert hvd.SyncBatchNormalization is hvdk.SyncBatchNormalization


def test_epoch_iterators_are_destroyed_off_the_training_thread(hvd, hvdk):
    """The train/test functions that _iterators.install wraps keep each epoch's tf.data
    iterator until the next one arrives, then a background thread destroys it; fit's result
    is the same as without the wrapper (keras.Model itself is wrapped too once a test made a
    DistributedOptimizer: the weights must agree either way)."""
    import threading
    import time
    import weakref

    from mtxcomm.tensorflow import _keras_iterators as _iterators

    class Released(keras.Sequential):
        pass

    _iterators.install(Released, tf)
    x, y = global_data()
    destroyed_on = []
    models = []
    for cls in (keras.Sequential, Released):
        keras.utils.set_random_seed(5)
        model = cls(make_model(7).layers)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        held = []

        class Watch(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None, watched=cls is Released):
                function = self.model.train_function
                if watched:
                    assert isinstance(function, _iterators._HoldsLastIterator), function
                    it = function._held
                    assert it is not None and all(it is not h for h in held)
                    held.append(it)
                    weakref.finalize(
                        it, lambda: destroyed_on.append(threading.current_thread().name)
                    )

        model.fit(
            x, y, batch_size=SIZE * B, epochs=3, verbose=0, shuffle=False, callbacks=[Watch()]
        )
        model.evaluate(x, y, batch_size=SIZE * B, verbose=0)
        if cls is Released:
            assert len(held) == 3
            held.clear()
            _iterators.release_held(model)
        models.append(model)
    deadline = time.monotonic() + 30
    while len(destroyed_on) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert destroyed_on == ["mtxcomm-iterator-release"] * 3
    for a, b in zip(models[0].get_weights(), models[1].get_weights()):
        np.testing.assert_array_equal(a, b)
    # A Horovod-style script gets it through DistributedOptimizer, for every model.
    hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert keras.Model.__dict__.get("_mtx_iterators_released") is True


def test_jit_compile_with_distributed_optimizer_trains_without_xla(hvd, hvdk):
    """compile(jit_compile=True) with a DistributedOptimizer: the train step is built without
    XLA (the collective ops have no XLA kernel), with a warning, and trains as the reference."""
    x, y = global_data()
    rows = local_rows(len(x), hvd.rank())
    keras.utils.set_random_seed(3)
    model = make_model(11)
    model.compile(
        optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    with pytest.warns(UserWarning, match="without XLA"):
        model.fit(x[rows], y[rows], batch_size=B, epochs=1, verbose=0, shuffle=False)
    assert model.jit_compile is True  # evaluate/predict keep it
    reference = make_model(11)
    reference.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    reference.fit(x, y, batch_size=SIZE * B, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
