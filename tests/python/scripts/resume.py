"""Plain Keras (no mtxcomm import): a fit of 5 epochs with BackupAndRestore, interrupted after
its second epoch when sys.argv[2] is "interrupt" (as a preempted job would be), resumed from
the backup when run again. Writes the History and the weights of the resumed run to
sys.argv[1] ("{rank}" replaced by OMPI_COMM_WORLD_RANK)."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(96, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1))).astype("float32")
model = keras.Sequential(
    [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
)
model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")


class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1 and sys.argv[2] == "interrupt":
            raise KeyboardInterrupt("preempted after epoch 2")


history = model.fit(
    x,
    y,
    batch_size=16,
    epochs=5,
    verbose=0,
    callbacks=[keras.callbacks.BackupAndRestore("backup"), Interrupt()],
)
out = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(out, "w") as f:
    json.dump(
        {
            "history": history.history,
            "weights": [w.tolist() for w in model.get_weights()],
            "epochs": history.epoch,
        },
        f,
    )
