"""model_forms.py's forms from state_forms on, run at import (module level, as in a plain
script): the form asked for leaves model, history and predicted."""

import os

import keras
import numpy as np
from _forms_setup import form, rng

if form == "state_forms":
    x = (rng.normal(size=(65, 6)) + np.arange(65)[:, None] / 30.0).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")

    class MovingCenter(keras.layers.Layer):
        def build(self, shape):
            self.mean = self.add_weight(
                shape=(shape[-1],), initializer="zeros", trainable=False, name="mean"
            )
            self.calls = self.add_weight(
                shape=(), initializer="zeros", trainable=False, name="calls"
            )
            self.steps = self.add_weight(
                shape=(), initializer="zeros", dtype="int64", trainable=False, name="steps"
            )
            self.rows = self.add_weight(
                shape=(), initializer="zeros", trainable=False, aggregation="sum", name="rows"
            )

        def call(self, inputs, training=False):
            out = inputs - self.mean
            if training:
                self.mean.assign(0.9 * self.mean + 0.1 * keras.ops.mean(inputs, axis=0))
                keras.ops.cond(
                    self.calls >= 0.0,
                    lambda: self.calls.assign_add(1.0),
                    lambda: keras.ops.convert_to_tensor(self.calls),
                )
                self.steps.assign_add(1)
                self.rows.assign_add(keras.ops.cast(keras.ops.shape(inputs)[0], "float32"))
            return out

    class Packed(keras.Model):
        def __init__(self):
            super().__init__()
            self.center = MovingCenter()
            self.hidden = keras.layers.Dense(
                4,
                activation="tanh",
                kernel_regularizer=keras.regularizers.L2(0.05),
                activity_regularizer=keras.regularizers.L2(0.01),
            )
            self.out = keras.layers.Dense(1)

        def call(self, inputs, training=False):
            return self.out(self.hidden(self.center(inputs, training=training)))

        def train_step(self, data):
            return super().train_step((data[:, :6], data[:, 6:]))  # data: x itself

    model = Packed()
    model(x[:1])
    model.compile(
        optimizer=keras.optimizers.SGD(0.002), loss=keras.losses.MeanSquaredError(reduction="sum")
    )
    history = model.fit(
        np.concatenate([x, y], 1), batch_size=16, epochs=2, shuffle=False, verbose=0
    )
    for k, v in model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True).items():
        history.history["evaluate_" + k] = [v]
    predicted = [model.predict(x[:9], verbose=0).tolist()]
elif form == "two_optimizers":
    import tensorflow as tf

    x = (rng.normal(size=(256, 4)) * 0.5 + 2).astype("float32")

    class GAN(keras.Model):
        def __init__(self):
            super().__init__()
            self.gen = keras.Sequential(
                [keras.Input((3,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(4)]
            )
            self.disc = keras.Sequential(
                [keras.Input((4,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(1)]
            )
            self.d_tracker = keras.metrics.Mean(name="d_loss")
            self.g_tracker = keras.metrics.Mean(name="g_loss")

        def compile(self, d_optimizer, g_optimizer):
            super().compile()
            self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
            self.bce = keras.losses.BinaryCrossentropy(from_logits=True)

        @property
        def metrics(self):
            return [self.d_tracker, self.g_tracker]

        def call(self, z):
            return self.gen(z)

        def train_step(self, real):
            z = real[:, :3] * 0.3
            with tf.GradientTape() as tape:
                p_real, p_fake = self.disc(real), self.disc(self.gen(z))
                d_loss = self.bce(tf.ones_like(p_real), p_real) + self.bce(
                    tf.zeros_like(p_fake), p_fake
                )
            grads = tape.gradient(d_loss, self.disc.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.disc.trainable_weights))
            with tf.GradientTape() as tape:
                p_fake = self.disc(self.gen(z))
                g_loss = self.bce(tf.ones_like(p_fake), p_fake)
            grads = tape.gradient(g_loss, self.gen.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.gen.trainable_weights))
            self.d_tracker.update_state(d_loss)
            self.g_tracker.update_state(g_loss)
            return {m.name: m.result() for m in self.metrics}

    model = GAN()
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.005))
    history = model.fit(tf.data.Dataset.from_tensor_slices(x).batch(64), epochs=3, verbose=0)
    predicted = [model.predict(x[:9, :3], verbose=0).tolist()]
