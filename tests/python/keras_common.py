"""What the tests of mtxcomm.tensorflow.keras (test_keras*.py) share: the model, the data
and a 1-process reference training."""

import keras
import numpy as np
import tensorflow as tf
from conftest import launched_size

SIZE = launched_size()
B = 8  # rows per rank in each global batch
STEPS = 6  # global batches per epoch
FEATURES, CLASSES = 8, 4


# ---------------------------------------------------------------------------------------------
# helpers


def make_model(seed, policy=None):
    """A small dense classifier whose initial weights depend only on SEED."""
    kw = {"dtype": policy} if policy else {}
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(
                16,
                activation="tanh",
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
                bias_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=seed + 100),
                **kw,
            ),
            keras.layers.Dense(
                CLASSES,
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 200),
                dtype="float32",  # logits in float32 also under a mixed policy
            ),
        ]
    )


def global_data(steps=STEPS, seed=1234):
    """STEPS global batches of SIZE*B rows, the same on every rank."""
    rng = np.random.default_rng(seed)
    n = steps * SIZE * B
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    return x, y


def local_rows(n, rank, steps=STEPS):
    """Indices of RANK's share: rows [rank*B, (rank+1)*B) of every global batch of SIZE*B."""
    g = SIZE * B
    return np.concatenate(
        [np.arange(i * g + rank * B, i * g + (rank + 1) * B) for i in range(steps)]
    )


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def weights_of(model):
    return [np.array(w) for w in model.get_weights()]


def gather_rows(hvd, arrays, name):
    """For each array, the list of every rank's copy (via allgather)."""
    out = []
    for i, a in enumerate(arrays):
        flat = tf.reshape(tf.convert_to_tensor(a), [1, -1])
        got = hvd.allgather(flat, name=f"{name}_{i}").numpy()
        out.append([got[k].reshape(np.shape(a)) for k in range(SIZE)])
    return out


def assert_equal_across_ranks(hvd, arrays, name):
    for i, copies in enumerate(gather_rows(hvd, arrays, name)):
        for k in range(1, SIZE):
            assert np.array_equal(copies[0], copies[k]), f"weight {i}: rank {k} differs from rank 0"


def max_abs_diff(a_list, b_list):
    return max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
        for a, b in zip(a_list, b_list)
    )


def reference_fit(init_weights, x, y, optimizer, epochs, policy=None):
    """The 1-process run: the same model on the whole global batches, plain optimizer."""
    model = make_model(0, policy)
    model.set_weights(init_weights)
    model.compile(optimizer=optimizer, loss=loss_fn())
    model.fit(x, y, batch_size=SIZE * B, epochs=epochs, shuffle=False, verbose=0)
    return weights_of(model)


def rank0_initial_weights(policy=None):
    return weights_of(make_model(0, policy))
