"""The engine and the launcher end to end, in jobs of their own (each with its environment and a
timeout, so a hang fails the test): stalls end, join with uneven data, the timeline survives a
SIGKILL, placement, and the transparent mode's sharded input and distributed evaluate/predict.
Runs in ONE plain process (not under mpirun), like test_transparent.py:
    python -m pytest -q -p no:cacheprovider tests/python/test_engine_jobs.py
"""

import json
import os
import re

import numpy as np
import pytest
from conftest import REPO
from mtxrun_jobs import SCRIPTS, Job, jobs_together, mtxrun

TIMEOUT = 240


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("engine_jobs")


def run(args, tmp, env=None, timeout=TIMEOUT):
    job = Job(mtxrun() + args, cwd=str(tmp), timeout=timeout, extra_env=env or {})
    assert not job.timed_out, "the job hung\n" + job.describe()
    return job


# ---- stalls end ------------------------------------------------------------------------------


INFO = os.path.join(REPO, "build", "mtxcomm_info")


@pytest.mark.parametrize("np_", [2, 3])
def test_a_tensor_some_ranks_never_submit_fails_after_the_stall_timeout(tmp, np_):
    records = tmp / ("flight_np%d" % np_)
    job = run(
        ["-np", str(np_), "python", os.path.join(SCRIPTS, "stall.py")],
        tmp,
        env={
            "MTXCOMM_STALL_TIMEOUT": "3",
            "MTXCOMM_STALL_WARNING": "0",
            "MTXCOMM_FLIGHT_RECORDER_DIR": str(records),
        },
    )
    job.check_ok()
    # The stall error wrote every rank's flight record, the missing rank's too, and
    # mtxcomm_info --why-stuck names the tensor and the rank that never submitted it.
    for r in range(np_):
        assert (records / ("world.rank%d.json" % r)).exists(), sorted(os.listdir(records))
    import subprocess

    why = subprocess.run(
        [INFO, "--why-stuck", str(records)], capture_output=True, text=True, timeout=60
    )
    assert why.returncode == 0, why.stderr
    ranks = "0,1" if np_ == 2 else "0-2"
    assert "records from ranks %s." % ranks in why.stdout, why.stdout
    assert "lonely was submitted" in why.stdout and "not by rank %d" % (np_ - 1) in why.stdout, (
        why.stdout
    )
    errors = re.findall(r"STALL_ERROR (\d+) after ([0-9.]+) s: (.*)", job.stdout)
    assert sorted(int(e[0]) for e in errors) == list(range(np_ - 1)), job.describe()
    for _, seconds, message in errors:
        assert "lonely" in message, message
        assert "not by rank %d" % (np_ - 1) in message, message
        assert 2.5 <= float(seconds) <= 20, f"failed after {seconds} s, the timeout is 3 s"
    assert "STALL_NO_ERROR" not in job.stdout
    after = re.findall(r"AFTER (\d+) (\d+)", job.stdout)
    assert sorted(after) == [(str(r), str(np_)) for r in range(np_)], job.describe()


def test_a_rank_ended_by_an_uncaught_stall_error_ends_the_job(tmp):
    # The stall error raised on rank 0 and ended its program, but its exit waited in MPI_Finalize
    # for rank 1, busy outside mtxcomm for as long as it liked: mpirun never saw rank 0 exit and
    # the job ran on. An exception that ends a program now skips the MPI_Finalize of an MPI that
    # mtxcomm started (sys.excepthook -> mtxcomm_exiting_on_error), and mpirun ends the job.
    import time

    start = time.monotonic()
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "stall_uncaught.py")],
        tmp,
        env={"MTXCOMM_STALL_TIMEOUT": "3", "MTXCOMM_STALL_WARNING": "0"},
        timeout=120,
    )
    took = time.monotonic() - start
    assert job.returncode != 0, job.describe()
    assert "SUBMITTED 0" in job.stdout and "RETURNED 0" not in job.stdout, job.describe()
    assert "DeadlineExceededError" in job.stderr and "lonely" in job.stderr, job.describe()
    assert "exits without MPI_Finalize" in job.stderr, job.describe()
    assert took < 60, f"the job took {took:.0f} s to end after a 3 s stall timeout"


