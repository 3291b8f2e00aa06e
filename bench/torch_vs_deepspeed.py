"""allreduce latency: mtxcomm's torch.distributed backend against DeepSpeed's CPU shared-memory
allreduce, in the same job.

Every rank holds all three: the default group on "mtxcomm" through torch.distributed
(``dist.all_reduce(t)``, synchronous), the same group's C++ backend called directly
(``mtxcomm.torch.direct_all_reduce(t)``, in place, without torch.distributed's dispatch, as
DeepSpeed's op is called) and DeepSpeed's shm op (``deepspeed.comm.inference_all_reduce(t)``,
in place, SUM). DeepSpeed builds that op with its ShareMemCommBuilder (a JIT C++ extension,
compiled on first use with ninja and the host C++ compiler) when
``deepspeed.init_distributed()`` finds torch.distributed already initialised. DeepSpeed maps
the shared-memory segments of all ranks only when LOCAL_SIZE equals the world size; this script
sets LOCAL_SIZE from LOCAL_WORLD_SIZE (mtxrun and torchrun set that) when it is missing. The
script refuses to run if DeepSpeed would not use its shm op for float32 (no op, or a CPU
without AVX2): its inference_all_reduce would then call
torch.distributed.all_reduce, which is mtxcomm itself here.

Sizes are float32 tensors from --min-bytes x4 each step, then --max-bytes itself. Per size,
after a warm-up, R rounds each time K calls of each method in turn (each round starts with the
next method); the figure is the median over rounds of the per-call time and the ratios to
deepspeed (< 1: mtxcomm is faster). Each method's result is checked once per size against the
sum of the ranks' inputs.

    PYTHONPATH=/path/to/deepspeed-site DS_ACCELERATOR=cpu \\
        mtxrun -np 2 python bench/torch_vs_deepspeed.py [--max-bytes 1048576] [--rounds 7]

(TORCH_EXTENSIONS_DIR chooses where the op is compiled and cached.) Rank 0 prints a Markdown
table.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import mtxcomm.torch  # registers the backend; direct_all_reduce


def setup_deepspeed():
    """deepspeed.comm on top of the already-initialised default group, with its shm op."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "LOCAL_SIZE" not in os.environ:
        local = os.environ.get("LOCAL_WORLD_SIZE") or str(dist.get_world_size())
        os.environ["LOCAL_SIZE"] = local
    import deepspeed
    import deepspeed.comm as ds_comm
    from deepspeed.comm import comm as ds_comm_impl

    ds_comm.init_distributed(verbose=False)
    backend = ds_comm_impl.cdb
    op = getattr(backend, "shm_comm_op", None)
    level = getattr(backend, "shm_vector_kernel_level", 0)
    if op is None or level < 1:
        raise SystemExit(
            "DeepSpeed's shm allreduce is not in use (op %r, ISA level %d): its "
            "inference_all_reduce would fall back to torch.distributed.all_reduce" % (op, level)
        )
    return deepspeed.__version__, ds_comm.inference_all_reduce


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def timed(fn, x, k):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        fn(x)
    return (time.perf_counter() - t0) / k


def check(fn, count, n, r):
    """fn's in-place sum of a per-rank pattern equals the expected sum, on every element."""
    base = torch.arange(count, dtype=torch.float32) % 251
    x = base + (r + 1)
    fn(x)
    want = base * n + n * (n + 1) // 2
    return torch.equal(x, want)


def remove_ds_segment(r):
    """DeepSpeed leaves its per-rank shm segment in /dev/shm; remove this rank's one."""
    name = "/dev/shm/deepspeed_allreduce_buffer_%d_%s_%s_%d" % (
        os.getuid(),
        os.environ.get("MASTER_ADDR", ""),
        os.environ.get("MASTER_PORT", ""),
        r,
    )
    try:
        os.unlink(name)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    dist.init_process_group("mtxcomm")
    n, r = dist.get_world_size(), dist.get_rank()
    ds_version, ds_all_reduce = setup_deepspeed()
    methods = {
        "mtxcomm": lambda t: dist.all_reduce(t),
        "direct": mtxcomm.torch.direct_all_reduce,
        "deepspeed": ds_all_reduce,
    }

    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    if sizes and sizes[-1] < args.max_bytes:
        sizes.append(args.max_bytes)  # the ladder stops short of it (8 B x 4^k never is 1 MiB)
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        k = max(200, min(2000, (16 << 20) // size))
        ok = {name: check(fn, count, n, r) for name, fn in methods.items()}
        bufs = {name: torch.zeros(count) for name in methods}
        for name, fn in methods.items():  # warm-up
            timed(fn, bufs[name], max(1, k // 4))
        times = {name: [] for name in methods}
        order = list(methods)
        for _ in range(args.rounds):
            for name in order:
                times[name].append(timed(methods[name], bufs[name], k))
            order = order[1:] + order[:1]  # each method first in turn
        med = {name: statistics.median(v) for name, v in times.items()}
        verdict = torch.tensor([int(all(ok.values()))], dtype=torch.int32)
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        rows.append((count * 4, k, med, ok, bool(verdict.item())))

    if r == 0:
        kind = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__module__
        print(
            "torch %s, deepspeed %s, %s, np=%d, float32, default group %s"
            % (torch.__version__, ds_version, cpu_model(), n, kind)
        )
        print(
            "| bytes | mtxcomm dist.all_reduce (µs) | mtxcomm direct_all_reduce (µs) "
            "| deepspeed inference_all_reduce (µs) | dist.all_reduce / deepspeed "
            "| direct / deepspeed |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for nbytes, _k, med, ok, all_ok in rows:
            ds = med["deepspeed"]
            print(
                "| %d | %.2f | %.2f | %.2f | %.2f | %.2f |"
                % (
                    nbytes,
                    med["mtxcomm"] * 1e6,
                    med["direct"] * 1e6,
                    ds * 1e6,
                    med["mtxcomm"] / ds,
                    med["direct"] / ds,
                )
            )
            if not all_ok:
                print("  WRONG RESULT at %d bytes (rank 0: %s)" % (nbytes, ok))
        print(
            "(median of %d rounds; calls per round: %s)"
            % (args.rounds, ", ".join("%d B: %d" % (b, k) for b, k, *_ in rows))
        )
    dist.barrier()
    remove_ds_segment(r)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
