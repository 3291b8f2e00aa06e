#!/usr/bin/env python3
"""A/B of two mtxcomm_bench binaries (a change and its base), interleaved on a noisy machine:
runs A, B, A, B, ... `mtxcomm_bench COLLECTIVE --vs-mpi --json` under mpirun and prints per size
the median latency of each, B / A, and each one's median ratio to Open MPI measured in the same
run (the ratio to MPI cancels most of the machine's noise).

  bench/ab_compare.py --a /tmp/base/build/bench/mtxcomm_bench --b build/bench/mtxcomm_bench \\
      --np 2 --runs 3 -- -m 4:64M

A and B may also be one binary under two environments (--a-env, --b-env: NAME=VALUE...), e.g.
the flight recorder off against its default:

  bench/ab_compare.py --a build/bench/mtxcomm_bench --a-env MTXCOMM_FLIGHT_RECORDER=0 \\
      --b build/bench/mtxcomm_bench --runs 7 -- -m 8:64K
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile


def run(bench, np_, collective, extra, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = ["mpirun", "-np", str(np_)] + (["--oversubscribe"] if np_ > (os.cpu_count() or 1) else [])
    cmd += [bench, collective, "--vs-mpi", "--json", path] + extra
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(path) as f:
        rows = json.load(f)["rows"]
    os.unlink(path)
    return {r["size"]: (r["avg_us"], r["ratio"]) for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--a", required=True, help="the base binary")
    ap.add_argument("--b", required=True, help="the changed binary")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--collective", default="allreduce")
    ap.add_argument(
        "--a-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="environment variables of A's runs",
    )
    ap.add_argument(
        "--b-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="environment variables of B's runs",
    )
    ap.add_argument("extra", nargs="*", help="more mtxcomm_bench arguments (after --)")
    args = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    a_env = dict(env, **dict(kv.split("=", 1) for kv in args.a_env))
    b_env = dict(env, **dict(kv.split("=", 1) for kv in args.b_env))
    a_runs, b_runs = [], []
    for _ in range(args.runs):
        a_runs.append(run(args.a, args.np, args.collective, args.extra, a_env))
        b_runs.append(run(args.b, args.np, args.collective, args.extra, b_env))
    print("# %s, np=%d, %d interleaved runs each; medians" % (args.collective, args.np, args.runs))
    if args.a_env or args.b_env:
        print(
            "# A: %s; B: %s"
            % (" ".join(args.a_env) or "(as is)", " ".join(args.b_env) or "(as is)")
        )
    print("%10s %12s %12s %8s %10s %10s" % ("size", "A (us)", "B (us)", "B/A", "A/MPI", "B/MPI"))
    logs = []
    for size in sorted(a_runs[0]):
        a = statistics.median(r[size][0] for r in a_runs)
        b = statistics.median(r[size][0] for r in b_runs)
        am = statistics.median(r[size][1] for r in a_runs)
        bm = statistics.median(r[size][1] for r in b_runs)
        logs.append(math.log(bm / am))
        print("%10d %12.2f %12.2f %8.2f %10.2f %10.2f" % (size, a, b, b / a, am, bm))
    print(
        "# geometric mean over sizes of (B/MPI) / (A/MPI): %.3f" % math.exp(sum(logs) / len(logs))
    )


if __name__ == "__main__":
    sys.exit(main())
