"""Every rank runs one allreduce; then rank 0 shuts down while the others sleep 2 s (idle, with
nothing pending), and prints "SHUTDOWN 0 <seconds>" for its shutdown() call."""

import time

import numpy as np
from _report import report

import mtxcomm

mtxcomm.init()
r = mtxcomm.rank()
mtxcomm.allreduce(np.ones(4, np.float32), op="sum")
if r == 0:
    start = time.perf_counter()
    mtxcomm.shutdown()
    report("SHUTDOWN 0 %.3f" % (time.perf_counter() - start))
else:
    time.sleep(2)
    mtxcomm.shutdown()
