"""A rank's part in test_torch_jobs.py's fault tests; started without a launcher (env:// from the
test: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so nothing kills the survivors for us.

    torch_fault.py kill      rank 1 SIGKILLs itself after one allreduce; the others keep
                             reducing and must raise, naming it (prints RAISED <seconds> <msg>)
    torch_fault.py timeout   rank 1 skips one allreduce; the others' call must fail after the
                             group's 3 s timeout (prints RAISED <seconds> <msg>)
    torch_fault.py secret    prints whether the job secret is left in the environment
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import mtxcomm.torch  # noqa: F401

mode = sys.argv[1]
timeout = datetime.timedelta(seconds=3 if mode == "timeout" else 60)
dist.init_process_group("mtxcomm", timeout=timeout)
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
print("FIRST", rank, t.tolist(), flush=True)
if mode == "secret":
    print("SECRET_IN_ENV", rank, "MTXCOMM_JOB_SECRET" in os.environ, flush=True)
    dist.barrier()
    sys.exit(0)
if rank == 1:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(8)  # timeout: never makes the second call
    os._exit(0)
start = time.monotonic()
try:
    for _ in range(100000):
        dist.all_reduce(t)
    print("NO_ERROR", rank, flush=True)
except Exception as e:  # noqa: BLE001
    print("RAISED %.1f %s: %s" % (time.monotonic() - start, type(e).__name__,
                                   str(e).replace("\n", " ")), flush=True)
    if mode == "timeout":
        try:
            dist.all_reduce(t)
            print("AFTER_TIMEOUT accepted", flush=True)
        except RuntimeError as e:
            print("AFTER_TIMEOUT refused: %s" % e, flush=True)
os._exit(3)
