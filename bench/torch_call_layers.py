"""Where a small dist.all_reduce's time goes with the C++ "mtxcomm" backend: the same tensor
through each layer, timed in turn (median of 5 x 1000 calls per layer and size): the Python
API (dist.all_reduce), the ProcessGroup (pg.allreduce(...).wait()), the backend object
(backend.allreduce(...).wait()) and the C API's mtxcomm_allreduce on the backend's own
communicator (through ctypes, which adds ~1-2 us). Rank 0 prints a Markdown table.

    mtxrun -np 2 python bench/torch_call_layers.py
"""

import ctypes
import statistics
import time

import torch
import torch.distributed as dist

import mtxcomm.torch  # noqa
from mtxcomm.torch import _setcomm

dist.init_process_group("mtxcomm")
be = dist.group.WORLD._get_backend(torch.device("cpu"))
lib = _setcomm._library()
comm = ctypes.c_void_p(be.comm_address)


def timed(fn, k=2000):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t0) / k * 1e6


rows = []
for nbytes in (8, 512, 8192, 65536):
    x = torch.ones(nbytes // 4)
    opts = dist.AllreduceOptions()
    pg = dist.group.WORLD
    fns = {
        "dist.all_reduce": lambda: dist.all_reduce(x),
        "pg.allreduce().wait()": lambda: pg.allreduce([x], opts).wait(),
        "backend.allreduce().wait()": lambda: be.allreduce([x], opts).wait(),
        "ctypes mtxcomm_allreduce": lambda: lib.mtxcomm_allreduce(
            x.data_ptr(), x.data_ptr(), x.numel(), 8, 0, comm, None
        ),
    }
    res = {k: statistics.median([timed(f, 1000) for _ in range(5)]) for k, f in fns.items()}
    rows.append((nbytes, res))
if dist.get_rank() == 0:
    names = list(rows[0][1])
    print("| bytes | " + " | ".join(names) + " |")
    for n, r in rows:
        print("| %d | %s |" % (n, " | ".join("%.1f" % r[k] for k in names)))
dist.destroy_process_group()
