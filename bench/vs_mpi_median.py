#!/usr/bin/env python3
"""Runs `mtxcomm_bench COLLECTIVE --vs-mpi` several times under mpirun and prints, per size, the
median mtxcomm and MPI latencies and the median of the per-run ratios (mtxcomm / MPI), then the
geometric mean of the median ratios over a size range. The machine is shared and noisy: a
ratio measured in the same run, repeated, is the figure to quote.

  bench/vs_mpi_median.py --np 2 --runs 5 --collective allreduce -- -m 4:64M

With --floor among the extra arguments it also prints, per size, the medians of the floor, of
the collective's average over the floor and of its best call over the floor (bench_floor.h).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--collective", default="allreduce")
    ap.add_argument("--bench", default="build/bench/mtxcomm_bench")
    ap.add_argument("--geomean-from", type=int, default=64 << 10, help="bytes (default 64K)")
    ap.add_argument("--geomean-to", type=int, default=64 << 20, help="bytes (default 64M)")
    ap.add_argument("extra", nargs="*", help="more mtxcomm_bench arguments (after --)")
    args = ap.parse_args()

    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    per_size = {}
    for run in range(args.runs):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [
                "mpirun",
                "-np",
                str(args.np),
                "--oversubscribe",
                args.bench,
                args.collective,
                "--vs-mpi",
                "--json",
                f.name,
            ] + args.extra
            res = subprocess.run(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            if res.returncode != 0:
                sys.exit(f"run {run}: {' '.join(cmd)} failed:\n{res.stderr}")
            for row in json.load(open(f.name))["rows"]:
                per_size.setdefault(row["size"], []).append(row)

    print(
        f"# {args.collective}, {args.np} ranks, {args.runs} runs, medians; extra args: "
        f"{' '.join(args.extra) or '(none)'}"
    )
    floor = "--floor" in args.extra
    extra_head = f" {'floor(us)':>10} {'/floor':>7} {'best/floor':>10}" if floor else ""
    print(f"# {'Size':>10} {'mtxcomm(us)':>12} {'MPI(us)':>12} {'ratio':>7}{extra_head}  algorithm")
    in_range = []
    for size in sorted(per_size):
        rows = per_size[size]
        ours = statistics.median(r["avg_us"] for r in rows)
        mpi = statistics.median(r["mpi_avg_us"] for r in rows)
        ratio = statistics.median(r["ratio"] for r in rows)
        algos = sorted({r["algorithm"] for r in rows})
        extra = ""
        if floor and all(r.get("best_x_floor") is not None for r in rows):
            extra = (
                f" {statistics.median(r['floor_us'] for r in rows):>10.2f}"
                f" {statistics.median(r['x_floor'] for r in rows):>7.2f}"
                f" {statistics.median(r['best_x_floor'] for r in rows):>10.2f}"
            )
        elif floor:
            extra = f" {'-':>10} {'-':>7} {'-':>10}"
        print(f"  {size:>10} {ours:>12.2f} {mpi:>12.2f} {ratio:>7.2f}{extra}  {','.join(algos)}")
        if args.geomean_from <= size <= args.geomean_to:
            in_range.append(ratio)
    below = [
        statistics.median(r["ratio"] for r in per_size[s])
        for s in per_size
        if s < args.geomean_from
    ]
    if in_range:
        gm = math.exp(sum(math.log(r) for r in in_range) / len(in_range))
        print(
            f"# geometric mean of the ratio over {args.geomean_from}..{args.geomean_to} B: "
            f"{gm:.2f}; max {max(in_range):.2f}"
        )
    if below:
        print(f"# below {args.geomean_from} B: max ratio {max(below):.2f}")


if __name__ == "__main__":
    main()
