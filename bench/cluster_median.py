#!/usr/bin/env python3
"""Runs `mtxcomm_bench allreduce` on the emulated cluster (tests/cluster/cluster.sh bench, as
root) several times per algorithm, alternating the algorithms run by run, and prints per size
the median latency of each algorithm, the ratio of each to the first, and with --predict the
cost model's prediction beside each measurement (read from rank 0's MTXCOMM_LOG_LEVEL=DEBUG
selection log, which names the predicted time of every call) and measured / predicted.

  bench/cluster_median.py --layout "2 2" --runs 3 --algos ring,hierarchical --predict \
      --tuning FILE -- -m 4K:64M -i 5
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layout", default="2 2", help='ranks per node, e.g. "2 2"')
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--algos", default="ring", help="comma-separated allreduce algorithms")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--predict", action="store_true", help="show the cost model's predictions")
    ap.add_argument("--tuning", help="MTXCOMM_TUNING_FILE for the ranks")
    ap.add_argument("extra", nargs="*", help="more mtxcomm_bench arguments (after --)")
    args = ap.parse_args()

    algos = args.algos.split(",")
    cluster = os.path.join(HERE, "..", "tests", "cluster", "cluster.sh")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ranks_env = []
    if args.predict:
        ranks_env.append("MTXCOMM_LOG_LEVEL=DEBUG")
    if args.tuning:
        ranks_env.append("MTXCOMM_TUNING_FILE=" + os.path.abspath(args.tuning))
    env["CLUSTER_BENCH_ENV"] = " ".join(ranks_env)
    # "[mtxcomm node0:123 rank 0] DEBUG allreduce 1024 x 4 B on 4 ranks, 2 node(s): ring (...),
    # predicted 1.23 ms"
    debug = re.compile(
        r"rank 0\] DEBUG allreduce (\d+) x (\d+) B on .*?predicted ([0-9.e+-]+) (us|ms|s)"
    )
    unit = {"us": 1.0, "ms": 1e3, "s": 1e6}
    rows = {a: {} for a in algos}  # algo -> size -> [row, ...]
    for run in range(args.runs):
        for algo in algos:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = [
                    "bash",
                    cluster,
                    "bench",
                    args.build,
                    args.layout,
                    "--",
                    "allreduce",
                    "-a",
                    algo,
                    "--json",
                    f.name,
                ] + args.extra
                res = subprocess.run(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
                if res.returncode != 0:
                    sys.exit(
                        f"run {run} {algo}: {' '.join(cmd)} failed ({res.returncode}):\n"
                        f"{res.stdout}"
                    )
                predicted = {}
                for m in debug.finditer(res.stdout):
                    predicted[int(m.group(1)) * int(m.group(2))] = (
                        float(m.group(3)) * unit[m.group(4)]
                    )
                for row in json.load(open(f.name))["rows"]:
                    if row["size"] in predicted:
                        row["predicted_us"] = predicted[row["size"]]
                    rows[algo].setdefault(row["size"], []).append(row)

    print(
        f"# allreduce float32 sum, layout {args.layout} (ranks per node), {args.runs} runs, "
        f"medians of the per-rank average latency; extra args: {' '.join(args.extra) or '(none)'}"
    )
    head = f"| {'size':>9} |"
    for a in algos:
        head += f" {a} (us) |"
        if any("predicted_us" in r for rs in rows[a].values() for r in rs):
            head += f" {a} predicted (us) | measured/predicted |"
    for a in algos[1:]:
        head += f" {a}/{algos[0]} |"
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    sizes = sorted(set().union(*[set(rows[a]) for a in algos]))
    for size in sizes:
        line = f"| {size:>9} |"
        med = {}
        for a in algos:
            rs = rows[a].get(size, [])
            med[a] = statistics.median(r["avg_us"] for r in rs) if rs else float("nan")
            line += f" {med[a]:.1f} |"
            if any("predicted_us" in r for rs2 in rows[a].values() for r in rs2):
                pred = [r["predicted_us"] for r in rs if "predicted_us" in r]
                p = statistics.median(pred) if pred else float("nan")
                line += f" {p:.1f} | {med[a] / p:.2f} |"
        for a in algos[1:]:
            line += f" {med[a] / med[algos[0]]:.2f} |"
        print(line)


if __name__ == "__main__":
    main()
