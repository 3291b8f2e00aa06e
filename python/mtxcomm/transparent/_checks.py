"""What the ranks must agree on, checked where a difference would otherwise pass silently or
stall: the data given to fit, evaluate and predict (:func:`_same_data_everywhere`: digests of
the arrays, one small allgather), and a stall verdict in those calls, given what usually causes
it (:func:`_stall_hint`). (That the ranks' weights stay the same is checked by fit's
``_SameWeights`` callback, in ``_callbacks``.)"""

from ._tf import tf_module

# The bytes of an array that _same_data_everywhere digests whole; of a larger one, rows spread
# evenly over it up to about this many bytes (a digest at several hundred MB/s).
_DIGEST_BYTES = 16 << 20


def _digest(value):
    """16 bytes naming an argument's structure, and the contents of its NumPy arrays (and of
    what converts to one: tensors, pandas frames); other leaves (datasets, generators) by type
    only."""
    import hashlib

    import numpy as np

    tf = tf_module()
    h = hashlib.blake2b(digest_size=16)
    try:
        leaves = tf.nest.flatten(value)
        h.update(repr(tf.nest.map_structure(lambda _: 0, value)).encode())  # keys, nesting
    except Exception:
        leaves = [value]
    for leaf in leaves:
        h.update(type(leaf).__name__.encode())
        if leaf is None or isinstance(leaf, (tf.data.Dataset, str, bytes)):
            h.update(repr(leaf).encode() if isinstance(leaf, (str, bytes)) else b"")
            continue
        if not isinstance(leaf, np.ndarray):
            if not (hasattr(leaf, "__array__") and hasattr(leaf, "shape")):
                continue  # a generator, a PyDataset, a Python number: by type
            try:
                leaf = np.asarray(leaf)
            except Exception:
                continue
        h.update(("%s%s" % (leaf.dtype.str, leaf.shape)).encode())
        if leaf.ndim and leaf.nbytes > _DIGEST_BYTES:
            rows = max(1, int(len(leaf) * _DIGEST_BYTES // leaf.nbytes))
            leaf = leaf[np.linspace(0, len(leaf) - 1, rows).astype(np.int64)]
        if leaf.dtype.hasobject:
            h.update(repr(leaf.tolist()).encode())
        else:
            h.update(np.ascontiguousarray(leaf).view(np.uint8).reshape(-1).data)
    return h.digest()


def _same_data_everywhere(call, arguments, names, mtx):
    """Raises on every rank when the ranks were given different data for call (fit, evaluate,
    predict): each rank takes its own rows of every batch of the data it holds, so ranks that
    hold different arrays (drawn from an unseeded generator, or before mtxrun could seed one)
    would train on a mix of them and report a mix, silently. Compares digests of the NumPy
    arrays (_digest): one allgather of 16 bytes per argument."""
    import numpy as np

    tf = tf_module()
    mine = b"".join(_digest(arguments.get(a)) for a in names)
    every = mtx.allgather(
        tf.constant(np.frombuffer(mine, np.uint8)[None, :]),
        name="mtxcomm.transparent.same_data/" + call,
    ).numpy()
    differ = [r for r in range(len(every)) if bytes(every[r]) != bytes(every[0])]
    if not differ:
        return
    first = next(
        i
        for i in range(len(names))
        if any(
            bytes(every[r][16 * i : 16 * i + 16]) != bytes(every[0][16 * i : 16 * i + 16])
            for r in differ
        )
    )
    raise ValueError(
        "mtxrun --transparent: the %s given to %s differ between the ranks: rank(s) %s hold "
        "other values than rank 0 (or other shapes or types). Every rank runs the whole script "
        "and takes its own rows of every batch of the data it holds, so every rank must build "
        "the same data: a split or shuffle drawn from a generator without a seed "
        "(np.random.default_rng(), random.shuffle before keras is imported) or data drawn or "
        "read differently in each process gives each rank other rows. Seed it "
        "(np.random.default_rng(0)), or draw it after importing keras (mtxrun --transparent "
        "seeds Python's, NumPy's and TensorFlow's global generators alike on every rank)."
        % (names[first], call, ",".join(map(str, differ)))
    )


def _stall_hint(error):
    """A stall verdict in fit, evaluate or predict (whose collectives are all the transparent
    mode's: the gradients', the ranks' batches, metrics, stops; which of them the verdict
    names depends on timing), with what usually causes it."""
    message = getattr(error, "message", str(error))
    if "MTXCOMM_STALL_TIMEOUT" not in message:
        return error
    return type(error)(
        error.node_def,
        error.op,
        message + ". Under --transparent every rank "
        "runs the script on the same input and takes its share of each batch: "
        "did the ranks' inputs give different numbers of batches (a generator or "
        "dataset that depends on the process, or is not seeded alike), or did "
        "code that only some ranks run collect (fit's ModelCheckpoint, "
        "BackupAndRestore, TensorBoard and CSVLogger run on rank 0 alone)?",
    )
