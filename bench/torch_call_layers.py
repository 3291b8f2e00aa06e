"""Where a small dist.all_reduce's time goes with the C++ "mtxcomm" backend, against the library's
own call in the same job: the same tensor through each layer, timed interleaved (each of R rounds
times K calls of every layer in turn; the figure is the median over rounds of the time per call):

- library: K x mtxcomm_allreduce in a C++ loop on the group's own communicator
  (``bench_allreduce``: what ``mtxcomm_bench allreduce`` times, no binding in between);
- direct_all_reduce: ``mtxcomm.torch.direct_all_reduce(t)`` (one pybind11 call);
- backend: ``backend.allreduce([t], opts)`` with ``opts.asyncOp = False`` as
  ``dist.all_reduce`` passes it (the c10d Backend object; a Work only where it was queued);
- pg: ``pg.allreduce([t], opts)``, the same options (PyTorch's ProcessGroup and its
  dispatcher);
- dist.all_reduce: ``dist.all_reduce(t)``, as a user calls it;
- with torch's hook: ``dist.all_reduce(t)`` on a second "mtxcomm" group over the same ranks
  to which torch's generic FlightRecorderHook is attached, as torch attaches it to a backend
  that does not record its own calls (mtxcomm declares that it does; docs/torch.md);
- torch alone: ``dist.all_reduce(t)`` on a group of torch's own "fake" backend over the same
  ranks (``FakeProcessGroup``: it moves no byte and returns at once), which is what torch's
  Python, binding and dispatcher cost by themselves on this machine with these ranks running.

float32 SUM, in place. Rank 0 prints a Markdown table; "dist - library" is what a torch user
pays above the library's own call, and "dist - torch alone - library" the part of it that is
not torch's own.

    mtxrun -np 2 python bench/torch_call_layers.py [--rounds 7] [--calls 2000]
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import mtxcomm.torch
from mtxcomm.torch import _native

# Registers torch's "fake" backend (no communication) for the "torch alone" layer.
import torch.testing._internal.distributed.fake_pg  # noqa: F401  isort: skip


def timed(fn, k):
    dist.barrier()
    t0 = time.perf_counter()
    fn(k)
    return (time.perf_counter() - t0) / k * 1e6


def loop(call):
    def run(k):
        for _ in range(k):
            call()

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--sizes", default="8,512,8192,65536", help="bytes, comma-separated")
    args = ap.parse_args()
    dist.init_process_group("mtxcomm")
    module, why = _native.native_module()
    if module is None:
        raise SystemExit("torch_call_layers: the C++ backend does not serve (%s)" % why)
    pg = dist.group.WORLD
    be = pg._get_backend(torch.device("cpu"))
    hooked = dist.new_group(list(range(dist.get_world_size())))
    hook = torch._C._distributed_c10d.FlightRecorderHook.attach(
        hooked, list(range(dist.get_world_size()))
    )
    fake = dist.new_group(list(range(dist.get_world_size())), backend="fake")
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # what dist.all_reduce(t) passes: a small call runs on this thread

    def waited(work):
        # A waited call that completed inline hands back no Work (nothing to wait for).
        if work is not None:
            work.wait()

    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        x = torch.ones(max(1, nbytes // 4))
        layers = {
            "library": lambda k: be.bench_allreduce(x, k),
            "direct_all_reduce": loop(lambda: mtxcomm.torch.direct_all_reduce(x)),
            "backend": loop(lambda: waited(be.allreduce([x], opts))),
            "pg": loop(lambda: waited(pg.allreduce([x], opts))),
            "dist.all_reduce": loop(lambda: dist.all_reduce(x)),
            "with torch's hook": loop(lambda: dist.all_reduce(x, group=hooked)),
            "torch alone": loop(lambda: dist.all_reduce(x, group=fake)),
        }
        for f in layers.values():  # warm-up
            timed(f, max(1, args.calls // 10))
        times = {name: [] for name in layers}
        for _ in range(args.rounds):
            for name, f in layers.items():
                times[name].append(timed(f, args.calls))
        rows.append((nbytes, {name: statistics.median(v) for name, v in times.items()}))
    hook.remove()
    if dist.get_rank() == 0:
        names = list(rows[0][1])
        print(
            "| bytes | "
            + " | ".join(n + " (µs)" for n in names)
            + " | dist - library (µs) | dist - torch alone - library (µs) |"
        )
        print("|---:|" + "---:|" * (len(names) + 2))
        for n, r in rows:
            cells = " | ".join("%.2f" % r[k] for k in names)
            above = r["dist.all_reduce"] - r["library"]
            print("| %d | %s | %.2f | %.2f |" % (n, cells, above, above - r["torch alone"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
