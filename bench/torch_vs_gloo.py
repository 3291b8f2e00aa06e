"""torch.distributed collectives: the "mtxcomm" backend against Gloo, in the same job.

Both process groups live in one job (the default group on "mtxcomm", a second on "gloo" over
the same ranks) and are timed interleaved, size by size: R rounds of (K calls on mtxcomm, K on
Gloo), each call synchronous (``dist.all_reduce(t)`` waits), after a warm-up; the figure is
the median over rounds of the per-call time, and the ratio gloo / mtxcomm (> 1: mtxcomm is
faster). send_recv is a ping-pong between ranks 0 and 1 (the time of one round trip: twice
the one-way latency; bandwidth = 2 x bytes / time). A DDP step (an MLP, both backends
interleaved the same way) is timed as well.

The default group runs the C++ backend (mtxcomm.torch._c10d) where it was built; a third group
over the same ranks runs the Python backend (made with MTXCOMM_TORCH_BACKEND=python), timed
interleaved with the other two (its column "python"); --no-python leaves it out.

    torchrun --nproc-per-node 2 bench/torch_vs_gloo.py [--max-bytes 67108864] [--rounds 7]
    mtxrun -np 2 python bench/torch_vs_gloo.py

Rank 0 prints a Markdown table (bench/RESULTS.md keeps one).
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import mtxcomm.torch  # noqa: F401  (registers the backend)


def timed(fn, k):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t0) / k


def compare(make_call, k, rounds, groups):
    times = {name: [] for name in groups}
    for g in groups.values():  # warm-up
        timed(make_call(g), max(1, k // 4))
    for _ in range(rounds):
        for name, g in groups.items():
            times[name].append(timed(make_call(g), k))
    return {name: statistics.median(v) for name, v in times.items()}


def ping_pong(x, rank, g):
    """One round trip of x between ranks 0 and 1 (send then recv on 0, recv then send on 1;
    other ranks idle): the time per call is twice the one-way latency at x's size."""
    if rank == 0:
        dist.send(x, 1, group=g)
        dist.recv(x, 1, group=g)
    elif rank == 1:
        dist.recv(x, 0, group=g)
        dist.send(x, 0, group=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", type=int, default=4)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-python", action="store_true", help="no Python-backend group")
    ap.add_argument(
        "--collectives",
        default="all_reduce,broadcast,all_gather_into_tensor,"
        "reduce_scatter_tensor,all_to_all_single,send_recv,ddp",
    )
    args = ap.parse_args()
    dist.init_process_group("mtxcomm")
    n, r = dist.get_world_size(), dist.get_rank()
    groups = {"mtxcomm": dist.group.WORLD}
    if not args.no_python:
        os.environ["MTXCOMM_TORCH_BACKEND"] = "python"
        groups["python"] = dist.new_group(backend="mtxcomm")
        del os.environ["MTXCOMM_TORCH_BACKEND"]
    groups["gloo"] = dist.new_group(backend="gloo")
    kind = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__module__
    wanted = args.collectives.split(",")
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        count = max(n, size // 4 // n * n)
        k = max(3, min(200, (8 << 20) // max(size, 1)))
        x = torch.ones(count)
        out = torch.empty(count * n)
        part = torch.empty(count // n)
        a2a = torch.empty(count)
        calls = {
            "all_reduce": lambda g: (lambda: dist.all_reduce(x, group=g)),
            "broadcast": lambda g: (lambda: dist.broadcast(x, 0, group=g)),
            "all_gather_into_tensor": lambda g: (
                lambda: dist.all_gather_into_tensor(out, x, group=g)
            ),
            "reduce_scatter_tensor": lambda g: (
                lambda: dist.reduce_scatter_tensor(part, x, group=g)
            ),
            "all_to_all_single": lambda g: (lambda: dist.all_to_all_single(a2a, x, group=g)),
            "send_recv": lambda g: (lambda: ping_pong(x, r, g)),
        }
        for name in wanted:
            if name not in calls:
                continue
            t = compare(calls[name], k, args.rounds, groups)
            rows.append((name, count * 4, t))
        size *= 4
    if "ddp" in wanted:
        rows += ddp_rows(groups, args.rounds)
    if r == 0:
        names = list(groups)
        print("default group: %s (%s)" % (kind, "C++" if kind.endswith("_c10d") else "Python"))
        print(
            "| collective | bytes | %s | gloo / mtxcomm |"
            % " | ".join("%s (us)" % g for g in names)
        )
        print("|---|---:|%s---:|" % ("---:|" * len(names)))
        for name, nbytes, t in rows:
            cells = " | ".join("%.1f" % (t[g] * 1e6) for g in names)
            print("| %s | %s | %s | %.2f |" % (name, nbytes, cells, t["gloo"] / t["mtxcomm"]))
    dist.destroy_process_group()


def ddp_rows(groups, rounds):
    torch.manual_seed(0)
    rows = []
    for width in (256, 2048):
        models = {}
        for name, g in groups.items():
            m = torch.nn.Sequential(
                torch.nn.Linear(784, width),
                torch.nn.ReLU(),
                torch.nn.Linear(width, width),
                torch.nn.ReLU(),
                torch.nn.Linear(width, 10),
            )
            ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=g)
            models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
        xb, yb = torch.randn(64, 784), torch.randint(0, 10, (64,))

        def make(g):
            ddp, opt = models[[k for k, v in groups.items() if v is g][0]]

            def step():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
                opt.step()

            return step

        t = compare(make, 10, rounds, groups)
        params = sum(p.numel() for p in models["mtxcomm"][0].parameters())
        rows.append(("DDP step, MLP %d params" % params, params * 4, t))
    return rows


if __name__ == "__main__":
    main()
