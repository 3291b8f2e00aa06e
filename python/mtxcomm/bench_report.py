"""Renders the page of ``mtxcomm_bench report -o DIR``: ``python -m mtxcomm.bench_report DIR``.

Reads ``DIR/results.json`` (written by the C++ driver, bench/bench_sweep.h) and writes, with
matplotlib (Agg backend), one latency and one busbw plot per collective (every algorithm,
Open MPI and the floor against the message size), one ratio plot per collective (the
automatic choice / Open MPI and / floor), the measured-vs-predicted plot and the projection
plot, each as PNG and SVG, and ``DIR/index.html``: a self-contained page (plots embedded as
PNG data) with the machine and the job's layout, the automatic choice per size, the tables of
the ratios, the tuned parameters and the projection to 1024 nodes, and which parts of the model
are measured and which assumed. Works on a partial results.json (an interrupted report): it
renders the runs that finished and says the report is incomplete.
"""

import base64
import html
import io
import json
import math
import os
import sys

PLOT_KINDS = ("latency", "busbw", "ratio")


def _human(n):
    n = int(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d %s" % (n // size, unit)
    return "%d B" % n


def _runs_by_collective(doc):
    out = {}
    for run in doc.get("runs", []):
        if run.get("rows") is None:
            continue
        out.setdefault(run["collective"], []).append(run)
    return out


def _series(run, key):
    rows = [r for r in run["rows"] if key in r and r.get("size", 0) > 0]
    return [r["size"] for r in rows], [r[key] for r in rows]


def _label(run):
    if run["algorithm"] == "auto":
        return "mtxcomm auto"
    return "mtxcomm " + run["algorithm"] + (" (declines)" if run.get("declined") else "")


def _save(fig, out_dir, name):
    paths = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, "%s.%s" % (name, ext))
        fig.savefig(path, dpi=110 if ext == "png" else None, bbox_inches="tight")
        paths.append(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return paths, base64.b64encode(buf.getvalue()).decode()


def _finish(fig, ax, out_dir, name, title, xlabel, ylabel, logy=True, legend=7, ncol=1, plt=None):
    """The common end of every plot: log axes, labels, grid, legend; saved as PNG and SVG.
    Returns the base64 PNG."""
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend, ncol=ncol)
    _, png = _save(fig, out_dir, name)
    plt.close(fig)
    return png


def _shown(runs):
    """The runs plotted: auto and every algorithm that ran as itself on this layout."""
    return [r for r in runs if r["algorithm"] == "auto" or not r.get("declined")]


