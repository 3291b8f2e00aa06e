"""mtxcomm_bench report end to end, on a tiny sweep (seconds): the sweep over every collective
and algorithm with --vs-mpi, -c and --floor, the tuner, the projection, results.json, the
plots, index.html, and index.html opened in headless Chromium and screenshotted.
Runs in ONE plain process (it launches its own mpirun job):
    python -m pytest -q -p no:cacheprovider tests/python/test_bench_report.py
Needs build/bench/mtxcomm_bench (scripts/build.sh) and matplotlib (scripts/setup_python.sh);
the screenshot needs Debian's chromium (scripts/install_deps.sh).
"""

import json
import os
import shutil
import subprocess

import pytest
from conftest import REPO
from mtxrun_jobs import VENV_BIN, job_env

# MTXCOMM_BENCH: another build's binary (default: the one scripts/build.sh builds).
BENCH = os.environ.get("MTXCOMM_BENCH") or os.path.join(REPO, "build", "bench", "mtxcomm_bench")
COLLECTIVES = [
    "allreduce",
    "broadcast",
    "reduce",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "barrier",
]


REPORT_ITERS, REPORT_WARMUP = 100, 3  # the report fixture's -i and -x


def run_report(out, *args, python=None):
    """`mpirun -np 2 mtxcomm_bench report -o out ARGS`, rendered by python (default: the venv's)."""
    env = job_env()
    env["MTXCOMM_PYTHON"] = python or os.path.join(VENV_BIN, "python")
    return subprocess.run(
        ["mpirun", "-np", "2", BENCH, "report", "-o", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not os.path.exists(BENCH):
        pytest.fail("%s is missing: build it with scripts/build.sh" % BENCH, pytrace=False)
    # A quote and a space in -o (test_report_renders_into_any_directory_name...), and -i/-x
    # below the defaults (test_report_runs_honour_iterations_and_warmup).
    out = tmp_path_factory.mktemp("report") / "it's a dir" / "r"
    p = run_report(out, "-m", "4:64", "-i", str(REPORT_ITERS), "-x", str(REPORT_WARMUP))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with open(out / "results.json") as f:
        return out, json.load(f), p.stderr


def test_every_collective_and_algorithm_was_swept(report):
    out, doc, _ = report
    assert doc["complete"] is True
    assert doc["layout"]["ranks"] == 2 and doc["layout"]["nodes"] == 1
    assert doc["machine"]["cpu"] and doc["machine"]["caches"]
    seen = {(r["collective"], r["algorithm"]) for r in doc["runs"]}
    for coll in COLLECTIVES:
        assert (coll, "auto") in seen, coll
    assert ("allreduce", "ring") in seen and ("allreduce", "shm") in seen
    for run in doc["runs"]:
        assert run["status"] == "ok", run
        assert os.path.exists(out / "runs" / ("%s.%s.json" % (run["collective"], run["algorithm"])))
        for row in run["rows"]:
            assert row.get("wrong", 0) == 0 and row.get("mpi_wrong", 0) == 0, row
            assert row["avg_us"] > 0 and row["mpi_avg_us"] > 0, row
            if run["collective"] != "barrier":
                # The floor is measured and is below the collective (it moves the least data).
                assert row["floor_us"] > 0, row
                assert row["x_floor"] > 0.3, row
                # The best call is timed as the floor is, and its ratio is of those two.
                assert row["best_us"] > 0, row
                assert abs(row["best_x_floor"] - row["best_us"] / row["floor_us"]) < 1e-9, row
    auto = next(
        r for r in doc["runs"] if r["collective"] == "allreduce" and r["algorithm"] == "auto"
    )
    assert [r["size"] for r in auto["rows"]] == [4, 8, 16, 32, 64]
    # A forced algorithm that cannot run on one node (hierarchical) is recorded as declined
    # after one size, not timed again as another algorithm.
    hier = next(
        r
        for r in doc["runs"]
        if r["collective"] == "allreduce" and r["algorithm"] == "hierarchical"
    )
    assert hier["declined"] is True and len(hier["rows"]) == 1


def test_tuning_and_projection(report):
    out, doc, _ = report
    assert os.path.exists(out / "tuning.json")
    assert proj_params_positive(doc["projection"])
    proj = doc["projection"]
    assert "tuning.json" in proj["parameters"]
    # One node: no network was measured; the defaults stand in for it, and the page says so.
    assert proj["network_measured"] is False and "defaults" in proj["parameters"]
    nodes = sorted({r["nodes"] for r in proj["rows"]})
    assert nodes == [2**k for k in range(1, 11)]
    assert sorted({r["bytes"] for r in proj["rows"]}) == [1 << 20, 16 << 20, 256 << 20]
    for r in proj["rows"]:
        assert r["ranks"] == r["nodes"] * 2
        assert r["predicted_seconds"]["ring"] > 0
        assert r["selected"] in ("ring", "recursive_doubling", "rabenseifner", "hierarchical")
    # More nodes never make the ring's predicted 256 MiB allreduce faster.
    ring = [r["predicted_seconds"]["ring"] for r in proj["rows"] if r["bytes"] == 256 << 20]
    assert ring == sorted(ring)


def proj_params_positive(proj):
    return all(proj[level][k] > 0 for level in ("intra", "inter") for k in ("alpha", "beta"))


def test_progress_and_files(report):
    out, doc, stderr = report
    assert "ETA" in stderr and "[run 1/" in stderr
    for coll in COLLECTIVES[:-1]:
        for kind in ("latency", "busbw", "ratio"):
            for ext in ("png", "svg"):
                assert os.path.getsize(out / ("%s_%s.%s" % (coll, kind, ext))) > 1000
    html = (out / "index.html").read_text()
    for coll in COLLECTIVES[:-1]:
        for kind in ("latency", "busbw", "ratio"):
            assert "alt='%s %s'" % (coll, kind) in html, (coll, kind)
    assert "alt='projection'" in html and "Measured:" in html and "Assumed:" in html
    assert "Incomplete" not in html


def test_an_interrupted_report_renders_what_finished(report, tmp_path):
    out, doc, _ = report
    part = tmp_path / "partial"
    shutil.copytree(out, part)
    doc = dict(doc, complete=False, runs=doc["runs"][:3])
    doc.pop("projection")
    (part / "results.json").write_text(json.dumps(doc))
    p = subprocess.run(
        [os.path.join(VENV_BIN, "python"), "-m", "mtxcomm.bench_report", str(part)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    html = (part / "index.html").read_text()
    assert "Incomplete" in html and "alt='allreduce latency'" in html
    assert "alt='alltoall latency'" not in html


def test_the_floor_of_a_rooted_collective_at_three_ranks(tmp_path):
    # The root and the others move different bytes: every rank must still run the same
    # repetitions of the probe (a rank-dependent count once hung the job).
    env = job_env()
    out = tmp_path / "reduce.json"
    p = subprocess.run(
        [
            "mpirun",
            "-np",
            "3",
            "--oversubscribe",
            BENCH,
            "reduce",
            "-m",
            "4K:64K",
            "-r",
            "2",
            "--floor",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["size"] for r in rows] == [4096, 8192, 16384, 32768, 65536]
    assert all(r["floor_us"] > 0 for r in rows), rows


def test_the_floor_of_one_rank_is_zero_and_has_no_ratio(tmp_path):
    # One rank moves nothing: a floor of 0 and no ratio to it (an empty exchange's
    # synchronisation, about 0.03 us, once made every ratio meaningless).
    env = job_env()
    out = tmp_path / "one.json"
    p = subprocess.run(
        ["mpirun", "-np", "1", BENCH, "allreduce", "-m", "4K:8K", "--floor", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["size"] for r in rows] == [4096, 8192]
    for r in rows:
        assert r["floor_us"] == 0 and "x_floor" not in r and "best_x_floor" not in r, r
        assert r["avg_us"] > 0, r


def test_index_html_renders_in_headless_chromium(report, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (scripts/install_deps.sh installs it)")
    out, _, _ = report
    shot = tmp_path / "shot.png"
    p = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,4000",
            "--screenshot=%s" % shot,
            "file://%s/index.html" % out,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shot.exists(), p.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(str(shot))
    assert img.shape[0] == 4000 and img.shape[1] == 1200
    # Not a blank page: the plots' lines and text make many distinct colours.
    flat = (img[..., :3] * 255).astype(int).reshape(-1, 3)
    distinct = len({tuple(c) for c in flat[::97]})
    assert distinct > 50, distinct


@pytest.mark.parametrize("sizes", ["0", "0:64K"])
def test_report_refuses_sizes_from_0_bytes_before_measuring(tmp_path, sizes):
    # A 0-byte call has no bandwidth or floor to plot (the page's axes are log-scaled): refused
    # at once, naming the option, instead of a sweep whose page then fails to render.
    p = subprocess.run(
        ["mpirun", "-np", "2", BENCH, "report", "-o", str(tmp_path / "r"), "-m", sizes],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0
    assert "report -m %s: the sizes must start at 1 byte or more" % sizes in p.stderr, p.stderr
    assert not (tmp_path / "r" / "results.json").exists()


@pytest.mark.parametrize("sizes", [":4", "4:", ":", "4:x"])
def test_a_size_range_missing_a_bound_is_refused(sizes):
    # MIN:MAX needs both; MAX alone (no colon) means 4:MAX.
    p = subprocess.run(
        [BENCH, "allreduce", "-m", sizes], env=job_env(), capture_output=True, text=True, timeout=60
    )
    assert p.returncode != 0
    assert "-m %s: expected MIN:MAX or MAX in bytes" % sizes in p.stderr, p.stderr


def test_report_runs_honour_iterations_and_warmup(report):
    # -i and -x hold for every run of the report (they were dropped: each run took the
    # defaults, so a report could not be shortened).
    _, doc, _ = report
    rows = [row for run in doc["runs"] for row in run["rows"]]
    assert len(rows) > 20
    assert {row["iterations"] for row in rows} == {REPORT_ITERS}
    assert {row["warmup"] for row in rows} == {REPORT_WARMUP}


def test_the_header_states_the_default_iterations():
    p = subprocess.run(
        ["mpirun", "-np", "2", BENCH, "allreduce", "-m", "4:8", "-x", "7"],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert (
        "# Iterations: 2000 up to 8K, 500 up to 64K, 50 up to 1M, 20 above; warmup 7" in p.stdout
    ), p.stdout
    rows = [line.split() for line in p.stdout.splitlines() if line[:1].isdigit()]
    assert [r[4] for r in rows] == ["2000", "2000"], p.stdout


def test_report_renders_into_any_directory_name_and_names_a_failed_renderer(report, tmp_path):
    # The renderer runs without a shell: a quote and a space in -o are only characters (a
    # quoted shell command broke on them: the report fixture writes into "it's a dir"), and a
    # renderer that cannot start or fails is named with its real status, the measurements kept.
    out, _, _ = report
    assert out.parent.name == "it's a dir"
    assert (out / "index.html").exists() and (out / "results.json").exists()
    for python, expected in (
        ("/nonexistent/python", "rendering failed (cannot start /nonexistent/python: No such file"),
        ("false", "rendering failed (exit 1)"),
    ):
        bad = tmp_path / ("bad-%s" % os.path.basename(python))
        p = run_report(bad, "-m", "4:8", "-i", "2", "-x", "0", python=python)
        assert p.returncode != 0
        assert expected in p.stderr, p.stderr[-3000:]
        with open(bad / "results.json") as f:
            assert json.load(f)["complete"] is True
