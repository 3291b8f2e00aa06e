"""A Horovod-style Keras script (after Horovod's tensorflow2_keras_mnist.py) on load_digits.

    mtxrun -np 2 python tests/python/scripts/horovod_style_keras.py [--epochs N]

Only the import differs from a Horovod script. Each rank trains on its shard of the training
set; the learning rate is scaled by the number of ranks and warmed up; rank 0 prints progress,
the test accuracy ("horovod-style test accuracy: X") and writes the checkpoint.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import mtxcomm.tensorflow.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--checkpoint-dir", default=None)
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

digits = load_digits()
x = (digits.data / 16.0).astype("float32")
y = digits.target.astype("int64")
x_train, x_test, y_train, y_test = train_test_split(
    x, y, test_size=0.25, random_state=0, stratify=y
)
# Horovod: each rank trains on its own shard.
x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]

model = keras.Sequential(
    [
        keras.Input(shape=(64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)

# Horovod: adjust learning rate based on number of ranks.
scaled_lr = 0.001 * hvd.size()
opt = keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0 and args.checkpoint_dir:
    callbacks.append(
        keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")
        )
    )

# Horovod: write logs on worker 0.
verbose = 2 if hvd.rank() == 0 else 0

model.fit(x_train, y_train, batch_size=32, callbacks=callbacks, epochs=args.epochs, verbose=verbose)

_, accuracy = model.evaluate(x_test, y_test, verbose=0)
# Every rank evaluates the same test set with the same (broadcast, averaged) weights.
accuracies = hvd.allgather(np.array([accuracy], np.float32), name="final_accuracy").numpy()
if hvd.rank() == 0:
    print(f"horovod-style test accuracy: {accuracy:.4f}")
    print(f"accuracy per rank: {' '.join(f'{a:.4f}' for a in accuracies)}")
