"""Rank 0 submits an allreduce that rank 1 never submits and does not catch the stall error;
rank 1 meanwhile stays busy for 10 minutes (outside mtxcomm). With MTXCOMM_STALL_TIMEOUT=3 the
job must end soon after the error: rank 0's exit must not wait in MPI_Finalize for rank 1.
Prints "SUBMITTED 0" before the allreduce."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from _report import report  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
if hvd.rank() == 0:
    report("SUBMITTED 0")
    hvd.allreduce(tf.ones([4]), name="lonely")  # raises DeadlineExceededError, uncaught
    report("RETURNED 0")
else:
    time.sleep(600)
