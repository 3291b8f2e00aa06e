"""Plain Keras (no mtxcomm import): a callback stopping fit in the middle of an epoch on what
one batch's logs say. Row 170 of 256 (batch 2 of 64 rows, in rank 1's share at np=2) is
planted, so only the rank holding that row sees it in its per-batch logs. sys.argv[1]: the
output JSON ("{rank}" replaced by OMPI_COMM_WORLD_RANK): the optimizer's step count, the
History and whether every weight is NaN. sys.argv[2]:
  nan     row 170 is NaN; keras.callbacks.TerminateOnNaN
  lambda  row 170 is 1000 in every feature; a LambdaCallback (hooks set on the instance)
          whose on_train_batch_end stops when the epoch's running loss passes 1.5 (the
          1-process run at batch 2: 2.33; at np=2 rank 1's share only)"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(1)
x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
mode = sys.argv[2] if len(sys.argv) > 2 else "nan"
x[170] = np.nan if mode == "nan" else 1000.0
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])
model.compile(
    optimizer=keras.optimizers.SGD(0.05),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
history = model.fit(
    x,
    y,
    batch_size=64,
    epochs=3,
    shuffle=False,
    verbose=0,
    callbacks=[
        keras.callbacks.TerminateOnNaN()
        if mode == "nan"
        else keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda b, logs: (
                setattr(model, "stop_training", True) if logs["loss"] > 1.5 else None
            )
        )
    ],
)
out = {
    "steps": int(model.optimizer.iterations.numpy()),
    "epochs": len(history.history["loss"]),
    "all_nan": bool(all(np.isnan(np.asarray(w)).all() for w in model.trainable_weights)),
}
path = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(path, "w") as f:
    json.dump(out, f)
