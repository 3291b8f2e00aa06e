"""Plain Keras (no mtxcomm import) whose ranks build different arrays, as a script does that
draws its data or its split from an unseeded generator (np.random.default_rng()): under
`mtxrun --transparent` the call named by sys.argv[1] must fail on every rank, naming the
argument that differs, instead of training on (or predicting from) a mix of the ranks' rows.
  fit_x        x differs (rank 1's rows are shifted)
  fit_y        y differs
  fit_val      validation_data differs
  evaluate     the arrays of a later evaluate differ (fit's are the same)
  predict      the x of a later predict differs
  same         every rank's arrays are the same: runs to the end and writes done.RANK in the
               working directory"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

mode = sys.argv[1]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x.sum(1, keepdims=True) > 0).astype("float32")
other = rank if rank == 1 else 0  # rank 1 alone holds other values


def shifted(a, when):
    return a + other if mode == when else a


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="sgd", loss="binary_crossentropy")
model.fit(
    shifted(x, "fit_x"),
    shifted(y, "fit_y"),
    batch_size=16,
    epochs=1,
    verbose=0,
    validation_data=(shifted(x[:16], "fit_val"), y[:16]),
)
model.evaluate(shifted(x, "evaluate"), y, verbose=0)
model.predict(shifted(x, "predict"), verbose=0)
with open("done.%d" % rank, "w") as f:  # (not stdout: the ranks' lines interleave there)
    f.write("done")
