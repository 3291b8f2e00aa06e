"""mtxrun and its transparent mode, end to end. Runs in ONE plain process (not under mpirun):
    python -m pytest -q -p no:cacheprovider tests/python/test_transparent.py
It launches `mtxrun -np N [--transparent] python ...` jobs as subprocesses (each with a
timeout, so a hang fails the test instead of the suite) and checks their files and output.

The example (examples/keras_digits.py) imports nothing from mtxcomm; it replaces "{rank}" in
--save-weights/--checkpoint with OMPI_COMM_WORLD_RANK, so every rank of a job can write its own
weights file, and a checkpoint written by rank 1 would show up as a second file.
"""

import os
import re
import sys

import numpy as np
import pytest
from mtxrun_jobs import (
    EXAMPLE,
    JOB_TIMEOUT,
    SCRIPTS,
    Job,
    accuracy_lines,
    example,
    jobs_together,
    load_npz,
    mtxrun,
    plain_beside_transparent,
)

# ---------------------------------------------------------------------------------------------
# jobs shared by the tests (each runs once)

SHORT = ["--epochs", "2", "--seed", "1", "--verbose", "0"]


@pytest.fixture(scope="module")
def short_runs(tmp):
    """The 1-process run and the np=2 run of the example, at the same time (the 1-process run
    uses the core the other job leaves idle while it runs)."""
    return jobs_together(
        dict(
            argv=["python", EXAMPLE, *SHORT, "--save-weights", "W1.npz"],
            cwd=str(tmp),
            timeout=JOB_TIMEOUT,
        ),
        dict(
            argv=mtxrun()
            + ["-np", "2", "--transparent", "python", EXAMPLE, *SHORT]
            + ["--save-weights", "W2.{rank}.npz", "--checkpoint", "ckpt.{rank}.keras"],
            cwd=str(tmp),
            timeout=JOB_TIMEOUT,
        ),
    )


@pytest.fixture(scope="module")
def plain_run(tmp, short_runs):
    short_runs[0].check_ok()
    return load_npz(tmp / "W1.npz")


@pytest.fixture(scope="module")
def np2_run(short_runs):
    return short_runs[1]


@pytest.fixture(scope="module")
def full_np2_run(tmp):
    return example(2, tmp)  # default epochs and verbosity


# ---------------------------------------------------------------------------------------------
# the mtxrun wrapper itself


def test_mtxrun_module_entry_point_launches_every_rank(tmp):
    # one write(2) per rank, so that the two ranks' lines cannot interleave
    code = (
        "import os; "
        "os.write(1, ('launched rank %s\\n' % os.environ.get('OMPI_COMM_WORLD_RANK')).encode())"
    )
    job = Job(
        [sys.executable, "-m", "mtxcomm.run", "-np", "2", "python", "-c", code],
        cwd=str(tmp),
        timeout=120,
    )
    job.check_ok()
    assert sorted(re.findall(r"launched rank (\d)", job.stdout)) == ["0", "1"], job.describe()


def test_mtxrun_console_script_np1(tmp):
    job = Job(
        mtxrun() + ["-np", "1", "python", "-c", "print('mtxrun np1 ok')"], cwd=str(tmp), timeout=120
    )
    job.check_ok()
    assert "mtxrun np1 ok" in job.stdout, job.describe()


# ---------------------------------------------------------------------------------------------
# transparent mode: an N-rank run follows the 1-process run


def test_transparent_np2_runs(np2_run, tmp):
    np2_run.check_ok()
    for r in (0, 1):
        assert (tmp / f"W2.{r}.npz").exists(), f"rank {r} wrote no weights\n{np2_run.describe()}"


def test_transparent_np2_ranks_bitwise_equal(np2_run, tmp):
    np2_run.check_ok()
    w0, w1 = load_npz(tmp / "W2.0.npz"), load_npz(tmp / "W2.1.npz")
    assert len(w0) == len(w1) == 6
    for i, (a, b) in enumerate(zip(w0, w1)):
        assert np.array_equal(a, b), (
            f"weight {i} differs between rank 0 and rank 1 (max {np.max(np.abs(a - b))})"
        )


def test_transparent_np2_follows_1_process_within_1e_4(np2_run, plain_run, tmp):
    np2_run.check_ok()
    w2 = load_npz(tmp / "W2.0.npz")
    assert len(w2) == len(plain_run)
    diffs = [float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(w2, plain_run)]
    moved = max(float(np.max(np.abs(b))) for b in plain_run)
    assert moved > 0
    assert max(diffs) <= 1e-4, f"np=2 vs 1 process, max |diff| per weight: {diffs}"


def test_transparent_np1_matches_plain_python(plain_run, tmp):
    job = example(1, tmp, *SHORT, "--save-weights", "W1t.npz")
    job.check_ok()
    w = load_npz(tmp / "W1t.npz")
    diffs = [float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(w, plain_run)]
    assert max(diffs) <= 1e-6, f"mtxrun -np 1 --transparent vs plain python: {diffs}"


