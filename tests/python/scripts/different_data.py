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
               working directory
  each         each of the above in turn in one job, going on after each failure; writes
               MODE.RANK: "done", or the exception's type and message"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x.sum(1, keepdims=True) > 0).astype("float32")
other = rank if rank == 1 else 0  # rank 1 alone holds other values


def run(mode):
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


if sys.argv[1] != "each":
    run(sys.argv[1])
    with open("done.%d" % rank, "w") as f:  # (not stdout: the ranks' lines interleave there)
        f.write("done")
else:
    # Every mode in turn in one job: each failing call's message goes to MODE.RANK.err, and
    # the job goes on with the next mode (the check fails every rank alike, before the call
    # communicates), then "same" runs to the end.
    for mode in ("fit_x", "fit_y", "fit_val", "evaluate", "predict", "same"):
        try:
            run(mode)
            outcome = "done"
        except Exception as e:  # noqa: BLE001 (the message is what the test checks)
            outcome = "%s: %s" % (type(e).__name__, e)
        with open("%s.%d" % (mode, rank), "w") as f:
            f.write(outcome)
