"""CUDA tensors through the "mtxcomm" torch.distributed backend, on a GPU machine
(bench/gpu_check.sh runs it; it needs the package importable, a CUDA torch and a GPU).

    python -m torch.distributed.run --standalone --nproc_per_node 2 bench/torch_cuda_check.py
    (or mtxrun -np 2 python bench/torch_cuda_check.py) [--json FILE]

Every rank uses cuda:(local rank % GPUs): two ranks on one GPU share it (run the CUDA MPS
daemon). It checks, and exits 1 when one fails:
  1. the collectives on CUDA tensors against closed forms (float32, bfloat16, int64; allreduce
     SUM/AVG/MAX, broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor), Work.wait()
     ordering a side stream after the call, get_future(), and the refusal of all_to_all_single;
  2. DDP on CUDA: the ranks' weights bitwise equal after the steps, and within 1e-5 of one
     process training on the whole batch;
  3. the time of dist.all_reduce (float32, SUM) against PyTorch's own "nccl" backend in the same
     job, interleaved, median of --repeats blocks, at 1 MiB and up: the target is mtxcomm <= 1.1x
     nccl. PyTorch's NCCL on ranks sharing a GPU needs NCCL 2.30+ and
     NCCL_MULTI_RANK_GPU_ENABLE=1; without them that comparison is skipped, saying why.
Rank 0 prints the table (and writes --json).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import mtxcomm.torch  # noqa: F401  (registers "mtxcomm")

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def fail(msg):
    print("torch_cuda_check: rank %d: FAIL: %s" % (dist.get_rank(), msg), flush=True)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def check_collectives(dev, rank, size):
    n = 1000
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        t = torch.full((n,), rank + 1, dtype=dtype, device=dev)
        dist.all_reduce(t)
        expect(torch.all(t == size * (size + 1) // 2).item(), "allreduce sum %s" % dtype)
    t = torch.full((n,), float(rank), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    expect(torch.allclose(t, torch.full_like(t, (size - 1) / 2)), "allreduce avg")
    # int32: the nccl path takes integer MAX (its floating MIN/MAX is kept off NCCL: NaN).
    t = torch.arange(n, dtype=torch.int32, device=dev) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    expect(torch.equal(t, torch.arange(n, dtype=torch.int32, device=dev) * size), "max")
    t = torch.full((n,), float(rank + 7), device=dev)
    dist.broadcast(t, src=size - 1)
    expect(torch.all(t == size + 6).item(), "broadcast")
    t = torch.full((n,), 1.0, device=dev)
    dist.reduce(t, dst=0)
    if rank == 0:
        expect(torch.all(t == size).item(), "reduce")
    out = torch.empty(size * 3, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
    want = torch.tensor([float(r) for r in range(size) for _ in range(3)], device=dev)
    expect(torch.equal(out, want), "all_gather_into_tensor")
    inp = torch.arange(size * 4, dtype=torch.float32, device=dev)
    out = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    want = torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32, device=dev) * size
    expect(torch.equal(out, want), "reduce_scatter_tensor")
    # Work.wait() orders a side stream after the call; the future carries the output.
    side = torch.cuda.Stream(device=dev)
    big = torch.ones(8 << 20, device=dev)
    work = dist.all_reduce(big, async_op=True)
    with torch.cuda.stream(side):
        work.wait()
        total = big.sum()
    side.synchronize()
    expect(total.item() == size * (8 << 20), "Work.wait() on a side stream")
    t = torch.ones(16, device=dev)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.wait()[0]
    expect(torch.all(res == size).item(), "get_future()")
    try:
        dist.all_to_all_single(torch.empty(size, device=dev), torch.ones(size, device=dev))
        fail("all_to_all_single on CUDA tensors was not refused")
    except ValueError as e:
        expect("not supported on CUDA" in str(e), "all_to_all_single refusal: %s" % e)


def check_ddp(dev, rank, size, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    ).to(dev)
    reference = [p.detach().clone() for p in model.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator(device="cpu").manual_seed(1)
    batches = [
        (torch.randn(8 * size, 32, generator=g), torch.randn(8 * size, 4, generator=g))
        for _ in range(steps)
    ]
    for x, y in batches:
        xs, ys = x[rank * 8 : (rank + 1) * 8].to(dev), y[rank * 8 : (rank + 1) * 8].to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xs), ys).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = torch.empty(size * flat.numel(), device=dev)
    dist.all_gather_into_tensor(every, flat)
    for r in range(size):
        expect(
            torch.equal(every[r * flat.numel() : (r + 1) * flat.numel()], flat),
            "DDP weights of rank %d differ from rank %d's" % (r, rank),
        )
    # One process on the whole batch (mean loss over equal shards = mean of the shards' means).
    single = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    ).to(dev)
    with torch.no_grad():
        for p, r in zip(single.parameters(), reference):
            p.copy_(r)
    opt1 = torch.optim.SGD(single.parameters(), lr=0.1)
    for x, y in batches:
        opt1.zero_grad()
        torch.nn.functional.mse_loss(single(x.to(dev)), y.to(dev)).backward()
        opt1.step()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), single.parameters()))
    expect(diff <= 1e-5, "DDP vs one process: max |diff| %.3g > 1e-5" % diff)
    return diff


def timed(fn, tensor, iters):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(tensor)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def compare_with_nccl(dev, repeats):
    try:
        nccl = dist.new_group(backend="nccl")
        probe = torch.ones(4, device=dev)
        dist.all_reduce(probe, group=nccl)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (NCCL refuses ranks sharing a GPU before 2.30)
        return None, "PyTorch's nccl backend failed here (%s: %s)" % (type(e).__name__, e)
    rows = []
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4, device=dev)
        iters = max(3, min(50, (64 << 20) // nbytes * 5))
        ours, theirs = [], []
        for _ in range(repeats):  # interleaved blocks
            ours.append(timed(lambda x: dist.all_reduce(x), t, iters))
            theirs.append(timed(lambda x: dist.all_reduce(x, group=nccl), t, iters))
        m, n = statistics.median(ours), statistics.median(theirs)
        rows.append({"bytes": nbytes, "mtxcomm_us": m * 1e6, "nccl_us": n * 1e6, "ratio": m / n})
    return rows, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here (rank 0)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_cuda_check: SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
        sys.exit(77)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("mtxcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    expect(
        dist.Backend.backend_capability["mtxcomm"] == ["cpu", "cuda"],
        "the backend is not registered for cuda (libmtxcomm without CUDA?)",
    )
    check_collectives(dev, rank, size)
    diff = check_ddp(dev, rank, size)
    rows, why = compare_with_nccl(dev, args.repeats)
    path = os.environ.get("MTXCOMM_CUDA_PATH", "auto")
    if rank == 0:
        print(
            "torch_cuda_check: %d ranks, path %s: collectives ok; DDP bitwise equal across "
            "ranks, max |diff| vs one process %.3g" % (size, path, diff)
        )
        if rows is None:
            print("torch_cuda_check: no comparison with nccl: %s" % why)
        else:
            print("%12s %14s %14s %8s" % ("bytes", "mtxcomm us", "nccl us", "ratio"))
            for r in rows:
                print(
                    "%12d %14.1f %14.1f %8.3f"
                    % (r["bytes"], r["mtxcomm_us"], r["nccl_us"], r["ratio"])
                )
            worst = max(r["ratio"] for r in rows)
            print(
                "target mtxcomm <= 1.1x nccl at >= 1 MiB: worst %.3f (%s)"
                % (worst, "met" if worst <= 1.1 else "NOT met")
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "ranks": size,
                        "path": path,
                        "ddp_max_diff": diff,
                        "vs_nccl": rows,
                        "no_comparison": why,
                    },
                    f,
                    indent=1,
                )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