def test_a_reported_exception_leaves_the_exit_alone_and_a_failing_exit_ends_the_job(tmp):
    # An exception caught and shown through sys.excepthook did not end the program, so the
    # exit finalizes MPI as usual (status 0, no warning); a script that catches a stall error
    # and calls sys.exit(3) after mtxcomm.exiting_on_error(), or whose own excepthook replaced
    # whatever came before, ends the job without waiting for the busy rank.
    import time

    script = os.path.join(SCRIPTS, "exit_paths.py")
    job = run(["-np", "2", "python", script, "reported"], tmp, timeout=120)
    job.check_ok()
    assert sorted(re.findall(r"END (\d) \[2.0, 2.0\]", job.stdout)) == ["0", "1"], job.describe()
    assert "MPI_Finalize" not in job.stderr, job.describe()
    for mode in ("exit3", "late_hook"):
        start = time.monotonic()
        job = run(
            ["-np", "2", "python", script, mode],
            tmp,
            timeout=120,
            env={"MTXCOMM_STALL_TIMEOUT": "3", "MTXCOMM_STALL_WARNING": "0"},
        )
        took = time.monotonic() - start
        assert job.returncode != 0 and "exits without MPI_Finalize" in job.stderr, job.describe()
        assert took < 60, f"{mode}: the job took {took:.0f} s to end after a 3 s stall timeout"
        assert mode != "exit3" or "CAUGHT 0 TimeoutError" in job.stdout, job.describe()


def test_transparent_ranks_whose_inputs_differ_in_length_fail_saying_so(tmp):
    # A generator that depends on the process: the transparent mode's own collectives stall;
    # the error says what usually causes it, and the job ends (the first rank to fail exits).
    job = run(
        ["-np", "2", "--transparent", "python", os.path.join(SCRIPTS, "uneven_input.py")],
        tmp,
        env={"MTXCOMM_STALL_TIMEOUT": "3", "MTXCOMM_STALL_WARNING": "0"},
        timeout=120,
    )
    assert job.returncode != 0 and "FIT_RETURNED" not in job.stdout, job.describe()
    assert "DeadlineExceededError" in job.stderr, job.describe()
    assert "did the ranks' inputs give different numbers of batches" in job.stderr, job.describe()


def test_init_after_a_peer_exited_fails_within_the_timeout(tmp):
    # Under mpirun a rank that initialises again after its peer exited (or a peer that never
    # calls init) waited in MPI's communicator setup forever; MTXCOMM_TIMEOUT now bounds it.
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "reinit_after_peer_exit.py")],
        tmp,
        env={"MTXCOMM_TIMEOUT": "3"},
        timeout=120,
    )
    failed = re.findall(r"REINIT_FAILED ([0-9.]+) (.*)", job.stdout)
    assert len(failed) == 1 and "REINIT_RETURNED" not in job.stdout, job.describe()
    seconds, message = float(failed[0][0]), failed[0][1]
    assert 2.5 <= seconds <= 15, f"init failed after {seconds} s, MTXCOMM_TIMEOUT is 3 s"
    assert "timed out after 3 s" in message and "MPI_Comm_idup" in message, message


def test_the_stall_warning_comes_on_time_on_every_rank(tmp):
    # MTXCOMM_STALL_WARNING=1 < MTXCOMM_STALL_TIMEOUT=3: an idle engine wakes for the warning
    # (it used to warn only when a cycle happened to run, so 'lonely', cancelled at 3 s, was
    # never warned about). Every rank warns from its own table, naming the tensor and the ranks.
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "stall.py")],
        tmp,
        env={"MTXCOMM_STALL_TIMEOUT": "3", "MTXCOMM_STALL_WARNING": "1"},
    )
    job.check_ok()
    warned = re.findall(
        r"rank (\d+)\] WARN allreduce 'lonely' submitted by rank 0 has waited 1 s "
        r"for rank 1",
        job.stderr,
    )
    assert sorted(warned) == ["0", "1"], job.describe()
    assert re.search(r"STALL_ERROR 0 after ([0-9.]+) s", job.stdout), job.describe()


