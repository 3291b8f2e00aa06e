"""Plain Keras (no mtxcomm import), for models whose form the transparent mode must handle as
the 1-process run does. sys.argv[1]: the output JSON ("{rank}" replaced by
OMPI_COMM_WORLD_RANK): weights (BatchNormalization's moving statistics included), the History
of fit() and predict() on held-out rows. sys.argv[2], the model:
  dict_outputs   inputs {"a", "b"} and outputs {"cls", "reg"}, fit with dict targets
  dict_weights   the same with dict sample weights
  batch_norm     Dense -> BatchNormalization -> relu -> Dense; 97 rows in batches of 32 (every
                 batch splits unevenly over 3 ranks, the last one has a single row)
  fit_twice      fit on 50 rows, then on 64 other rows, then on those changed in place; then
                 save("m.keras") and keras.models.load_model (its predictions are recorded)
  ratio_metrics  a classifier with AUC, Precision, Recall and F1Score (per class, an array) and
                 a weighted metric with sample weights, in batches of 15 (uneven splits); then
                 train_on_batch and test_on_batch, whose returned values are recorded
  custom_step    a two-output model whose per-output losses Keras tracks, a subclassed model
                 whose train_step keeps its own Mean loss tracker, and one whose test_step
                 returns only its own tracker (validation and evaluate); batches of 25 and 15
  manual_update  a train_step that assigns the weights itself (no optimizer): the transparent
                 mode must fail on every rank, naming a variable
  checkpoints    steps_per_execution=2; ModelCheckpoint of the best model (.keras) and of the
                 last weights (.weights.h5), both loaded right after fit (the predictions of
                 the model, the loaded best model, a new model given the loaded weights and the
                 best model loaded uncompiled); model.export of a SavedModel
  loss_forms     a loss with reduction "sum" and a custom metric whose result() is its state
                 variable itself, in batches of 15 (uneven splits)
  stop_on_rank0  a callback that stops training at the end of epoch 2 on rank 0 only (a
                 budget that runs out there first): every rank must stop with it
  guide_steps    keras.io's custom train_step and test_step, which return
                 {m.name: m.result() for m in self.metrics} (the compiled metrics' result is a
                 dict of theirs), with AUC and accuracy, validation and evaluate
  state_forms    a loss with reduction "sum" with weight and activity regularizers; a layer
                 that keeps a moving mean of its inputs, a float count of its calls (assigned
                 inside a cond), an integer count of steps and a count of rows (aggregation
                 "sum") in non-trainable weights assigned in call; a train_step that slices x,
                 fit on
                 NumPy x alone (Keras hands the step x itself); 65 rows in batches of 16 (the
                 last batch has a single row)
  two_optimizers keras.io's GAN form: compile(d_optimizer, g_optimizer) keeps two optimizers
                 as attributes (the compiled one is unused) and train_step applies each to
                 its sub-model (the latent vectors come from the rows, so that the runs agree
                 draw for draw); 256 rows from tf.data in batches of 64
  save_reload    save_weights and save to paths that hold an earlier save, the other ranks
                 reaching the save 1 s after rank 0, then load_weights and load_model at once,
                 on a thread of its own after model.export, tf.saved_model.save and load, and a
                 LambdaCallback that saves and loads at each epoch's end, a ModelCheckpoint
                 given to fit and then to evaluate: the loaded models are the latest, and
                 reloading takes under 10 s"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
form = sys.argv[2]
if form in ("dict_outputs", "dict_weights"):
    rows = 300
    x = rng.normal(size=(rows + 50, 8)).astype("float32")
    label = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")
    a = keras.Input((4,), name="a")
    b = keras.Input((4,), name="b")
    h = keras.layers.Concatenate()(
        [keras.layers.Dense(8, activation="relu")(a), keras.layers.Dense(8, activation="relu")(b)]
    )
    model = keras.Model(
        {"a": a, "b": b},
        {
            "cls": keras.layers.Dense(3, activation="softmax", name="cls")(h),
            "reg": keras.layers.Dense(1, name="reg")(h),
        },
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
        metrics={"cls": ["accuracy"]},
    )
    inputs = {"a": x[:, :4], "b": x[:, 4:]}
    train = {k: v[:rows] for k, v in inputs.items()}
    held = {k: v[rows:] for k, v in inputs.items()}
    targets = {"cls": label[:rows], "reg": x[:rows, 2:3] * 2.0}
    kwargs = {}
    if form == "dict_weights":
        kwargs["sample_weight"] = {
            "cls": np.linspace(0.2, 2.0, rows).astype("float32"),
            "reg": np.ones(rows, "float32"),
        }
    history = model.fit(train, targets, batch_size=40, epochs=2, shuffle=False, verbose=0, **kwargs)
    predicted = model.predict(held, batch_size=16, verbose=0)
    predicted = [predicted[k].tolist() for k in sorted(predicted)]
elif form == "fit_twice":
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    x1 = rng.normal(size=(50, 6)).astype("float32")
    x2 = rng.normal(size=(64, 6)).astype("float32") + 2.0
    h1 = model.fit(x1, x1[:, :1] - x1[:, 1:2], batch_size=7, epochs=2, verbose=0)
    y2 = x2[:, 2:3] * 3.0
    h2 = model.fit(x2, y2, batch_size=7, epochs=2, verbose=0)
    x2 *= -1.0  # the same arrays, changed in place
    y2 += 1.0
    h3 = model.fit(x2, y2, batch_size=7, epochs=1, verbose=0)
    history = keras.callbacks.History()
    history.history = {
        "%s_%s" % (tag, k): v
        for tag, h in (("a", h1), ("b", h2), ("c", h3))
        for k, v in h.history.items()
    }
    model.save("m.keras")
    loaded = keras.models.load_model("m.keras")
    predicted = [
        model.predict(x2[:9], verbose=0).tolist(),
        loaded.predict(x2[:9], verbose=0).tolist(),
    ]
elif form == "ratio_metrics":
    x = rng.normal(size=(70, 6)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("float32")[:, None]
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="binary_crossentropy",
        metrics=[
            keras.metrics.AUC(name="auc"),
            keras.metrics.Precision(name="prec"),
            keras.metrics.Recall(name="rec"),
            keras.metrics.F1Score(average=None, threshold=0.5, name="f1"),
        ],
        weighted_metrics=["accuracy"],
    )
    history = model.fit(
        x,
        y,
        sample_weight=np.linspace(0.1, 2.0, 70).astype("float32"),
        batch_size=15,
        epochs=2,
        verbose=0,
    )
    for i in range(0, 70, 15):
        for k, v in model.train_on_batch(x[i : i + 15], y[i : i + 15], return_dict=True).items():
            history.history.setdefault("train_on_batch_" + k, []).append(v)
    for k, v in model.test_on_batch(x[:35], y[:35], return_dict=True).items():
        history.history["test_on_batch_" + k] = [v]
    for got in (
        model.train_on_batch(x[:15], y[:15]),
        model.test_on_batch(x[:15], y[:15]),
        *model.test_on_batch(x[:15], y[:15], return_dict=True).values(),
    ):
        # (Keras returns Python floats, arrays for an array-valued metric such as F1Score's
        # per class; the transparent mode returned EagerTensors.)
        for v in got if isinstance(got, list) else [got]:
            if type(v) is not float and not (isinstance(v, np.ndarray) and v.ndim > 0):
                raise SystemExit("train_on_batch/test_on_batch returned a %s" % type(v))
    predicted = [model.predict(x[:9], verbose=0).tolist()]
elif form == "custom_step":
    a = rng.normal(size=(90, 5)).astype("float32")
    y1 = a.sum(1, keepdims=True)
    y2 = (a[:, 0] > 0).astype("int32")
    inp = keras.Input((5,))
    h = keras.layers.Dense(8, activation="tanh")(inp)
    model = keras.Model(
        inp,
        [
            keras.layers.Dense(1, name="reg")(h),
            keras.layers.Dense(2, activation="softmax", name="cls")(h),
        ],
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=["mse", "sparse_categorical_crossentropy"],
        loss_weights=[0.3, 1.7],
    )
    h1 = model.fit(a, [y1, y2], batch_size=25, epochs=2, verbose=0)

    class Tracked(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.tracker = keras.metrics.Mean(name="loss")

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            import tensorflow as tf

            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean(keras.ops.square(self(x) - y))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    own = Tracked()
    own.compile(optimizer=keras.optimizers.SGD(0.05))
    h2 = own.fit(a, y1, batch_size=15, epochs=2, verbose=0)

    class Evaluated(keras.Model):
        """A custom test_step returning its own tracker's result (not every metric's)."""

        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.error = keras.metrics.Mean(name="abs_error")

        def call(self, x, training=None):
            return self.dense(x)

        def test_step(self, data):
            x, y = data
            self.error.update_state(keras.ops.mean(keras.ops.abs(self(x) - y)))
            return {"abs_error": self.error.result()}

    ev = Evaluated()
    ev.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    h3 = ev.fit(
        a[:60], y1[:60], batch_size=15, epochs=2, verbose=0, validation_data=(a[60:], y1[60:])
    )
    h3.history["evaluate"] = [
        ev.evaluate(a, y1, batch_size=20, verbose=0, return_dict=True)["abs_error"]
    ]
    history = keras.callbacks.History()
    history.history = {
        "%s_%s" % (tag, k): v
        for tag, h in (("a", h1), ("b", h2), ("c", h3))
        for k, v in h.history.items()
    }
    predicted = [p.tolist() for p in model.predict(a[:9], verbose=0)] + [
        own.predict(a[:9], verbose=0).tolist()
    ]
elif form == "manual_update":
    import tensorflow as tf

    class Manual(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean(keras.ops.square(self(x) - y))
            for v, g in zip(
                self.trainable_variables, tape.gradient(loss, self.trainable_variables)
            ):
                v.assign_sub(0.1 * g)
            return {"loss": loss}

    x = rng.normal(size=(64, 4)).astype("float32")
    model = Manual()
    model.compile(optimizer="sgd")
    history = model.fit(x, x[:, :1] * 2.0, batch_size=16, epochs=2, verbose=0)
    predicted = []
elif form == "checkpoints":
    # Files named after this job's output: the 1-process run's must not stand in for them.
    tag = os.path.basename(sys.argv[1]).split(".")[0]
    best_path, last_path = tag + ".best.keras", tag + ".last.weights.h5"
    for path in (best_path, last_path):
        if os.path.exists(path):
            os.unlink(path)
    x = rng.normal(size=(90, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")

    def build():
        m = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        )
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=2)
        return m

    model = build()
    history = model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(best_path, monitor="loss", save_best_only=True),
            keras.callbacks.ModelCheckpoint(last_path, save_weights_only=True),
        ],
    )
    best = keras.models.load_model(best_path)
    fresh = build()
    fresh.load_weights(last_path)
    uncompiled = keras.models.load_model(best_path, compile=False)  # predict needs no optimizer
    model.export(tag + ".exported")  # a SavedModel directory, written by rank 0 alone
    predicted = [
        m.predict(x[:11], batch_size=4, verbose=0).tolist()
        for m in (model, best, fresh, uncompiled)
    ]
elif form == "loss_forms":
    x = rng.normal(size=(70, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")

    class RowCount(keras.metrics.Metric):
        def __init__(self, name="rows", **kwargs):
            super().__init__(name=name, **kwargs)
            self.count = self.add_variable(shape=(), initializer="zeros", name="count")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.count.assign_add(keras.ops.cast(keras.ops.shape(y_true)[0], "float32"))

        def result(self):
            return self.count  # the variable itself

    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.002),
        loss=keras.losses.MeanSquaredError(reduction="sum"),
        metrics=[RowCount()],
    )
    history = model.fit(x, y, batch_size=15, epochs=2, verbose=0)
    for k, v in model.evaluate(x, y, batch_size=15, verbose=0, return_dict=True).items():
        history.history["evaluate_" + k] = [v]
    predicted = [model.predict(x[:9], verbose=0).tolist()]
elif form == "state_forms":
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
else:
    x = rng.normal(size=(147, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x[:97], y[:97], batch_size=32, epochs=3, shuffle=False, verbose=0)
    predicted = [model.predict(x[97:], batch_size=16, verbose=0).tolist()]
out = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(out, "w") as f:
    json.dump(
        {
            "history": {
                k: [np.asarray(v).tolist() for v in vs] for k, vs in history.history.items()
            },
            "predict": predicted,
            "weights": [w.tolist() for w in model.get_weights()],
        },
        f,
    )
