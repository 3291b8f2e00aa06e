"""Prints, per rank, what placement set: "PLACEMENT <json>" with the CPUs the process may use,
TensorFlow's pool sizes after init and the thread variables it sees."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from _report import report  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
tf.constant(1.0) + 1.0  # TensorFlow creates its pools now


def effective(getter, var):
    """The pool size TensorFlow uses: set through tf.config, else from the environment."""
    return getter() or int(os.environ.get(var, "0"))


report(
    "PLACEMENT",
    json.dumps(
        {
            "rank": hvd.rank(),
            "cpus": sorted(os.sched_getaffinity(0)),
            "share": hvd.cpu_share(),
            "intra": effective(
                tf.config.threading.get_intra_op_parallelism_threads, "TF_NUM_INTRAOP_THREADS"
            ),
            "inter": effective(
                tf.config.threading.get_inter_op_parallelism_threads, "TF_NUM_INTEROP_THREADS"
            ),
            "env": {
                k: os.environ.get(k)
                for k in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
            },
        }
    ),
)
