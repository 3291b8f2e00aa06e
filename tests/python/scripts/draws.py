"""Plain Keras (no mtxcomm import): where a train step's random draws come from. A Probe layer
records, at every training step, a Dropout mask of a constant input (Dropout's own seed
generator), a draw from its own keras.random.SeedGenerator and a draw with an integer seed
(stateless: the same at every call). sys.argv[1]: the output JSON ("{rank}" replaced by
OMPI_COMM_WORLD_RANK) with the records and the trained weights."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

STEPS = 6
keras.utils.set_random_seed(3)


class Probe(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.dropout = keras.layers.Dropout(0.5)
        self.gen = keras.random.SeedGenerator(11)

    def build(self, shape):
        import tensorflow as tf

        # Each rank's own records: plain tf.Variables, not the layer's weights (the transparent
        # mode combines over the ranks what a train step assigns to a model's weights).
        self.step = tf.Variable(0, dtype=tf.int32, trainable=False)
        self.masks = tf.Variable(tf.zeros((STEPS, 16)), trainable=False)
        self.drawn = tf.Variable(tf.zeros((STEPS, 3)), trainable=False)
        self.fixed = tf.Variable(tf.zeros((STEPS, 3)), trainable=False)

    def call(self, x, training=False):
        if training:
            import tensorflow as tf

            i = tf.reshape(tf.convert_to_tensor(self.step), (1, 1))
            mask = tf.cast(self.dropout(tf.ones((1, 16)), training=True)[0] > 0, "float32")
            self.masks.assign(tf.tensor_scatter_nd_update(self.masks, i, [mask]))
            self.drawn.assign(
                tf.tensor_scatter_nd_update(
                    self.drawn, i, [keras.random.uniform((3,), seed=self.gen)]
                )
            )
            self.fixed.assign(
                tf.tensor_scatter_nd_update(self.fixed, i, [keras.random.uniform((3,), seed=7)])
            )
            self.step.assign_add(1)
        return x


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
probe = Probe()
model = keras.Sequential(
    [keras.Input((8,)), probe, keras.layers.Dropout(0.3), keras.layers.Dense(2)]
)
model.compile(
    optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
model.fit(x, y, batch_size=32, epochs=STEPS // 2, shuffle=False, verbose=0)
out = {
    "masks": np.asarray(probe.masks).tolist(),
    "drawn": np.asarray(probe.drawn).tolist(),
    "fixed": np.asarray(probe.fixed).tolist(),
    "weights": [np.asarray(w).tolist() for w in model.trainable_weights],
}
path = sys.argv[1].replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(path, "w") as f:
    json.dump(out, f)