# ---- join ------------------------------------------------------------------------------------


def test_join_with_10_10_11_batches_at_np3(tmp):
    job = run(["-np", "3", "python", os.path.join(SCRIPTS, "join.py")], tmp)
    job.check_ok()
    reports = {
        r["rank"]: r
        for r in (json.loads(line) for line in re.findall(r"^JOIN (.*)$", job.stdout, re.M))
    }
    assert sorted(reports) == [0, 1, 2], job.describe()
    for r in (0, 1):
        assert reports[r]["results"] == [6.0] * 10, reports[r]
    # The 11th allreduce of rank 2 ran with ranks 0 and 1 joined: their zeros and its 3.
    assert reports[2]["results"] == [6.0] * 10 + [3.0], reports[2]
    assert reports[2]["broadcast_from_active"] == [7.0, 8.0]
    assert "has joined" in reports[2]["broadcast_from_joined"], reports[2]
    assert "FailedPrecondition" in reports[2]["broadcast_from_joined"], reports[2]
    for r in range(3):
        assert reports[r]["last_joined"] == 2, reports[r]
        assert reports[r]["after"] == 3.0, reports[r]


# ---- timeline ----------------------------------------------------------------------------------


def test_timeline_is_valid_json_after_a_sigkill(tmp):
    path = tmp / "trace.json"
    job = run(
        ["-np", "2", "--timeline", str(path), "python", os.path.join(SCRIPTS, "timeline_kill.py")],
        tmp,
        env={"MTXCOMM_TIMEOUT": "10"},
    )
    assert "TIMELINE_NO_ERROR" not in job.stdout, job.describe()
    for r in (0, 1):
        f = tmp / ("trace.json.%d" % r)
        assert f.exists(), f"rank {r} wrote no timeline\n{job.describe()}"
        events = json.loads(f.read_text())  # valid JSON, also for the killed rank
        names = {e.get("name") for e in events}
        for expected in ("NEGOTIATE", "QUEUE", "ALLREDUCE", "CYCLE"):
            assert expected in names, f"rank {r}: no {expected} event in {sorted(names)}"
        ar = [e for e in events if e.get("name") == "ALLREDUCE"]
        assert all("algorithm" in e["args"] and e["args"]["bytes"] > 0 for e in ar), ar[:3]


# ---- cycles ------------------------------------------------------------------------------------


@pytest.mark.parametrize("np_", [2, 3])
def test_ranks_arriving_apart_agree_in_one_cycle_per_collective(tmp, np_):
    # Every rank but 0 arrives 300 us late at each of 40 allreduces. A peer woken by rank 0's
    # request with nothing of its own waits (up to MTXCOMM_CYCLE_TIME, 1 ms) for its own, so
    # each allreduce takes one cycle; joining at once took two (an empty one, then the late
    # rank's): 76 cycles for 40 calls at np=2.
    calls = 40
    path = tmp / ("skew%d.json" % np_)
    job = run(
        ["-np", str(np_), "python", os.path.join(SCRIPTS, "skewed_arrivals.py")],
        tmp,
        env={"MTXCOMM_TIMELINE": str(path), "CALLS": str(calls), "SKEW_US": "300"},
    )
    job.check_ok()
    # sum over k of sum over r of (r + k)
    expected = sum(n * k + n * (n - 1) // 2 for n in [np_] for k in range(calls))
    sums = dict(re.findall(r"^SKEWED (\d+) (\d+)$", job.stdout, re.M))
    assert sums == {str(r): str(expected) for r in range(np_)}, job.describe()
    for r in range(np_):
        events = json.loads((tmp / ("skew%d.json.%d" % (np_, r))).read_text())
        cycles = sum(1 for e in events if e.get("name") == "CYCLE")
        assert calls <= cycles <= calls * 5 // 4 + 4, (
            f"rank {r}: {cycles} cycles for {calls} allreduces"
        )


