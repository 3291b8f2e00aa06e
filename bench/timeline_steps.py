#!/usr/bin/env python3
"""Three training steps of an mtxcomm timeline, drawn and tabulated (bench/RESULTS.md, "Training").

  bench/timeline_steps.py PATH [--step K] [--steps 3] [--png FILE]

PATH is the timeline path given to `mtxrun --timeline PATH` (or MTXCOMM_TIMELINE): the files
PATH.0, PATH.1, ... one per rank. The gradient allreduces are the tensors whose name contains
"Allreduce" (the ops of the traced train step); step k is the k-th request of every such tensor.
Rank r's clock is aligned to rank 0's at the start of the first drawn step's largest allreduce
(both ranks start a collective within microseconds of each other).

Prints, per step and tensor: when it was submitted (NEGOTIATE starts), when the ranks agreed,
when its allreduce ran (start, end; ms from the step's first submission), its bytes and the
tensors it was fused with. --png draws the steps: one row per rank and tensor (negotiation,
queue, collective) and one per rank for the engine's cycles.
"""

import argparse
import glob
import json


def load(path):
    """{rank: ({tid: name}, [complete events])}"""
    out = {}
    for f in sorted(glob.glob(path + ".*")):
        suffix = f[len(path) + 1 :]
        if not suffix.isdigit():
            continue
        with open(f) as fh:
            ev = json.load(fh)
        ev = ev if isinstance(ev, list) else ev["traceEvents"]
        names = {
            e["tid"]: e["args"]["name"]
            for e in ev
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }
        out[int(suffix)] = (names, [e for e in ev if e.get("ph") == "X"])
    if not out:
        raise SystemExit("no timeline files %s.N" % path)
    return out


def steps_of(names, events):
    """[{tensor: {"negotiate": ev, "queue": ev, "allreduce": ev}}] in step order."""
    grads = {tid: n for tid, n in names.items() if "Allreduce" in n}
    per = {tid: {"negotiate": [], "queue": [], "allreduce": []} for tid in grads}
    for e in sorted(events, key=lambda e: e["ts"]):
        kind = e["name"].lower()
        if e.get("tid") in per and kind in per[e["tid"]]:
            per[e["tid"]][kind].append(e)
    n = min(len(v["negotiate"]) for v in per.values()) if per else 0
    steps = []
    for k in range(n):
        step = {}
        for tid, v in per.items():
            if k < len(v["queue"]) and k < len(v["allreduce"]):
                step[grads[tid]] = {kind: v[kind][k] for kind in v}
        if len(step) == len(per):
            steps.append(step)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument(
        "--step", type=int, default=None, help="first step drawn (default: the middle of the run)"
    )
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--png", default=None)
    args = ap.parse_args()
    ranks = load(args.path)
    per_rank = {r: steps_of(*v) for r, v in ranks.items()}
    count = min(len(s) for s in per_rank.values())
    if count < args.steps:
        raise SystemExit("only %d complete steps in the timeline" % count)
    first = args.step if args.step is not None else (count - args.steps) // 2
    chosen = range(first, first + args.steps)
    big = max(per_rank[0][first], key=lambda t: per_rank[0][first][t]["allreduce"]["args"]["bytes"])
    shift = {
        r: per_rank[0][first][big]["allreduce"]["ts"] - per_rank[r][first][big]["allreduce"]["ts"]
        for r in per_rank
    }
    origin = min(
        e["negotiate"]["ts"] + shift[r] for r in per_rank for e in per_rank[r][first].values()
    )
    ms = lambda r, t: (t + shift[r] - origin) / 1000.0  # noqa: E731
    print(
        "steps %d..%d of %d; times in ms from the first drawn step's first submission "
        "(rank 0's clock)" % (first, first + args.steps - 1, count)
    )
    for k in chosen:
        s0 = per_rank[0][k]
        order = sorted(s0, key=lambda t: s0[t]["negotiate"]["ts"])
        start = min(ms(0, s0[t]["negotiate"]["ts"]) for t in order)
        print("\nstep %d (starts at %.2f ms)" % (k, start))
        print(
            "  %-44s %9s %9s %9s %9s %9s %9s"
            % ("tensor", "bytes", "submit0", "submit1", "agreed", "ar start", "ar end")
        )
        for t in order:
            e0 = s0[t]
            sub = [ms(r, per_rank[r][k][t]["negotiate"]["ts"]) for r in sorted(per_rank)]
            neg = e0["negotiate"]
            ar = e0["allreduce"]
            fused = ar["args"].get("fused_tensors", 1)
            print(
                "  %-44s %9d %9.2f %9s %9.2f %9.2f %9.2f%s"
                % (
                    t[-44:],
                    ar["args"]["bytes"],
                    sub[0],
                    "%.2f" % sub[1] if len(sub) > 1 else "-",
                    ms(0, neg["ts"] + neg["dur"]),
                    ms(0, ar["ts"]),
                    ms(0, ar["ts"] + ar["dur"]),
                    "  (fused: %d tensors)" % fused if fused > 1 else "",
                )
            )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tensors = sorted(per_rank[0][first], key=lambda t: per_rank[0][first][t]["negotiate"]["ts"])
        rows = []
        for r in sorted(per_rank):
            rows.append((r, "engine"))
            rows += [(r, t) for t in tensors]
        fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.5))
        lo = ms(0, min(e["negotiate"]["ts"] for e in per_rank[0][first].values())) - 1
        hi = (
            max(
                ms(r, e["allreduce"]["ts"] + e["allreduce"]["dur"])
                for r in per_rank
                for e in per_rank[r][first + args.steps - 1].values()
            )
            + 1
        )
        colours = {"negotiate": "#9ecae1", "queue": "#bdbdbd", "allreduce": "#08519c"}
        for y, (r, t) in enumerate(rows):
            if t == "engine":
                names, events = ranks[r]
                for e in events:
                    if e["name"] == "CYCLE" and lo <= ms(r, e["ts"]) <= hi:
                        ax.barh(
                            y, max(e["dur"] / 1000.0, 0.05), left=ms(r, e["ts"]), color="#fd8d3c"
                        )
                continue
            for k in chosen:
                for kind, c in colours.items():
                    e = per_rank[r][k][t][kind]
                    ax.barh(y, max(e["dur"] / 1000.0, 0.05), left=ms(r, e["ts"]), color=c)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(["rank %d  %s" % (r, t.split("/")[-1]) for r, t in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(lo, hi)
        ax.set_xlabel("ms (rank 0's clock)")
        ax.set_title(
            "%d training steps: negotiation (light), queue (grey), allreduce (dark), "
            "engine cycles (orange)" % args.steps,
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print("\nwrote", args.png)


if __name__ == "__main__":
    main()
