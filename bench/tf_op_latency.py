"""Latency of one mtxcomm allreduce inside a tf.function against a tf.function holding one
multiplication (TensorFlow's own per-call cost), medians of 5 x 200 calls, 1 KiB float32.
Run: mtxrun -np 2 python bench/tf_op_latency.py"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
x = tf.ones([256])


@tf.function
def allreduce(t):
    return hvd.allreduce(t)


@tf.function
def multiply(t):
    return t * 2


for fn, name in ((multiply, "tf.function(x * 2)"), (allreduce, "tf.function(allreduce(x))")):
    for _ in range(20):
        fn(x)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            fn(x)
        times.append((time.perf_counter() - start) / 200 * 1e6)
    if hvd.rank() == 0:
        print("%-28s median %.0f us per call (np=%d)" % (name, sorted(times)[2], hvd.size()))