def test_transparent_np2_each_rank_computes_its_half_of_every_batch(tmp):
    # Without this, a "transparent" mode that trained the whole batches on every rank would pass
    # the weight comparisons above. The probe records the row ids of every training batch.
    probe = os.path.join(SCRIPTS, "transparent_probe.py")
    plain_beside_transparent(tmp, probe, "probe", 2)
    import json

    whole = json.loads((tmp / "probe1.0.json").read_text())["steps"]
    ranks = [json.loads((tmp / f"probe2.{r}.json").read_text())["steps"] for r in (0, 1)]
    assert len(whole) == 8 and all(len(b) == 32 for b in whole), whole
    for r in (0, 1):
        assert len(ranks[r]) == len(whole), (
            f"rank {r} ran {len(ranks[r])} steps, the 1-process run {len(whole)}"
        )
    for i, batch in enumerate(whole):
        a, b = ranks[0][i], ranks[1][i]
        assert len(a) == len(b) == 16, (
            f"step {i}: rank 0 computed on {len(a)} rows, rank 1 on {len(b)} (want 16 each)"
        )
        assert not set(a) & set(b), (
            f"step {i}: ranks 0 and 1 computed on the same rows {sorted(set(a) & set(b))}"
        )
        assert sorted(a + b) == sorted(batch), (
            f"step {i}: the ranks' rows are not the 1-process batch"
        )


def test_transparent_checkpoint_written_once(np2_run, tmp):
    np2_run.check_ok()
    written = sorted(p.name for p in tmp.glob("ckpt.*"))
    assert written == ["ckpt.0.keras"], f"checkpoint files: {written} (want only rank 0's)"


def test_transparent_checkpoint_loads_in_plain_keras(np2_run, tmp):
    np2_run.check_ok()
    import keras

    model = keras.models.load_model(str(tmp / "ckpt.0.keras"))
    got = [np.asarray(w) for w in model.get_weights()]
    want = load_npz(tmp / "W2.0.npz")
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), f"checkpoint weight {i} is not the final weight"


def test_transparent_full_run_accuracy(full_np2_run):
    full_np2_run.check_ok()
    found = accuracy_lines(full_np2_run.stdout)
    assert found, full_np2_run.describe()
    assert float(found[0]) >= 0.95, f"test accuracy {found[0]} < 0.95\n{full_np2_run.describe()}"


def test_transparent_output_on_rank0_only(full_np2_run):
    full_np2_run.check_ok()
    out = full_np2_run.stdout
    assert len(accuracy_lines(out)) == 1, (
        f"'test accuracy' lines: {accuracy_lines(out)}\n{full_np2_run.describe()}"
    )
    assert out.count("seconds per epoch:") == 1, full_np2_run.describe()
    assert len(re.findall(r"^.*Epoch 1/\d+", out, re.MULTILINE)) == 1, full_np2_run.describe()


# ---------------------------------------------------------------------------------------------
# a Horovod-style script under mtxrun (not transparent)


def test_horovod_style_script_np2(tmp):
    ckdir = tmp / "hvd_ckpt"
    ckdir.mkdir()
    script = os.path.join(SCRIPTS, "horovod_style_keras.py")
    job = Job(
        mtxrun() + ["-np", "2", "python", script, "--checkpoint-dir", str(ckdir)],
        cwd=str(tmp),
        timeout=JOB_TIMEOUT,
    )
    job.check_ok()
    acc = re.findall(r"horovod-style test accuracy: ([0-9.]+)", job.stdout)
    assert len(acc) == 1, job.describe()
    assert float(acc[0]) >= 0.9, f"accuracy {acc[0]}\n{job.describe()}"
    per_rank = re.findall(r"accuracy per rank: (.*)", job.stdout)
    assert per_rank and len(set(per_rank[0].split())) == 1, (
        f"ranks evaluated different models\n{job.describe()}"
    )
    assert sorted(p.name for p in ckdir.iterdir()), "rank 0 wrote no checkpoint"


# ---------------------------------------------------------------------------------------------
# a rank that stops early: the other fails with a clear error, no hang


def test_rank_exiting_early_fails_the_other_clearly(tmp):
    job = Job(
        mtxrun() + ["-np", "2", "python", os.path.join(SCRIPTS, "early_exit.py")],
        cwd=str(tmp),
        timeout=120,
    )
    assert not job.timed_out, "the job hung after rank 1 left\n" + job.describe()
    assert job.returncode != 0, job.describe()
    both = job.stdout + job.stderr
    assert "RANK0_NO_ERROR" not in both, (
        "rank 0's allreduce succeeded without rank 1\n" + job.describe()
    )
    err = re.findall(r"RANK0_ERROR: (.*)", both)
    assert err, "rank 0 was not given an error (killed before it could report?)\n" + job.describe()
    assert re.search(r"rank\D{0,3}1\b", err[0], re.IGNORECASE), (
        f"the error does not name rank 1: {err[0]}"
    )
