"""mtxcomm.tensorflow.keras's callbacks, SyncBatchNormalization, PartialDistributedOptimizer,
the epoch iterators and jit_compile. Run like test_keras.py, in the same session."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_common import (
    SIZE,
    B,
    assert_equal_across_ranks,
    global_data,
    local_rows,
    loss_fn,
    make_model,
    rank0_initial_weights,
    weights_of,
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
