"""Train a small dense network on scikit-learn's 8x8 digits with plain Keras 3.

This script does not know about mtxcomm: run it as is with `python`, or data-parallel,
unmodified, with `mtxrun -np 2 --transparent python examples/keras_digits.py`. In the
transparent mode the batch size stays the global batch (32), so an N-rank run follows the
1-process run.

Options:
  --epochs N          training epochs (default 30: test accuracy ~0.97 at np=1 and np=2)
  --seed S            calls keras.utils.set_random_seed(S) (initial weights, shuffling)
  --save-weights P    writes model.get_weights() to P with np.savez (arr_0, arr_1, ...)
  --checkpoint P      adds keras.callbacks.ModelCheckpoint(P)
  --verbose V         model.fit verbosity (default 2: one line per epoch)

In P, the text "{rank}" is replaced by the launcher's rank (OMPI_COMM_WORLD_RANK, 0 when
not set), so that every rank of a run can write its own file (`--save-weights W.{rank}.npz`);
the script reads only that environment variable, it imports nothing from mtxcomm.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

BATCH_SIZE = 32
# 1797 samples: 453 for the test set leaves 1344 = 42 * 32 training rows, so every global
# batch is full (and splits evenly over 2 ranks).
TEST_SIZE = 453


class EpochTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch (training steps only, no evaluation)."""

    def __init__(self):
        super().__init__()
        self.seconds = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def rank_path(path):
    """PATH with "{rank}" replaced by the launcher's rank (0 outside a launcher)."""
    return path.replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")  # pixel values are 0..16
    y = digits.target.astype("int64")
    return train_test_split(x, y, test_size=TEST_SIZE, random_state=0, stratify=y)


def build_model():
    model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--save-weights", default=None, metavar="PATH")
    parser.add_argument("--checkpoint", default=None, metavar="PATH")
    parser.add_argument("--verbose", type=int, default=2)
    args = parser.parse_args()

    if args.seed is not None:
        keras.utils.set_random_seed(args.seed)

    x_train, x_test, y_train, y_test = load_data()
    model = build_model()

    timer = EpochTimer()
    callbacks = [timer]
    if args.checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint(rank_path(args.checkpoint)))

    model.fit(
        x_train,
        y_train,
        batch_size=BATCH_SIZE,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=args.verbose,
    )
    _, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    print(f"test accuracy: {accuracy:.4f}")
    # The first epoch includes tracing the training step; report the steady state too.
    steady = timer.seconds[1:] or timer.seconds
    print(
        f"seconds per epoch: {np.median(steady):.3f} (median), first epoch {timer.seconds[0]:.3f}"
    )

    if args.save_weights:
        np.savez(rank_path(args.save_weights), *model.get_weights())


if __name__ == "__main__":
    main()