def test_a_long_cycle_time_delays_neither_a_stall_error_nor_a_shutdown(tmp):
    # An idle rank waits for a request of its own before it joins a peer's cycle, but never
    # longer than 1 ms, whatever MTXCOMM_CYCLE_TIME says: the peer's cycle may carry a stall
    # verdict or a shutdown. Waiting the whole MTXCOMM_CYCLE_TIME=1 made the stall error come at
    # 4.5 s instead of 3 and rank 0's shutdown() take 1 s.
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "stall.py")],
        tmp,
        env={"MTXCOMM_STALL_TIMEOUT": "3", "MTXCOMM_STALL_WARNING": "0", "MTXCOMM_CYCLE_TIME": "1"},
    )
    job.check_ok()
    errors = re.findall(r"STALL_ERROR 0 after ([0-9.]+) s", job.stdout)
    assert len(errors) == 1, job.describe()
    assert 2.5 <= float(errors[0]) < 4.0, f"failed after {errors[0]} s, the timeout is 3 s"
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "shutdown_idle.py")],
        tmp,
        env={"MTXCOMM_CYCLE_TIME": "1"},
    )
    job.check_ok()
    took = re.findall(r"^SHUTDOWN 0 ([0-9.]+)$", job.stdout, re.M)
    assert len(took) == 1, job.describe()
    assert float(took[0]) < 0.5, f"rank 0's shutdown() took {took[0]} s"


# ---- placement ---------------------------------------------------------------------------------


def placements(job):
    return {
        p["rank"]: p
        for p in (json.loads(x) for x in re.findall(r"^PLACEMENT (.*)$", job.stdout, re.M))
    }


def test_mtxrun_gives_each_rank_its_share_of_cores(tmp):
    job = run(["-np", "2", "python", os.path.join(SCRIPTS, "placement_probe.py")], tmp)
    job.check_ok()
    p = placements(job)
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // 2)
    assert sorted(p) == [0, 1], job.describe()
    assert not set(p[0]["cpus"]) & set(p[1]["cpus"]), f"the ranks share CPUs: {p}"
    for r in (0, 1):
        assert len(p[r]["cpus"]) >= share, p[r]
        assert p[r]["share"] == share
        assert p[r]["intra"] == share and p[r]["inter"] == share, p[r]
        assert p[r]["env"]["OMP_NUM_THREADS"] == str(share)


def test_a_thread_count_the_user_set_wins(tmp):
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "placement_probe.py")],
        tmp,
        env={"TF_NUM_INTRAOP_THREADS": "3"},
    )
    job.check_ok()
    for p in placements(job).values():
        assert p["intra"] == 3, p
        assert p["env"]["TF_NUM_INTRAOP_THREADS"] == "3", p


def test_placement_off_leaves_mtxrun_ranks_unbound(tmp):
    cores = sorted(os.sched_getaffinity(0))
    job = run(
        ["-np", "2", "python", os.path.join(SCRIPTS, "placement_probe.py")],
        tmp,
        env={"MTXCOMM_PLACEMENT": "off"},
    )
    job.check_ok()
    p = placements(job)
    assert sorted(p) == [0, 1], job.describe()
    for r in (0, 1):
        assert p[r]["cpus"] == cores, f"rank {r} was bound with MTXCOMM_PLACEMENT=off: {p[r]}"
        assert p[r]["intra"] == p[r]["share"], p[r]
    bad = Job(
        mtxrun() + ["-np", "2", "--dry-run", "python", "x.py"],
        cwd=str(tmp),
        extra_env={"MTXCOMM_PLACEMENT": "none"},
        timeout=TIMEOUT,
    )
    assert (
        bad.returncode != 0 and "MTXCOMM_PLACEMENT must be auto or off, got 'none'" in bad.stderr
    ), bad.describe()


