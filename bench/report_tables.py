"""Markdown tables for bench/RESULTS.md from `mtxcomm_bench report` runs (their results.json).

    python bench/report_tables.py report-np2/results.json [report-np4/results.json ...]

Prints, for each report: the machine line, the floor table of allreduce and broadcast
(collective / floor per size from 64 KiB), the small-size table against Open MPI (auto / Open MPI
below 64 KiB for allreduce and broadcast), and, for the first report, the projection table. The
sections of RESULTS.md marked "from a report run" are this script's output, pasted.
"""

import json
import sys


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d %s" % (n // size, unit)
    return "%d B" % n


def auto_rows(doc, coll):
    for run in doc["runs"]:
        if run["collective"] == coll and run["algorithm"] == "auto":
            return [r for r in run.get("rows", []) if r.get("size", 0) > 0]
    return []


def machine_line(doc):
    m, lay = doc["machine"], doc["layout"]
    caches = ", ".join(
        "L%s %s %s" % (c["level"], c["type"].lower(), c["size"]) for c in m.get("caches", [])
    )
    return "%s, %s logical CPUs (%s); %d ranks on %d node(s)" % (
        m.get("cpu"),
        m.get("logical_cpus"),
        caches,
        lay["ranks"],
        lay["nodes"],
    )


def floor_table(doc):
    out = [
        "| size | allreduce (us) | floor (us) | / floor | best call / floor | broadcast (us) | "
        "floor (us) | / floor | best call / floor |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ar = {r["size"]: r for r in auto_rows(doc, "allreduce")}
    bc = {r["size"]: r for r in auto_rows(doc, "broadcast")}
    for size in sorted(set(ar) | set(bc)):
        if size < 64 << 10:
            continue
        cells = [human(size)]
        for rows in (ar, bc):
            r = rows.get(size)
            if r is None or not r.get("floor_us"):
                cells += ["-", "-", "-", "-"]
            else:
                best = r.get("best_x_floor")
                cells += [
                    "%.1f" % r["avg_us"],
                    "%.1f" % r["floor_us"],
                    "**%.2f**" % r["x_floor"],
                    "**%.2f**" % best if best is not None else "-",
                ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def small_table(doc):
    out = [
        "| size | allreduce (us) | Open MPI (us) | ratio | broadcast (us) | Open MPI (us) | "
        "ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ar = {r["size"]: r for r in auto_rows(doc, "allreduce")}
    bc = {r["size"]: r for r in auto_rows(doc, "broadcast")}
    worst = {}
    for size in sorted(set(ar) | set(bc)):
        if size >= 64 << 10:
            continue
        cells = [human(size)]
        for name, rows in (("allreduce", ar), ("broadcast", bc)):
            r = rows.get(size)
            if r is None or not r.get("ratio"):
                cells += ["-", "-", "-"]
                continue
            worst[name] = max(worst.get(name, 0), r["ratio"])
            cells += ["%.2f" % r["avg_us"], "%.2f" % r["mpi_avg_us"], "**%.2f**" % r["ratio"]]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Worst ratio below 64 KiB: " + ", ".join("%s %.2f" % kv for kv in worst.items()))
    return "\n".join(out)


def projection_table(doc):
    proj = doc.get("projection")
    if not proj:
        return "(no projection: the report did not finish)"
    out = [
        "Parameters: %s. intra alpha %.3g s, beta %.3g s/B; inter alpha %.3g s, beta %.3g s/B."
        % (
            proj["parameters"],
            proj["intra"]["alpha"],
            proj["intra"]["beta"],
            proj["inter"]["alpha"],
            proj["inter"]["beta"],
        ),
        "",
        "| nodes | ranks | size | ring (ms) | recursive doubling (ms) | hierarchical (ms) | "
        "selected |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in proj["rows"]:
        p = r["predicted_seconds"]
        f = lambda v: "-" if v is None else "%.3f" % (v * 1e3)  # noqa: E731
        out.append(
            "| %d | %d | %s | %s | %s | %s | %s |"
            % (
                r["nodes"],
                r["ranks"],
                human(r["bytes"]),
                f(p.get("ring")),
                f(p.get("recursive_doubling")),
                f(p.get("hierarchical")),
                r["selected"],
            )
        )
    return "\n".join(out)


def main(paths):
    for i, path in enumerate(paths):
        with open(path) as f:
            doc = json.load(f)
        print(
            "### %s\n\n%s%s\n"
            % (path, machine_line(doc), "" if doc.get("complete") else " (INCOMPLETE)")
        )
        print("Floor (from 64 KiB):\n\n" + floor_table(doc) + "\n")
        print("Below 64 KiB against Open MPI:\n\n" + small_table(doc) + "\n")
        if i == 0:
            print("Projection:\n\n" + projection_table(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
