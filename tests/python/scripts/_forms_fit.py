"""model_forms.py's forms up to loss_forms, run at import (module level, as in a plain
script): the form asked for leaves model, history and predicted."""

import os
import sys

import keras
import numpy as np
from _forms_setup import form, rng

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
