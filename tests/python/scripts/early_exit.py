"""Rank 1 stops early: it leaves before the last allreduce the others still call.

    mtxrun -np 2 python tests/python/scripts/early_exit.py

Rank 0 must get an error (not hang) that names the rank that left; it prints
"RANK0_ERROR: <type>: <message>" and exits with 3. A rank 0 whose last allreduce returns
prints "RANK0_NO_ERROR" and exits with 4. Rank 1 returns normally (exit code 0).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from _report import report  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
x = tf.ones([16], tf.float32)
for i in range(3):
    got = hvd.allreduce(x, op=hvd.Sum, name=f"early_exit_{i}").numpy()
    assert float(got[0]) == hvd.size(), got
report(f"rank {hvd.rank()}: 3 allreduces done")

if hvd.rank() == 1:
    report("rank 1: leaving before the last allreduce")
    sys.exit(0)

try:
    hvd.allreduce(x, op=hvd.Sum, name="early_exit_last").numpy()
except Exception as e:  # noqa: BLE001 - the type is reported, the test checks the message
    report(f"RANK0_ERROR: {type(e).__name__}: {e}")
    sys.exit(3)
report("RANK0_NO_ERROR")
sys.exit(4)
