"""Plain Keras (no mtxcomm import), for models whose form the transparent mode must handle as
the 1-process run does. sys.argv[1]: the output JSON ("{rank}" replaced by
OMPI_COMM_WORLD_RANK): weights (BatchNormalization's moving statistics included), the History
of fit() and predict() on held-out rows. sys.argv[2], the model:
  dict_outputs   inputs {"a", "b"} and outputs {"cls", "reg"}, fit with dict targets
  dict_weights   the same with dict sample weights
  batch_norm     Dense -> BatchNormalization -> relu -> Dense; 97 rows in batches of 32 (every
                 batch splits unevenly over 3 ranks, the last one has a single row)"""

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
    h = keras.layers.Concatenate()([keras.layers.Dense(8, activation="relu")(a),
                                    keras.layers.Dense(8, activation="relu")(b)])
    model = keras.Model({"a": a, "b": b},
                        {"cls": keras.layers.Dense(3, activation="softmax", name="cls")(h),
                         "reg": keras.layers.Dense(1, name="reg")(h)})
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
                  metrics={"cls": ["accuracy"]})
    inputs = {"a": x[:, :4], "b": x[:, 4:]}
    train = {k: v[:rows] for k, v in inputs.items()}
    held = {k: v[rows:] for k, v in inputs.items()}
    targets = {"cls": label[:rows], "reg": x[:rows, 2:3] * 2.0}
    kwargs = {}
    if form == "dict_weights":
        kwargs["sample_weight"] = {"cls": np.linspace(0.2, 2.0, rows).astype("float32"),
                                   "reg": np.ones(rows, "float32")}
    history = model.fit(train, targets, batch_size=40, epochs=2, shuffle=False, verbose=0,
                        **kwargs)
    predicted = model.predict(held, batch_size=16, verbose=0)
    predicted = [predicted[k].tolist() for k in sorted(predicted)]
else:
    x = rng.normal(size=(147, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6),
                              keras.layers.BatchNormalization(), keras.layers.Activation("relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x[:97], y[:97], batch_size=32, epochs=3, shuffle=False, verbose=0)
    predicted = [model.predict(x[97:], batch_size=16, verbose=0).tolist()]
out = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(out, "w") as f:
    json.dump({"history": history.history, "predict": predicted,
               "weights": [w.tolist() for w in model.get_weights()]}, f)
