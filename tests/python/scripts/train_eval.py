"""A plain Keras script (no mtxcomm import): 2 epochs on scikit-learn's digits from a NumPy
input or a tf.data input, then evaluate and predict. Writes OUT (with "{rank}" replaced by
OMPI_COMM_WORLD_RANK) as JSON: weights, history, evaluate's results, predictions.
Usage: train_eval.py numpy|dataset OUT"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

kind, out = sys.argv[1], sys.argv[2]
digits = load_digits()
x = (digits.data / 16.0).astype("float32")[:1000]
y = digits.target.astype("int64")[:1000]
xt, yt = x[:203], y[:203]  # 203 rows: the last batch of 32 is 11 rows, uneven over ranks
keras.utils.set_random_seed(3)
model = keras.Sequential(
    [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
)
model.compile(
    optimizer=keras.optimizers.SGD(0.05),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
if kind == "numpy":
    hist = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=True)
else:
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    hist = model.fit(data, epochs=2, verbose=0)
ev = model.evaluate(xt, yt, batch_size=32, verbose=0, return_dict=True)
pred = model.predict(xt, batch_size=32, verbose=0)
path = out.replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(path, "w") as f:
    json.dump(
        {
            "weights": [w.tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
            "evaluate": {k: float(v) for k, v in ev.items()},
            "predict": pred.tolist(),
        },
        f,
    )
