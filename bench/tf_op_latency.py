"""Latency of one mtxcomm allreduce inside a tf.function against a tf.function holding one
multiplication (TensorFlow's own per-call cost), 1 KiB float32. The two alternate in blocks of
100 calls (21 blocks, the order swapped each block), so that a slow moment of the machine
weighs on both: the overhead is the median over blocks of (allreduce - x * 2) in the block. Also
prints, per rank, the share of the allreduces whose cycle ran on TensorFlow's own thread (the
engine's Entry::mayRunInline) rather than being handed to the engine's thread.
Then the same as a user would measure it: a loop of its own of 2000 calls of each (x * 2, then
allreduce), timed whole, three times; the overhead is the median over the three of the
allreduce loop's time per call minus the x * 2 loop's.
Last, the share of that overhead which no allreduce could avoid here: every rank times each of
2000 calls of x * 2 on its own (no collective in the loop), and a call made in step on all ranks
takes the slowest rank's time, so a free allreduce would add mean(max over ranks of call i) -
mean(call i), the ranks' own per-call jitter (the "pairing floor").
Run: mtxrun -np 2 python bench/tf_op_latency.py"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

BLOCKS, CALLS = 21, 100

hvd.init()
x = tf.ones([256])


@tf.function
def allreduce(t):
    return hvd.allreduce(t)


@tf.function
def multiply(t):
    return t * 2


def block(fn):
    start = time.perf_counter()
    for _ in range(CALLS):
        fn(x)
    return (time.perf_counter() - start) / CALLS * 1e6


for fn in (multiply, allreduce):
    for _ in range(20):
        fn(x)
times = {multiply: [], allreduce: []}
inline_before = hvd._inline_cycle_count()
for b in range(BLOCKS):
    for fn in (multiply, allreduce) if b % 2 == 0 else (allreduce, multiply):
        times[fn].append(block(fn))
# The share of the allreduces whose cycle ran on TensorFlow's thread (no hand-over), per rank.
inline = hvd.allgather(tf.constant([hvd._inline_cycle_count() - inline_before], tf.int64))
if hvd.rank() == 0:
    over = [a - m for a, m in zip(times[allreduce], times[multiply])]
    print(
        "%-28s median %.0f us per call (np=%d)"
        % ("tf.function(x * 2)", statistics.median(times[multiply]), hvd.size())
    )
    print(
        "%-28s median %.0f us per call (np=%d)"
        % ("tf.function(allreduce(x))", statistics.median(times[allreduce]), hvd.size())
    )
    print(
        "overhead (allreduce - x * 2, per block) median %.1f us (p25 %.1f, p75 %.1f)"
        % (statistics.median(over), *statistics.quantiles(over, n=4)[0:3:2])
    )
    print(
        "allreduces completed on TensorFlow's thread, per rank: %s"
        % " ".join("%.0f%%" % (100.0 * n / (BLOCKS * CALLS)) for n in inline.numpy())
    )

# As a user would: each function in a loop of its own, timed whole (no per-block medians).
LOOP = 2000
own = {multiply: [], allreduce: []}
for _ in range(3):
    for fn in (multiply, allreduce):
        hvd.allreduce(tf.constant(0.0), name="loop_start")  # both ranks start the loop together
        start = time.perf_counter()
        for _ in range(LOOP):
            fn(x)
        own[fn].append((time.perf_counter() - start) / LOOP * 1e6)
if hvd.rank() == 0:
    diffs = [a - m for a, m in zip(own[allreduce], own[multiply])]
    print(
        "own loops of %d calls: x * 2 %s us, allreduce %s us per call"
        % (
            LOOP,
            " ".join("%.1f" % t for t in own[multiply]),
            " ".join("%.1f" % t for t in own[allreduce]),
        )
    )
    print(
        "overhead in own loops (allreduce - x * 2) median %.1f us (runs: %s)"
        % (statistics.median(diffs), " ".join("%.1f" % d for d in diffs))
    )

# The pairing floor: what a collective that cost nothing would add, from each rank's own jitter.
hvd.allreduce(tf.constant(0.0), name="floor_start")
samples = []
for _ in range(LOOP):
    start = time.perf_counter()
    multiply(x)
    samples.append((time.perf_counter() - start) * 1e6)
every = hvd.allgather(tf.constant([samples], tf.float64)).numpy()  # [size, LOOP]
if hvd.rank() == 0:
    floor = every.max(axis=0).mean() - every.mean()
    print(
        "pairing floor (mean over calls of the slowest rank's x * 2 - the mean x * 2): %.1f us"
        % floor
    )
    print("overhead in own loops above the floor: %.1f us" % (statistics.median(diffs) - floor))
