"""Plain Keras (no mtxcomm import) whose generator yields 3 batches on rank 0 and 6 on the
others (it depends on the process): under --transparent the ranks' batches do not match, and
the stall error must say what usually causes it; the job must then end."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

batches = 3 if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0" else 6


def rows():
    rng = np.random.default_rng(0)
    for _ in range(batches):
        x = rng.normal(size=(8, 4)).astype("float32")
        yield x, x.sum(1, keepdims=True)


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(rows(), epochs=1, verbose=0)
print("FIT_RETURNED", flush=True)
