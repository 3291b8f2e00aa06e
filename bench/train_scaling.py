#!/usr/bin/env python3
"""Training throughput of plain Keras scripts, 1 process against 2 ranks, at the DEFAULT launch
(no thread variable set by hand), interleaved runs, medians (bench/RESULTS.md, "Training").

  bench/train_scaling.py [--runs 3] [--epochs 6] [--json FILE]

Per run, in this order:
  mlp 1p          python bench/models/mlp_digits.py              (TensorFlow's own threading)
  mlp 1p 1core    the same pinned to one core with one thread (taskset -c 0,
                  TF_NUM_INTRAOP_THREADS=TF_NUM_INTEROP_THREADS=1)
  mlp mtxcomm np2 mtxrun -np 2 --transparent python bench/models/mlp_digits.py
  mlp mwms np2    the same model under tf.distribute.MultiWorkerMirroredStrategy, 2 local
                  workers (TF_CONFIG), global batch 256
  digits 1p       python examples/keras_digits.py (the main job), seconds per epoch
  digits np2      mtxrun -np 2 --transparent python examples/keras_digits.py
Then the binding's overhead once per run: mtxrun -np 2 python bench/tf_op_latency.py (the
median over its interleaved blocks of allreduce minus x * 2).
Ratios: throughput = 1 / (ms per step); np2 vs 1p is the speedup of the same global batch.
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(REPO, ".venv", "bin", "python")
MTXRUN = os.path.join(REPO, ".venv", "bin", "mtxrun")
MLP = os.path.join(REPO, "bench", "models", "mlp_digits.py")
DIGITS = os.path.join(REPO, "examples", "keras_digits.py")


def clean_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMIX_", "TF_NUM_", "OMP_NUM", "MTXCOMM_"))
    }
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2"
    )
    env.update(extra)
    return env


def out(cmd, env, timeout=1200):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit("failed: %s\n%s\n%s" % (" ".join(cmd), p.stdout[-2000:], p.stderr[-3000:]))
    return p.stdout


def ms_per_step(text):
    m = re.findall(r"ms per step: ([0-9.]+)", text)
    if not m:
        raise SystemExit("no 'ms per step' in:\n" + text[-2000:])
    return float(m[0])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mwms(epochs):
    ports = [free_port(), free_port()]
    workers = ["127.0.0.1:%d" % p for p in ports]
    procs = []
    for i in range(2):
        cfg = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(
            subprocess.Popen(
                [PY, MLP, "--strategy", "mwms", "--epochs", str(epochs)],
                env=clean_env(TF_CONFIG=cfg),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        )
    outs = [p.communicate(timeout=1200) for p in procs]
    # A worker that finishes first may make the other report its missing heartbeats at exit:
    # the figure is the step time either worker measured (the same steps, synchronised).
    times = [float(v) for o, _ in outs for v in re.findall(r"ms per step: ([0-9.]+)", o)]
    if not times:
        raise SystemExit(
            "mwms workers failed:\n" + "\n".join(o[-2000:] + e[-3000:] for o, e in outs)
        )
    return max(times)


def seconds_per_epoch(text):
    return float(re.findall(r"seconds per epoch: ([0-9.]+)", text)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--digits-epochs", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    e = str(args.epochs)
    res = {
        k: []
        for k in (
            "mlp 1p",
            "mlp 1p 1core",
            "mlp mtxcomm np2",
            "mlp mwms np2",
            "digits 1p",
            "digits np2",
            "op ms",
            "allreduce ms",
            "overhead us",
        )
    }
    for run in range(args.runs):
        res["mlp 1p"].append(ms_per_step(out([PY, MLP, "--epochs", e], clean_env())))
        res["mlp 1p 1core"].append(
            ms_per_step(
                out(
                    ["taskset", "-c", "0", PY, MLP, "--epochs", e],
                    clean_env(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1"),
                )
            )
        )
        res["mlp mtxcomm np2"].append(
            ms_per_step(
                out([MTXRUN, "-np", "2", "--transparent", PY, MLP, "--epochs", e], clean_env())
            )
        )
        res["mlp mwms np2"].append(mwms(args.epochs))
        d = ["--epochs", str(args.digits_epochs), "--verbose", "0"]
        res["digits 1p"].append(seconds_per_epoch(out([PY, DIGITS] + d, clean_env())))
        res["digits np2"].append(
            seconds_per_epoch(
                out([MTXRUN, "-np", "2", "--transparent", PY, DIGITS] + d, clean_env())
            )
        )
        lat = out(
            [MTXRUN, "-np", "2", PY, os.path.join(REPO, "bench", "tf_op_latency.py")], clean_env()
        )
        vals = [float(v) for v in re.findall(r"median ([0-9.]+) us", lat)]
        res["op ms"].append(vals[0] / 1e3)
        res["allreduce ms"].append(vals[1] / 1e3)
        res["overhead us"].append(vals[2])  # per interleaved block (tf_op_latency.py)
        print("run %d: %s" % (run, {k: v[-1] for k, v in res.items()}), flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("\nmedians of %d interleaved runs:" % args.runs)
    for k, v in med.items():
        unit = (
            "s/epoch" if k.startswith("digits") else "" if k.endswith((" ms", " us")) else "ms/step"
        )
        print("  %-16s %.3f %s" % (k, v, unit))
    ratios = {
        "mtxcomm np2 vs 1p (throughput)": med["mlp 1p"] / med["mlp mtxcomm np2"],
        "mtxcomm np2 vs 1p 1core (throughput)": med["mlp 1p 1core"] / med["mlp mtxcomm np2"],
        "mtxcomm np2 vs mwms np2 (throughput)": med["mlp mwms np2"] / med["mlp mtxcomm np2"],
        "digits np2 / 1p (epoch time)": med["digits np2"] / med["digits 1p"],
        "binding overhead us (allreduce - x*2)": med["overhead us"],
    }
    print("ratios:")
    for k, v in ratios.items():
        print("  %-40s %.2f" % (k, v))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": res, "medians": med, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