def _plots(doc, out_dir, plt):
    """{collective: {kind: base64 PNG}}, plus the extra plots under key ''."""
    images = {}
    for coll, runs in _runs_by_collective(doc).items():
        auto = next((r for r in runs if r["algorithm"] == "auto"), runs[0])
        has_data = any(r.get("size", 0) > 0 for r in auto["rows"])
        images[coll] = {}
        if not has_data:
            continue
        # Latency.
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for run in _shown(runs):
            x, y = _series(run, "avg_us")
            ax.plot(x, y, marker=".", label=_label(run), linewidth=2 if run is auto else 1)
        x, y = _series(auto, "mpi_avg_us")
        if x:
            ax.plot(x, y, "k--", marker="x", label="Open MPI")
        x, y = _series(auto, "floor_us")
        if x:
            ax.plot(x, y, color="grey", linestyle=":", label="floor (least data movement)")
        images[coll]["latency"] = _finish(
            fig,
            ax,
            out_dir,
            "%s_latency" % coll,
            "%s: latency" % coll,
            "message size (bytes; %s)" % auto.get("size_meaning", "")[:60],
            "latency (us)",
            plt=plt,
        )
        # busbw.
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for run in _shown(runs):
            x, y = _series(run, "busbw_gbps")
            ax.plot(x, y, marker=".", label=_label(run), linewidth=2 if run is auto else 1)
        factor = _busbw_factor(auto, doc)
        mx, my = _series(auto, "mpi_avg_us")
        if mx and factor is not None:
            ax.plot(
                mx,
                [s / (t * 1e-6) / 1e9 * factor for s, t in zip(mx, my)],
                "k--",
                marker="x",
                label="Open MPI",
            )
        fx, fy = _series(auto, "floor_us")
        if fx and factor is not None:
            ax.plot(
                fx,
                [s / (t * 1e-6) / 1e9 * factor if t > 0 else float("nan") for s, t in zip(fx, fy)],
                color="grey",
                linestyle=":",
                label="floor",
            )
        images[coll]["busbw"] = _finish(
            fig,
            ax,
            out_dir,
            "%s_busbw" % coll,
            "%s: bus bandwidth" % coll,
            "message size (bytes)",
            "busbw (GB/s)",
            logy=False,
            plt=plt,
        )
        # Ratios of the automatic choice.
        fig, ax = plt.subplots(figsize=(7.5, 3.4))
        x, y = _series(auto, "ratio")
        if x:
            ax.plot(x, y, marker="o", label="mtxcomm auto / Open MPI")
        x, y = _series(auto, "x_floor")
        if x:
            ax.plot(x, y, marker="s", label="mtxcomm auto / floor")
        x, y = _series(auto, "best_x_floor")
        if x:
            ax.plot(x, y, marker="^", label="mtxcomm auto best call / floor")
        ax.axhline(1.0, color="k", linewidth=0.8)
        images[coll]["ratio"] = _finish(
            fig,
            ax,
            out_dir,
            "%s_ratio" % coll,
            "%s: ratios" % coll,
            "message size (bytes)",
            "time ratio (< 1: mtxcomm faster)",
            plt=plt,
        )
    images[""] = {}
    # Measured vs predicted (allreduce, every algorithm that ran as itself).
    runs = _runs_by_collective(doc).get("allreduce", [])
    if runs:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for run in _shown(runs):
            x, y = _series(run, "avg_us")
            px, py = _series(run, "predicted_us")
            (line,) = ax.plot(x, y, marker=".", label=_label(run) + " measured")
            if px:
                ax.plot(
                    px, py, linestyle="--", color=line.get_color(), label=_label(run) + " predicted"
                )
        images[""]["predicted"] = _finish(
            fig,
            ax,
            out_dir,
            "allreduce_predicted",
            "allreduce: measured vs the cost model's prediction",
            "message size (bytes)",
            "latency (us)",
            legend=6,
            plt=plt,
        )
    proj = doc.get("projection")
    if proj and proj.get("rows"):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for size in sorted({r["bytes"] for r in proj["rows"]}):
            rows = [r for r in proj["rows"] if r["bytes"] == size]
            for name, style in (("ring", "-"), ("recursive_doubling", "--"), ("hierarchical", ":")):
                pts = [(r["nodes"], r["predicted_seconds"].get(name)) for r in rows]
                pts = [(n, s * 1e3) for n, s in pts if s is not None]
                if pts:
                    ax.plot(
                        *zip(*pts),
                        linestyle=style,
                        marker=".",
                        label="%s %s" % (_human(size), name),
                    )
        images[""]["projection"] = _finish(
            fig,
            ax,
            out_dir,
            "projection",
            "projection with the tuned parameters",
            "nodes (x %d ranks per node)" % proj["rows"][0]["ranks_per_node"],
            "predicted allreduce time (ms)",
            legend=6,
            ncol=3,
            plt=plt,
        )
    return images


def _busbw_factor(auto, doc):
    rows = [r for r in auto["rows"] if r.get("avg_us") and r.get("busbw_gbps")]
    if not rows:
        return None
    r = rows[0]
    algbw = r["size"] / (r["avg_us"] * 1e-6) / 1e9
    return r["busbw_gbps"] / algbw if algbw > 0 else None


