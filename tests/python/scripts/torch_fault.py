"""A rank's part in test_torch_jobs.py's fault tests; started without a launcher (env:// from the
test: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so nothing kills the survivors for us.

    torch_fault.py kill      rank 1 SIGKILLs itself after one allreduce; the others keep
                             reducing and must raise, naming it (prints RAISED <seconds> <msg>)
    torch_fault.py timeout   rank 1 skips one allreduce; the others' call must fail after the
                             group's 3 s timeout (prints RAISED <seconds> <msg>)
    torch_fault.py env_timeout
                             as timeout, but the group's timeout is 60 s and MTXCOMM_TIMEOUT
                             (set by the test) the shorter one that must end the wait
    torch_fault.py secret    prints whether the job secret is left in the environment
    torch_fault.py ddp_kill  DDP training; rank 1 SIGKILLs itself at step 3: the others'
                             backward/step must raise (DDP's reducer gets a failed future), no
                             crash, no hang
    torch_fault.py window    rank 1 sleeps; rank 0 submits 70 async allreduces (more than the
                             backend's 64 names in flight): the 65th call must fail after the
                             group's 3 s timeout, not block
    torch_fault.py process_set_exit
                             a process set added and used, never removed, then a normal exit:
                             the set's communicator must be freed at exit (exit 0, no
                             std::terminate of its threads)
    torch_fault.py subgroup_exit
                             a subgroup of ranks 0 and 1 (world of 3) used, never destroyed,
                             then a normal exit: exit 0 on every rank, no std::terminate
    torch_fault.py p2p_kill  ranks exchange with isend/irecv (1 MiB) with their neighbours in a
                             loop; rank 1 SIGKILLs itself after 3 rounds: the others' waits must
                             raise, naming it (prints RAISED <seconds> <msg>), and stay 3 s
    torch_fault.py anysource_kill
                             rank 0 waits in a receive from any source that nobody sends; rank
                             1 SIGKILLs itself 0.5 s after a barrier, rank 2 stays silent for
                             8 s: rank 0's receive must raise naming rank 1 (RAISED ...) long
                             before MTXCOMM_TIMEOUT
    torch_fault.py destroy   an async allreduce of a temporary, its Work dropped, then
                             destroy_process_group() while it is in flight (rank 1 comes 1 s
                             late): the tensors allocated after it must keep their values
                             (prints JUNK intact|corrupted)
"""

import datetime
import gc
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from _report import report  # noqa: E402

import mtxcomm.torch  # noqa: F401


def report_raised(start, e):
    """Prints RAISED <seconds since start> <type>: <message> (what the test parses)."""
    report(
        "RAISED %.1f %s: %s"
        % (time.monotonic() - start, type(e).__name__, str(e).replace("\n", " ")[:2000])
    )


mode = sys.argv[1]
timeout = datetime.timedelta(seconds=3 if mode in ("timeout", "window") else 60)
dist.init_process_group("mtxcomm", timeout=timeout)
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
report("FIRST", rank, t.tolist())
report("BACKEND", type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__)
if mode == "secret":
    report("SECRET_IN_ENV", rank, "MTXCOMM_JOB_SECRET" in os.environ)
    dist.barrier()
    sys.exit(0)
if mode == "ddp_kill":
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = time.monotonic()
    try:
        for step in range(100000):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
        report("NO_ERROR", rank)
    except Exception as e:  # noqa: BLE001
        report_raised(start, e)
    os._exit(3)
if mode == "process_set_exit":
    import mtxcomm.torch as hvd

    hvd.init()
    sets = [hvd.add_process_set([r]) for r in range(hvd.size())]  # every rank adds each
    report(
        "SET_SUM", rank, hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=sets[rank]).tolist()
    )
    sys.exit(0)
if mode == "subgroup_exit":
    # A subgroup of ranks 0 and 1 in a world of 3, used and never destroyed, then a normal exit.
    g = dist.new_group([0, 1])
    if rank in (0, 1):
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        report("SUB_SUM", rank, t.tolist())
    sys.exit(0)
if mode == "destroy":
    n = 40000
    if rank == 1:
        time.sleep(1.0)  # rank 0's call stays in flight across destroy_process_group()
    dist.all_reduce(torch.full((n,), float(rank + 1)), async_op=True)  # Work dropped
    dist.destroy_process_group()
    gc.collect()
    junk = [torch.full((n,), float(1000 + k)) for k in range(300)]
    time.sleep(2.0)  # the engine completes the call meanwhile
    bad = [k for k, x in enumerate(junk) if not bool((x == 1000 + k).all())]
    report("JUNK", rank, "corrupted %s" % bad[:5] if bad else "intact")
    os._exit(4 if bad else 0)
if mode == "p2p_kill":
    n, size = 1 << 18, dist.get_world_size()
    start = time.monotonic()
    try:
        for step in range(100000):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            got = torch.empty(n)
            works = [
                dist.irecv(got, src=(rank - 1) % size),
                dist.isend(torch.full((n,), float(rank)), dst=(rank + 1) % size),
            ]
            for w in works:
                w.wait()
        report("NO_ERROR", rank)
    except Exception as e:  # noqa: BLE001
        report_raised(start, e)
    # The survivors stay a while: one that left at once could be what the other's wait sees
    # first (rank 0 waits on rank 2's message; rank 2 fails on rank 1's death and exits), and
    # its error would name that survivor, not the killed rank.
    time.sleep(3)
    os._exit(3)
if mode == "anysource_kill":
    dist.barrier()
    start = time.monotonic()
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        try:
            dist.recv(torch.empty(4))
            report("NO_ERROR", rank)
        except Exception as e:  # noqa: BLE001
            report_raised(start, e)
    else:
        time.sleep(8)
    os._exit(3)
if mode == "window":
    start = time.monotonic()
    if rank == 1:
        time.sleep(15)
        os._exit(0)
    try:
        works = [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(70)]
        report("NO_ERROR", rank)
    except Exception as e:  # noqa: BLE001
        report_raised(start, e)
    os._exit(3)
if rank == 1:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(8)  # timeout: never makes the second call
    os._exit(0)
start = time.monotonic()
try:
    for _ in range(100000):
        dist.all_reduce(t)
    report("NO_ERROR", rank)
except Exception as e:  # noqa: BLE001
    report_raised(start, e)
    if mode == "timeout":
        try:
            dist.all_reduce(t)
            report("AFTER_TIMEOUT accepted")
        except RuntimeError as e:
            report("AFTER_TIMEOUT refused: %s" % e)
os._exit(3)
