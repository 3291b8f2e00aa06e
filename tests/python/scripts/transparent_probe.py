"""A plain Keras script (no mtxcomm import) that records which training rows it computes on.

    python transparent_probe.py OUT.{rank}.json
    mtxrun -np 2 --transparent python transparent_probe.py OUT.{rank}.json

Column 0 of every input row is the row's id. A layer records, at every training step, the
ids of the rows of the batch it was given (eagerly: run_eagerly=True), and the script writes
them to OUT ("{rank}" replaced by OMPI_COMM_WORLD_RANK, 0 when not set) as JSON:
{"steps": [[ids of step 0], [ids of step 1], ...]}. With --transparent over N ranks, each
rank must see its 1/N share of every global batch of the 1-process run.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

ROWS, FEATURES, BATCH, EPOCHS = 128, 4, 32, 2


class RecordRows(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = []

    def call(self, x, training=None):
        if training:
            self.steps.append([int(v) for v in keras.ops.convert_to_numpy(x[:, 0])])
        return x


def main():
    out = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    keras.utils.set_random_seed(3)
    x = np.random.default_rng(0).normal(size=(ROWS, FEATURES)).astype("float32")
    x[:, 0] = np.arange(ROWS)
    y = (x[:, 1] > 0).astype("int64")
    probe = RecordRows()
    model = keras.Sequential([keras.Input((FEATURES,)), probe, keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,
    )
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=True, verbose=0)
    with open(out, "w") as f:
        json.dump({"steps": probe.steps}, f)


if __name__ == "__main__":
    main()