def _table(headers, rows):
    out = ["<table><tr>" + "".join("<th>%s</th>" % html.escape(str(h)) for h in headers) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join("<td>%s</td>" % c for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _fmt(v, digits=2):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return ("%." + str(digits) + "f") % v


def _machine_html(doc):
    m = doc.get("machine", {})
    lay = doc.get("layout", {})
    caches = ", ".join(
        "L%s %s %s" % (c.get("level"), c.get("type", "").lower(), c.get("size"))
        for c in m.get("caches", [])
    )
    rows = [
        ("CPU", html.escape(m.get("cpu", "?"))),
        ("logical CPUs (rank 0's host)", m.get("logical_cpus", "?")),
        ("caches (cpu0)", html.escape(caches or "?")),
        ("memory", "%.1f GiB" % (m.get("memory_bytes", 0) / 2**30)),
        ("host", html.escape(m.get("host", "?"))),
        (
            "job",
            "%s ranks on %s node(s), %s per node"
            % (lay.get("ranks", "?"), lay.get("nodes", "?"), lay.get("ranks_per_node", "?")),
        ),
        ("sizes", html.escape(doc.get("sizes", ""))),
    ]
    return _table(("", ""), rows)


def _collective_html(coll, runs, images):
    auto = next((r for r in runs if r["algorithm"] == "auto"), runs[0])
    parts = [
        "<h2 id='%s'>%s</h2>" % (coll, coll),
        "<p class='note'>%s; transport %s</p>"
        % (html.escape(auto.get("size_meaning", "")), html.escape(auto.get("transport", ""))),
    ]
    for kind in PLOT_KINDS:
        if kind in images.get(coll, {}):
            parts.append(
                "<img class='plot' alt='%s %s' src='data:image/png;base64,%s'>"
                % (coll, kind, images[coll][kind])
            )
    algos = [r for r in runs if r["algorithm"] != "auto"]
    declined = [r["algorithm"] for r in algos if r.get("declined")]
    rows = []
    for r in auto["rows"]:
        cells = [
            _human(r.get("size", 0)),
            _fmt(r.get("avg_us")),
            html.escape(r.get("algorithm", "")),
            _fmt(r.get("mpi_avg_us")),
            _fmt(r.get("ratio")),
            _fmt(r.get("floor_us")),
            _fmt(r.get("x_floor")),
            _fmt(r.get("best_x_floor")),
            _fmt(r.get("predicted_us")),
        ]
        # The fastest algorithm measured at this size.
        best, best_us = None, None
        for run in algos:
            if run.get("declined"):
                continue
            for rr in run["rows"]:
                if rr.get("size") == r.get("size") and rr.get("avg_us") is not None:
                    if best_us is None or rr["avg_us"] < best_us:
                        best, best_us = run["algorithm"], rr["avg_us"]
        cells.append(html.escape(best or "-"))
        ratio = r.get("ratio")
        cls = " class='bad'" if ratio is not None and ratio > 1.0 else ""
        cells[4] = "<span%s>%s</span>" % (cls, cells[4])
        rows.append(cells)
    parts.append(
        _table(
            (
                "size",
                "auto (us)",
                "auto's choice",
                "Open MPI (us)",
                "/ Open MPI",
                "floor (us)",
                "/ floor",
                "best call / floor",
                "predicted (us)",
                "fastest measured",
            ),
            rows,
        )
    )
    if declined:
        parts.append(
            "<p class='note'>Declined on this layout (fell back to another algorithm, "
            "not plotted): %s</p>" % html.escape(", ".join(declined))
        )
    bad = [r for r in runs if r.get("status") not in ("ok", None)]
    if bad:
        parts.append(
            "<p class='bad'>%s</p>"
            % html.escape("; ".join("%s: %s" % (r["algorithm"], r["status"]) for r in bad))
        )
    return "\n".join(parts)


def _projection_html(doc, images):
    proj = doc.get("projection")
    if not proj:
        return "<p>No projection (the tuner did not finish: %s).</p>" % html.escape(
            str(doc.get("projection_error", "interrupted"))
        )
    rows = []
    for r in proj["rows"]:
        p = r["predicted_seconds"]
        rows.append(
            [r["nodes"], r["ranks"], _human(r["bytes"])]
            + [
                _fmt((p.get(n) or float("nan")) * 1e3, 3)
                for n in ("ring", "recursive_doubling", "hierarchical")
            ]
            + [html.escape(r["selected"])]
        )
    intra, inter = proj["intra"], proj["inter"]
    parts = ["<h2 id='projection'>Projection: allreduce at 2 to 1024 nodes</h2>"]
    if "projection" in images.get("", {}):
        parts.append(
            "<img class='plot' alt='projection' src='data:image/png;base64,%s'>"
            % images[""]["projection"]
        )
    parts.append(
        "<p>Parameters (%s): intra-node alpha %.3g s, beta %.3g s/B, gamma %.3g s/B; "
        "inter-node alpha %.3g s, beta %.3g s/B, gamma %.3g s/B.</p>"
        % (
            html.escape(proj["parameters"]),
            intra["alpha"],
            intra["beta"],
            intra["gamma"],
            inter["alpha"],
            inter["beta"],
            inter["gamma"],
        )
    )
    network = (
        "measured: this job spans nodes, and the tuner fitted the inter-node alpha and "
        "beta to broadcasts and allreduces between the node leaders"
        if proj.get("network_measured")
        else "assumed: this job runs on one node, so there was no network to measure; the "
        "inter-node level is the library's default (20 us per message, 10 Gb/s), to be "
        "replaced by a report run across two nodes or more"
    )
    parts.append(
        "<p class='note'>Measured: the intra-node alpha and beta (fitted to shared-memory "
        "broadcasts and allreduces of this job) and gamma (this CPU's float32 sum). The "
        "network: %s. Assumed: the model itself (Hockney's alpha-beta with a reduction term "
        "per level, one link per node shared by its concurrent flows, no congestion in the "
        "network's core, uniform nodes), and the same ranks per node as this job.</p>" % network
    )
    parts.append(
        _table(
            (
                "nodes",
                "ranks",
                "size",
                "ring (ms)",
                "recursive doubling (ms)",
                "hierarchical (ms)",
                "selected",
            ),
            rows,
        )
    )
    return "\n".join(parts)


CSS = """body{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}th{background:#eee}
img.plot{display:block;max-width:100%;margin:.5em 0;border:1px solid #ddd}
.note{color:#555;font-size:13px}.bad{color:#b00;font-weight:bold}"""


def render(out_dir):
    """Writes the plots and index.html of out_dir/results.json; returns index.html's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(out_dir, "results.json")) as f:
        doc = json.load(f)
    images = _plots(doc, out_dir, plt)
    by_coll = _runs_by_collective(doc)
    body = ["<h1>mtxcomm cluster report</h1>"]
    if not doc.get("complete"):
        body.append(
            "<p class='bad'>Incomplete: the report was interrupted; what finished is shown.</p>"
        )
    body.append(_machine_html(doc))
    body.append(
        "<p>"
        + " | ".join("<a href='#%s'>%s</a>" % (c, c) for c in by_coll)
        + " | <a href='#projection'>projection</a></p>"
    )
    body.append(
        "<p class='note'>Every collective is timed with every result checked (-c), in "
        "blocks alternating with Open MPI's own collective on the same buffers "
        "(--vs-mpi); the floor is the time of the least data movement the collective "
        "needs on this layout, measured on this machine (bench/bench_floor.h). Ratios "
        "< 1: mtxcomm is faster.</p>"
    )
    for coll, runs in by_coll.items():
        body.append(_collective_html(coll, runs, images))
    if "predicted" in images.get("", {}):
        body.append(
            "<h2>Measured vs predicted</h2><img class='plot' alt='predicted' "
            "src='data:image/png;base64,%s'>" % images[""]["predicted"]
        )
    body.append(_projection_html(doc, images))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>mtxcomm report</title>"
        "<style>%s</style></head><body>%s</body></html>" % (CSS, "\n".join(body))
    )
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as f:
        f.write(page)
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write(
            "usage: python -m mtxcomm.bench_report DIR (DIR/results.json from "
            "mtxcomm_bench report -o DIR)\n"
        )
        return 2
    if not os.path.isfile(os.path.join(argv[0], "results.json")):
        sys.stderr.write("mtxcomm.bench_report: %s has no results.json\n" % argv[0])
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.stderr.write(
            "mtxcomm.bench_report: matplotlib is not installed (pip install "
            "matplotlib, or scripts/setup_python.sh)\n"
        )
        return 2
    print(render(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
