"""A compute-bound plain Keras 3 MLP (64 -> 1024 -> 1024 -> 10, 1.1 M parameters) on
scikit-learn's digits tiled 4x (7168 rows = 28 global batches of 256), SGD. It imports nothing
from mtxcomm: run it with `python` or, unchanged, with `mtxrun -np N --transparent python`.

Prints one line: "ms per step: M (median epoch of E, steps S, global batch B)". The first epoch
(tracing) is not counted.

  --epochs E   (default 6)     --batch B (default 256)     --strategy mwms
  --strategy mwms: the same model under tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG
  set by the caller, one process per worker); the global batch stays B.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--strategy", choices=["none", "mwms"], default="none")
    args = p.parse_args()

    import keras
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.tile((digits.data / 16.0).astype("float32"), (4, 1))
    y = np.tile(digits.target.astype("int64"), 4)
    rows = len(x) // args.batch * args.batch
    x, y = x[:rows], y[:rows]
    keras.utils.set_random_seed(1)

    def build():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    if args.strategy == "mwms":
        # Keras 3's fit() does not take a MultiWorkerMirroredStrategy dataset (it fails
        # converting its PerReplica values), so the MWMS version is TensorFlow's documented
        # custom loop: strategy.run over a distributed dataset, loss scaled to the global batch.
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = build()
            opt = keras.optimizers.SGD(0.01)
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        data = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
        )

        @tf.function
        def step(iterator):
            def replica(xb, yb):
                with tf.GradientTape() as tape:
                    per_row = loss_fn(yb, model(xb, training=True))
                    loss = tf.nn.compute_average_loss(per_row, global_batch_size=args.batch)
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            xb, yb = next(iterator)
            return strategy.run(replica, args=(xb, yb))

        seconds = []
        steps = rows // args.batch
        for _ in range(args.epochs):
            it = iter(data)
            t = time.perf_counter()
            for _ in range(steps):
                step(it)
            seconds.append(time.perf_counter() - t)
        median = sorted(seconds[1:])[(len(seconds) - 1) // 2]
        print(
            "ms per step: %.2f (median epoch of %d, steps %d, global batch %d)"
            % (median / steps * 1e3, len(seconds) - 1, steps, args.batch),
            flush=True,
        )
        return
    else:
        model = build()
        fit_args = (x, y)
        fit_kwargs = {"batch_size": args.batch, "shuffle": False}

    seconds = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.t)

    model.fit(*fit_args, epochs=args.epochs, verbose=0, callbacks=[Timer()], **fit_kwargs)
    steps = rows // args.batch
    median = sorted(seconds[1:])[(len(seconds) - 1) // 2]
    print(
        "ms per step: %.2f (median epoch of %d, steps %d, global batch %d)"
        % (median / steps * 1e3, len(seconds) - 1, steps, args.batch),
        flush=True,
    )


if __name__ == "__main__":
    main()
