"""mtxcomm.tensorflow's functions over the collectives: Python objects (broadcast_object,
broadcast_object_fn, allgather_object), variables (broadcast_variables,
broadcast_global_variables) and is_homogeneous().

Objects are pickled and sent as uint8 tensors: a size first, then the bytes. They run eagerly,
or in a TensorFlow 1 graph through a session (``session``, else the default one, else a new
one).
"""

import tensorflow as tf

from mtxcomm.tensorflow._ops import _no_process_set, allgather, broadcast
from mtxcomm.tensorflow.basics import _basics, rank


def _run(tensors, session=None):
    """The value of tensors as NumPy: eagerly, or through session (the default session, else a
    new one) in a graph."""
    if tf.executing_eagerly():
        return tf.nest.map_structure(lambda t: t.numpy(), tensors)
    sess = session or tf.compat.v1.get_default_session()
    if sess is None:
        with tf.compat.v1.Session() as own:
            return own.run(tensors)
    return sess.run(tensors)


def _pickled(obj):
    """(bytes as a uint8 array, None) or (None, the pickling error)."""
    import pickle

    import numpy as np

    try:
        return np.frombuffer(pickle.dumps(obj), dtype=np.uint8), None
    except Exception as e:  # every rank must still take part in the collectives
        return None, e


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Every rank gets root_rank's picklable Python object (eagerly, or in a graph through
    ``session`` / the default session). An object the root cannot pickle raises on every rank
    (the root's own error there, ValueError naming it elsewhere)."""
    import pickle

    import numpy as np

    _no_process_set(process_set, "broadcast_object")
    # The default name may not depend on obj: only the root's object is meaningful.
    name = name or "default"
    payload, error = _pickled(obj) if rank() == root_rank else (np.zeros([0], np.uint8), None)
    size = -1 if error is not None else payload.size
    n = int(
        _run(
            broadcast(
                tf.constant([size], dtype=tf.int64),
                root_rank,
                name="broadcast_object/%s/size" % name,
            ),
            session,
        )[0]
    )
    if n < 0:
        if error is not None:
            raise error
        raise ValueError("broadcast_object: root rank %d could not pickle its object" % root_rank)
    buf = payload if rank() == root_rank else np.zeros([n], dtype=np.uint8)
    data = _run(broadcast(tf.constant(buf), root_rank, name="broadcast_object/%s" % name), session)
    return obj if rank() == root_rank else pickle.loads(data.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=None):
    """A function obj -> broadcast_object(obj, root_rank, session, name): Horovod's form for
    TensorFlow 1 graphs."""

    def _bcast(obj):
        return broadcast_object(obj, root_rank, session=session, name=name, process_set=process_set)

    return _bcast


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every rank's picklable Python object, as a list in rank order, on every rank. An object
    some rank cannot pickle raises on every rank (that rank's own error there, ValueError
    naming the ranks elsewhere)."""
    import pickle

    _no_process_set(process_set, "allgather_object")
    name = name or "default"  # the objects' types may differ between ranks
    payload, error = _pickled(obj)
    size = -1 if error is not None else payload.size
    sizes = _run(
        allgather(tf.constant([size], dtype=tf.int64), name="allgather_object/%s/sizes" % name),
        session,
    ).tolist()
    bad = [r for r, n in enumerate(sizes) if n < 0]
    if bad:
        if error is not None:
            raise error
        raise ValueError(
            "allgather_object: rank(s) %s could not pickle their object" % ",".join(map(str, bad))
        )
    data = _run(allgather(tf.constant(payload), name="allgather_object/%s" % name), session)
    out, off = [], 0
    for n in sizes:
        out.append(pickle.loads(data[off : off + n].tobytes()))
        off += n
    return out


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assigns root_rank's value to each variable (tf.Variable or keras.Variable), on every
    rank, in list order. The variables must be in the same order on every rank. Eagerly the
    assignments are done on return; in a graph the returned op does them."""
    _no_process_set(process_set, "broadcast_variables")
    assigns = [v.assign(broadcast(tf.convert_to_tensor(v), root_rank)) for v in variables]
    if not tf.executing_eagerly():
        return tf.group(*assigns)
    return None


def broadcast_global_variables(root_rank):
    """Broadcasts every TensorFlow 1 global variable from root_rank (graph mode only: the op to
    run). Eagerly there are no global variables: raises RuntimeError; use
    broadcast_variables(model.variables, root_rank)."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() does not support eager execution: "
            "there are no global variables; use "
            "hvd.broadcast_variables(model.variables, root_rank=%d)" % root_rank
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def is_homogeneous():
    """True when every node runs the same number of ranks (collective: every rank must call it).
    Raises ValueError before init()."""
    return _basics.is_homogeneous(allgather_object)
