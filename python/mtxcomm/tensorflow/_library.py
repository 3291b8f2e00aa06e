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
            "reinstall mtxcomm with `pip install .`" % _HERE)
    return found[0]


_PATH = _find()
try:
    # Registers the ops and gives their Python wrappers ...
    ops = tf.load_op_library(_PATH)
except tf.errors.NotFoundError as e:
    raise ImportError(
        "mtxcomm.tensorflow: %s could not be loaded by this TensorFlow (%s); it was probably "
        "built against another TensorFlow version: reinstall mtxcomm (`pip install .`) in this "
        "environment. Cause: %s" % (_PATH, tf.__version__, e)) from e
# ... and the same file, already open, is the engine's Python module.
engine = importlib.import_module("mtxcomm.tensorflow._mtxcomm_tf")
