"""Every rank but 0 arrives SKEW_US late at each of CALLS allreduces (a busy wait, as a rank
still computing would). Prints "SKEWED <rank> <sum of the results>"; the test counts the
engine's cycles in the timeline (MTXCOMM_TIMELINE)."""

import os
import time

import numpy as np
from _report import report

import mtxcomm

calls = int(os.environ.get("CALLS", "40"))
skew = float(os.environ.get("SKEW_US", "300")) * 1e-6
mtxcomm.init()
r, n = mtxcomm.rank(), mtxcomm.size()
total = 0.0
for k in range(calls):
    if r != 0:
        end = time.perf_counter() + skew
        while time.perf_counter() < end:
            pass
    total += float(mtxcomm.allreduce(np.full(4, float(r + k), np.float32), op="sum")[0])
report("SKEWED %d %.0f" % (r, total))
mtxcomm.shutdown()
