"""How a rank's program ends, under mpirun with the array API (sys.argv[1]):
  reported   an exception caught and reported through sys.excepthook (as event loops and
             logging helpers do), and one shown by the code module (which, as pytest for a
             failed or xfailed test, records it in sys.last_value), then a normal end: the job
             must exit 0, MPI finalized
  exit3      rank 0 fails a stall (MTXCOMM_STALL_TIMEOUT set by the caller), catches it, calls
             mtxcomm.exiting_on_error() and sys.exit(3) while rank 1 stays busy for 10 minutes:
             the job must end soon
  late_hook  rank 0's uncaught stall error ends it while rank 1 stays busy, and the script
             installed its own sys.excepthook after importing mtxcomm: the job must end soon
Prints "END <rank>" where the program goes on to its end."""

import sys
import time

import numpy as np
from _report import report

import mtxcomm

mode = sys.argv[1]
mtxcomm.init()
r = mtxcomm.rank()
if mode == "reported":
    try:
        raise ValueError("handled, only reported")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    import code

    code.InteractiveInterpreter().runsource("1 / 0")
    assert sys.last_value is not None
    total = mtxcomm.allreduce(np.ones(2))
    report("END %d %s" % (r, total.tolist()))
elif r != 0:
    time.sleep(600)
elif mode == "exit3":
    try:
        mtxcomm.allreduce(np.ones(4))
    except (mtxcomm.Error, mtxcomm.TimeoutError) as e:
        report("CAUGHT 0 %s" % type(e).__name__)
        mtxcomm.exiting_on_error()
        sys.exit(3)
else:
    sys.excepthook = lambda *info: sys.__excepthook__(*info)
    mtxcomm.allreduce(np.ones(4))
