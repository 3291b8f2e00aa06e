"""Loads the binding's shared object: TensorFlow op library and Python module in one file."""

import glob
import importlib
import os

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find():
    found = sorted(glob.glob(os.path.join(_HERE, "_mtxcomm_tf*.so")))
    if not found:
        raise ImportError(
            "mtxcomm.tensorflow: the binding (_mtxcomm_tf*.so) is not in %s. The package was "
            "built without TensorFlow: install tensorflow (e.g. tensorflow-cpu) first, then "
            "reinstall mtxcomm with `pip install .`" % _HERE
        )
    return found[0]


_PATH = _find()
try:
    # Registers the ops and gives their Python wrappers ...
    ops = tf.load_op_library(_PATH)
except tf.errors.NotFoundError as e:
    raise ImportError(
        "mtxcomm.tensorflow: %s could not be loaded by this TensorFlow (%s); it was probably "
        "built against another TensorFlow version: reinstall mtxcomm (`pip install .`) in this "
        "environment. Cause: %s" % (_PATH, tf.__version__, e)
    ) from e
# ... and the same file, already open, is the engine's Python module.
engine = importlib.import_module("mtxcomm.tensorflow._mtxcomm_tf")


# The ops run collectives: tf.function must keep them (they are stateful) but must not chain them
# in program order as it does other stateful ops (automatic control dependencies), or the
# collectives of one step would run one at a time, unfused, and two ranks whose traced graphs
# order two independent collectives differently would deadlock. TensorFlow's own list of such
# ops (run, in any order) takes them.
OP_TYPES = frozenset(
    (
        "MtxcommAllreduce",
        "MtxcommGroupedAllreduce",
        "MtxcommBroadcast",
        "MtxcommAllgather",
        "MtxcommGroupedAllgather",
        "MtxcommReducescatter",
        "MtxcommGroupedReducescatter",
        "MtxcommAlltoall",
        "MtxcommJoin",
    )
)


def _register_order_insensitive():
    from tensorflow.python.framework import auto_control_deps as acd

    current = getattr(acd, "MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS", None)
    if current is None:
        import warnings

        warnings.warn(
            "mtxcomm.tensorflow: this TensorFlow has no "
            "auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS; collectives "
            "inside tf.function run in program order (no fusion across them)",
            stacklevel=2,
        )
        return
    if not OP_TYPES <= current:
        acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = frozenset(current | OP_TYPES)


_register_order_insensitive()
