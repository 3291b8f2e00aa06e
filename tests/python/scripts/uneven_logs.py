"""Plain Keras (no mtxcomm import): 97 rows in batches of 32, so the last batch has 1 row and
no batch splits evenly over 3 ranks. Writes the weights and the History of fit() to
sys.argv[1] ("{rank}" replaced by OMPI_COMM_WORLD_RANK) as JSON. With "train_on_batch" as
sys.argv[2]: after fit, one train_on_batch on the first 32 rows, its loss written too."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(97, 5)).astype("float32")
y = (x @ rng.normal(size=(5, 1))).astype("float32") + 0.1 * rng.normal(size=(97, 1)).astype(
    "float32"
)
model = keras.Sequential(
    [keras.Input(shape=(5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
)
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
on_batch = None
if sys.argv[2:] == ["train_on_batch"]:
    on_batch = float(model.train_on_batch(x[:32], y[:32])[0])
out = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(out, "w") as f:
    json.dump(
        {
            "history": history.history,
            "train_on_batch": on_batch,
            "weights": [w.tolist() for w in model.get_weights()],
        },
        f,
    )
