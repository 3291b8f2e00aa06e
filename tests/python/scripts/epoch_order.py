"""Plain Keras (no mtxcomm import): which rows every training step of every epoch sees. The
input's single feature is the row's number; a Probe layer records the rows of each step it is
given. argv: OUT ("{rank}" replaced by OMPI_COMM_WORLD_RANK) [--seed S] [--no-shuffle]
[--rows R] [--batch B] [--epochs E] [--fits F] [--steps-per-execution K].
Writes OUT as JSON: for each fit, for each
epoch, the list of steps, each the list of row numbers this process trained on.
Several runs in one process: their arguments separated by "--then" (OUT [options] --then OUT
[options] ...), run one after the other, each with a new model after
keras.backend.clear_session(), as a script of its own would (one TensorFlow import serves
them all; a run without --seed draws from where the runs before it left the generators)."""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--seed", type=int)
p.add_argument("--no-shuffle", action="store_true")
p.add_argument("--rows", type=int, default=45)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--fits", type=int, default=1)
p.add_argument("--steps-per-execution", type=int, default=1)
runs, argv = [], []
for a in sys.argv[1:] + ["--then"]:
    if a == "--then":
        runs.append(p.parse_args(argv))
        argv = []
    else:
        argv.append(a)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def run(args):
    if args.seed is not None:
        keras.utils.set_random_seed(args.seed)

    seen = []

    class Probe(keras.layers.Layer):
        def call(self, x, training=False):
            if training:

                def note(rows):
                    seen.append(rows.numpy().ravel().astype(int).tolist())
                    return np.int32(0)

                tf.py_function(note, [x], tf.int32)
            return x

    x = np.arange(args.rows, dtype="float32").reshape(-1, 1)
    y = np.zeros(args.rows, dtype="float32")
    model = keras.Sequential([keras.Input((1,)), Probe(), keras.layers.Dense(1)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="mse",
        steps_per_execution=args.steps_per_execution,
    )
    fits = []
    for _ in range(args.fits):
        epochs = []

        class Epochs(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                seen.clear()

            def on_epoch_end(self, epoch, logs=None):
                epochs.append(list(seen))

        model.fit(
            x,
            y,
            batch_size=args.batch,
            epochs=args.epochs,
            shuffle=not args.no_shuffle,
            callbacks=[Epochs()],
            verbose=0,
        )
        fits.append(epochs)
    out = args.out.replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    with open(out, "w") as f:
        json.dump(fits, f)


for i, args in enumerate(runs):
    if i:
        keras.backend.clear_session()
    run(args)