def test_plain_mpirun_without_binding_is_placed_at_init(tmp):
    job = Job(
        [
            "mpirun",
            "-np",
            "2",
            "--bind-to",
            "none",
            "python",
            os.path.join(SCRIPTS, "placement_probe.py"),
        ],
        cwd=str(tmp),
        timeout=TIMEOUT,
    )
    job.check_ok()
    p = placements(job)
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(p[0]["cpus"]) & set(p[1]["cpus"]), f"init left the ranks on shared CPUs: {p}"
    for r in (0, 1):
        assert p[r]["intra"] == p[r]["share"], p[r]


def test_more_ranks_than_cores_share_them_with_one_warning(tmp):
    cores = len(os.sched_getaffinity(0))
    job = run(["-np", str(cores + 2), "python", os.path.join(SCRIPTS, "placement_probe.py")], tmp)
    job.check_ok()
    assert job.stderr.count("ranks share the cores") == 1, job.describe()
    for p in placements(job).values():
        assert p["share"] == 1 and p["intra"] == 1, p


# ---- transparent: sharded input, distributed evaluate and predict ------------------------------


@pytest.mark.parametrize("kind", ["numpy", "dataset"])
def test_transparent_np2_follows_np1_and_evaluates_and_predicts_alike(tmp, kind):
    script = os.path.join(SCRIPTS, "train_eval.py")
    # The 1-process run beside the np=2 job (it uses the core the job leaves idle).
    one, two = jobs_together(
        dict(
            argv=["python", script, kind, "one.%s.{rank}.json" % kind],
            cwd=str(tmp),
            timeout=TIMEOUT,
        ),
        dict(
            argv=mtxrun()
            + ["-np", "2", "--transparent", "python", script, kind, "two.%s.{rank}.json" % kind],
            cwd=str(tmp),
            timeout=TIMEOUT,
        ),
    )
    one.check_ok()
    assert not two.timed_out, "the job hung\n" + two.describe()
    two.check_ok()
    a = json.loads((tmp / ("one.%s.0.json" % kind)).read_text())
    for r in (0, 1):
        b = json.loads((tmp / ("two.%s.%d.json" % (kind, r))).read_text())
        for wa, wb in zip(a["weights"], b["weights"]):
            np.testing.assert_allclose(
                np.array(wb), np.array(wa), atol=1e-4, err_msg=f"rank {r}: weights after 2 epochs"
            )
        for key in ("loss", "accuracy"):
            np.testing.assert_allclose(
                b["evaluate"][key],
                a["evaluate"][key],
                rtol=1e-4,
                atol=1e-5,
                err_msg=f"rank {r}: evaluate {key}",
            )
        # predict keeps the input order: row i of np=2 is row i of np=1
        np.testing.assert_allclose(
            np.array(b["predict"]),
            np.array(a["predict"]),
            atol=1e-4,
            err_msg=f"rank {r}: predictions",
        )


def test_mtxrun_refuses_a_program_given_as_the_timeline_path(tmp):
    # "mtxrun --timeline sh job.sh": the PATH was forgotten, and argparse took the program for it.
    bad = Job(
        mtxrun() + ["-np", "2", "--dry-run", "--timeline", "sh", "job.sh"],
        cwd=str(tmp),
        timeout=TIMEOUT,
    )
    assert (
        bad.returncode != 0 and "--timeline takes a PATH for the trace, got 'sh'" in bad.stderr
    ), bad.describe()
    ok = Job(
        mtxrun() + ["-np", "2", "--dry-run", "--timeline", "trace.json", "sh", "job.sh"],
        cwd=str(tmp),
        timeout=TIMEOUT,
    )
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("sh job.sh"), ok.describe()
