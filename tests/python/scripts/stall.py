"""Rank 0 (and rank 1 at np >= 3) submit an allreduce the last rank never submits; with
MTXCOMM_STALL_TIMEOUT=3 it must fail on the ranks that submitted it, naming the tensor and the
missing rank. Then every rank meets in one more allreduce and exits cleanly.
Prints "STALL_ERROR <rank>: <message>" on the ranks that got the error."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from _report import report  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
r, n = hvd.rank(), hvd.size()
if r < n - 1:
    start = time.time()
    try:
        hvd.allreduce(tf.ones([4]), name="lonely")
        report("STALL_NO_ERROR %d" % r)
    except tf.errors.OpError as e:
        report("STALL_ERROR %d after %.1f s: %s" % (r, time.time() - start, e.message))
else:
    time.sleep(4.5)  # past the stall timeout, and less than it after the others failed
total = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after").numpy()[0]
report("AFTER %d %.0f" % (r, total))
