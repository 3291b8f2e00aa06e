"""Under mtxrun --timeline: a few steps of allreduces, then rank 1 is SIGKILLed while rank 0
waits in another allreduce. The timeline files of both ranks must still be valid JSON."""

import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from _report import report  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()


@tf.function
def step(a, b):
    return hvd.allreduce(a, name="a"), hvd.allreduce(b, name="b")


for _ in range(20):
    step(tf.ones([64]), tf.ones([128]))
if hvd.rank() == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    hvd.allreduce(tf.ones([4]), name="never")
    report("TIMELINE_NO_ERROR")
except tf.errors.OpError as e:
    report("TIMELINE_RANK0_ERROR: " + e.message.splitlines()[0])