elif form == "stop_on_rank0":
    x = rng.normal(size=(64, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

    class Budget(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1 and os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
                self.model.stop_training = True

    history = model.fit(x, y, batch_size=16, epochs=5, verbose=0, callbacks=[Budget()])
    predicted = [model.predict(x[:5], verbose=0).tolist()]
elif form == "guide_steps":
    import tensorflow as tf

    class Guide(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else metric.update_state(
                    y, y_pred
                )
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else metric.update_state(
                    y, y_pred
                )
            return {m.name: m.result() for m in self.metrics}

    x = rng.normal(size=(100, 6)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(size=100) > 0).astype("float32")[:, None]
    inp = keras.Input((6,))
    model = Guide(
        inp,
        keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, activation="relu")(inp)),
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), "accuracy"],
    )
    history = model.fit(
        x[:70],
        y[:70],
        batch_size=15,
        epochs=2,
        verbose=0,
        shuffle=False,
        validation_data=(x[70:], y[70:]),
    )
    for k, v in model.evaluate(x, y, batch_size=15, verbose=0, return_dict=True).items():
        history.history["evaluate_" + k] = [v]
    predicted = [model.predict(x[:9], verbose=0).tolist()]
elif form == "save_reload":
    import time

    def build():
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return m

    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    model = build()
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.save_weights("w.weights.h5")
    model.save("m.keras")
    # A SavedModel, then tf.saved_model.save (Model.export rebinds tf.saved_model on rank 0)
    # loaded at once; a callback that every rank runs saves and loads at each epoch's end.
    import tensorflow as tf

    late = os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0"
    model.export("exported_sr", verbose=False)
    if late:
        time.sleep(1.0)
    tf.saved_model.save(model, "saved_sr")
    tf.saved_model.load("saved_sr")

    def save_and_load(epoch, logs):
        if late:
            time.sleep(1.0)
        start = time.monotonic()
        model.save("cb.keras")
        keras.models.load_model("cb.keras")
        if time.monotonic() - start > 10:
            raise SystemExit("a callback's save and load took %.1f s" % (time.monotonic() - start))

    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=save_and_load)],
    )

    # A checkpoint object that fit runs on rank 0 alone, then evaluate on every rank: its save
    # there is a collective on every rank; the object pickles as a plain one.
    import pickle

    class Checkpoint(keras.callbacks.ModelCheckpoint):
        def on_test_end(self, logs=None):
            self.model.save_weights("eval.weights.h5")

    checkpoint = Checkpoint("ck.keras")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[checkpoint])
    model.evaluate(x, y, verbose=0, callbacks=[checkpoint])
    model.save("after.keras")
    pickle.dumps(checkpoint)

    def second(out):
        """Another epoch, then saves over the first ones and loads at once (on a thread of its
        own: the script's main thread is not special)."""
        try:
            out["history"] = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
            if os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":
                time.sleep(1.0)  # rank 0 has saved before this rank reaches the save
            start = time.monotonic()
            model.save_weights("w.weights.h5")
            model.save("m.keras")
            out["again"] = build()
            out["again"].load_weights("w.weights.h5")
            out["loaded"] = keras.models.load_model("m.keras")
            out["took"] = time.monotonic() - start
        except BaseException as e:  # (re-raised on the main thread)
            out["error"] = e

    import threading

    out = {}
    worker = threading.Thread(target=second, args=(out,))
    worker.start()
    worker.join()
    if "error" in out:
        raise out["error"]
    history, again, loaded = out["history"], out["again"], out["loaded"]
    if out["took"] > 10:
        raise SystemExit("saving and reloading took %.1f s" % out["took"])
    predicted = [
        again.predict(x[:9], verbose=0).tolist(),
        loaded.predict(x[:9], verbose=0).tolist(),
    ]
