"""fit's input, sharded so that each rank produces only its rows of every global batch
(:func:`_shard_input`): a ``tf.data`` dataset mapped to each rank's rows; NumPy arrays held in
variables (:func:`_hold_arrays`) from which the train step gathers its rows by index, the
batches of row indices coming from one iterator for the whole fit (:func:`_index_epochs`);
anything else cut in the train step. Also the seed that ``_keras_import`` drew on rank 0
(``_unseeded``), which keys the index permutations of a script that set no seed."""

from ._share import _rows, _share, _take
from ._tf import tf_module


def _numpy_structure(x):
    """x as a structure of NumPy arrays of one length, or None when it is not one."""
    import numpy as np

    tf = tf_module()
    if x is None:
        return None
    flat = tf.nest.flatten(x)
    if not flat or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in flat):
        return None
    n = len(flat[0])
    return x if all(len(a) == n for a in flat) else None


def _shard_input(model, arguments, tf):
    """Each rank produces only its rows of every global batch (see the module docstring)."""
    previous = getattr(model, "_mtx_input", None)
    _choose_input(model, arguments, tf)
    if model._mtx_input != previous:
        model.train_function = None  # traced for the other kind of input


def _choose_input(model, arguments, tf):
    import math

    import numpy as np

    x, y = arguments.get("x"), arguments.get("y")
    sw = arguments.get("sample_weight")
    if isinstance(x, tf.data.Dataset) and getattr(model, "built", False):
        # (Keras inspects the first element to build a model that is not built yet: such a
        # model's data is cut in the train step instead.)
        n, r = model._mtx_size, model._mtx_rank

        def mine(*element):
            data = element[0] if len(element) == 1 else element
            start, end, _ = _share(_rows(data), n, r)
            return _take(data, start, end), _rows(data)

        arguments["x"] = x.map(mine, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        model._mtx_input = "dataset"
        return
    if arguments.get("class_weight") is not None or _numpy_structure(x) is None:
        model._mtx_input = "step"
        return
    for other in (y, sw):
        if other is not None and _numpy_structure(other) is None:
            model._mtx_input = "step"
            return
    rows = len(tf.nest.flatten(x)[0])
    if any(len(a) != rows for a in tf.nest.flatten((y, sw)) if a is not None):
        model._mtx_input = "step"  # Keras reports the mismatch itself
        return
    split = arguments.get("validation_split") or 0.0
    if split and arguments.get("validation_data") is None:
        # Keras' own split (the last fraction of the rows), done here so that validation sees
        # the rows themselves.
        at = int(math.floor(rows * (1.0 - split)))
        arguments["validation_data"] = tf.nest.map_structure(
            lambda a: None if a is None else a[at:], (x, y, sw)
        )
        if sw is None:
            arguments["validation_data"] = arguments["validation_data"][:2]
        x, y, sw = tf.nest.map_structure(lambda a: None if a is None else a[:at], (x, y, sw))
        arguments["validation_split"] = 0.0
        rows = at
    # The arrays stay here; the train step gathers its rows by index. The batches of row
    # indices come from one iterator for the whole fit (_index_epochs), or, where their order
    # cannot be reproduced, from Keras' own batching and shuffling of the indices, which picks
    # the rows a 1-process run would (the permutation does not depend on the data).
    _hold_arrays(model, (x, y, sw), tf)
    arguments["y"] = None
    arguments["sample_weight"] = None
    model._mtx_input = "indices"
    epochs = _index_epochs(rows, arguments, getattr(model, "steps_per_execution", 1), tf)
    if epochs is None:
        arguments["x"] = np.arange(rows, dtype=np.int64)
        return
    batch = arguments.get("batch_size") or 32  # (Keras' default)
    arguments["x"], arguments["steps_per_epoch"] = epochs
    arguments["batch_size"] = None
    arguments["shuffle"] = False  # (the dataset's order; Keras warns that it ignores True)
    if arguments.get("validation_batch_size") is None:
        arguments["validation_batch_size"] = batch  # fit's own default: the batch size


# Seeds of the index permutations of fits whose script set no seed of its own: rank 0's draw
# (the same on every rank) and the number of such fits so far (every rank calls fit alike).
_unseeded = {"seed": None, "fits": 0}


def _keras_index_batches(rows, batch, shuffle, tf):
    """The batches of row indices Keras' own pipeline for NumPy arrays gives an epoch, if it
    gives the same ones every epoch, else None. Keras (3.x, TensorFlow backend) makes a new
    iterator every epoch and re-instantiates its pipeline's functions there: about 8-20 ms of
    one core per epoch, mostly TensorFlow's graph optimizer, on the training thread. With a
    global seed set its shuffle then yields one permutation in every epoch (its random op
    starts from the same seed in each new iterator), so that epoch's batches, repeated, are
    what it would give; checked on two of its epochs, not assumed."""
    try:
        import numpy as np
        from keras.src.trainers.data_adapters import array_data_adapter

        adapter = array_data_adapter.ArrayDataAdapter(
            np.arange(rows, dtype=np.int64), batch_size=batch, shuffle=shuffle
        )
        dataset = adapter.get_tf_dataset()
        first = [b.numpy() for b in dataset]
        second = [b.numpy() for b in dataset]
    except Exception:  # another Keras: its own path
        return None
    if len(first) != len(second) or any(
        a.shape != b.shape or (a != b).any() for a, b in zip(first, second)
    ):
        return None
    return first


def _index_epochs(rows, arguments, steps_per_execution, tf):
    """(dataset of row-index batches for every epoch, steps per epoch) for a NumPy fit, or None
    to leave the batching to Keras. Keras' loop then keeps one iterator for the whole fit
    (fit's steps_per_epoch with an endless dataset) instead of making one per epoch:
    - a script that set its own seed, or shuffle=False: Keras' batches of one epoch, repeated
      (_keras_index_batches): the 1-process run's, every epoch;
    - a script that set none (the seed is the one install drew on rank 0): a new permutation
      every epoch, as a 1-process run without a seed draws (Keras would repeat one, under that
      seed), the same on every rank: a stateless shuffle keyed by the seed, the fit's number
      and the epoch.
    shuffle="batch", a steps_per_epoch of the script, keras.config's max steps per epoch and a
    steps_per_execution that does not divide the epoch's steps keep Keras' own path (its last
    execution of an epoch takes the batches left; from an endless dataset it would take the
    next epoch's)."""
    import math

    import keras
    import numpy as np

    shuffle = arguments.get("shuffle", True)
    if shuffle not in (True, False) or arguments.get("steps_per_epoch") is not None:
        return None
    max_steps = getattr(getattr(keras, "config", None), "max_steps_per_epoch", None)
    if max_steps is not None and max_steps():
        return None
    batch = arguments.get("batch_size") or 32
    if not isinstance(batch, int) or batch <= 0 or rows <= 0:
        return None  # Keras reports it
    steps = math.ceil(rows / batch)
    if (
        not isinstance(steps_per_execution, int)
        or steps_per_execution < 1
        or steps % steps_per_execution
    ):
        return None
    full = rows // batch * batch

    def batches(order):
        """One epoch's batches of an order of the rows: full batches, then the rest."""
        data = tf.data.Dataset.from_tensor_slices(tf.reshape(order[:full], [-1, batch]))
        if full < rows:
            data = data.concatenate(tf.data.Dataset.from_tensors(order[full:]))
        return data

    seed = _unseeded["seed"]
    if not shuffle or seed is None or _global_seed() != seed:
        keras_batches = _keras_index_batches(rows, batch, shuffle, tf)
        if keras_batches is None or len(keras_batches) != steps:
            return None
        order = np.concatenate(keras_batches)
        return tf.data.Dataset.from_tensors(order).repeat().flat_map(batches), steps
    fit = _unseeded["fits"]
    _unseeded["fits"] += 1

    def permutation(epoch):
        return tf.random.experimental.stateless_shuffle(
            tf.range(rows, dtype=tf.int64),
            seed=tf.stack([tf.constant(seed, tf.int64), fit * (1 << 32) + epoch]),
        )

    data = tf.data.Dataset.range(1 << 62).map(permutation).flat_map(batches)
    return data.prefetch(1), steps


def _global_seed():
    """TensorFlow's global seed (tf.random.set_seed, keras.utils.set_random_seed), or None
    when it cannot be read (then a script is taken to have set its own)."""
    try:
        from tensorflow.python.eager import context

        return context.global_seed()
    except Exception:
        return None


def _hold_arrays(model, arrays, tf):
    """This fit's arrays as the variables the traced train step gathers its rows from
    (model._mtx_arrays): a later fit with other arrays, or the same arrays changed in place,
    assigns its rows to them (any number of rows), so the step never trains on an earlier
    fit's data; arrays of another structure, dtype or row shape get new variables and a new
    trace. Not through Keras' attribute tracking: it would wrap dicts and lists of targets in
    its own tracked types, which its loss no longer matches to the outputs, and save the data
    with the model."""

    def spec(a):
        return None if a is None else (str(a.dtype), tuple(a.shape[1:]))

    signature = tf.nest.map_structure(spec, arrays)  # the structure too (dict keys, tuples)
    held = getattr(model, "_mtx_arrays", None)
    if held is not None and getattr(model, "_mtx_arrays_signature", None) == signature:
        for v, a in zip(tf.nest.flatten(held), tf.nest.flatten(arrays)):
            if a is not None:
                v.assign(a)
        return
    object.__setattr__(
        model,
        "_mtx_arrays",
        tf.nest.map_structure(
            lambda a: None
            if a is None
            else tf.Variable(a, trainable=False, shape=tf.TensorShape([None] + list(a.shape[1:]))),
            arrays,
        ),
    )
    object.__setattr__(model, "_mtx_arrays_signature", signature)
    model.train_function = None
