"""mtxrun jobs launched from the tests (test_transparent*.py, test_engine_jobs.py,
test_torch_jobs.py, test_bench_report.py), each as a subprocess with a timeout."""

import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import REPO

VENV_BIN = os.path.dirname(sys.executable)
EXAMPLE = os.path.join(REPO, "examples", "keras_digits.py")
SCRIPTS = os.path.join(REPO, "tests", "python", "scripts")
JOB_TIMEOUT = 300  # seconds, for the longest job (the full example at np=2)


def job_env():
    """This environment without the variables of an enclosing mpirun job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PATH=VENV_BIN + os.pathsep + env.get("PATH", ""),  # "python" is this environment's
    )
    return env


def mtxrun():
    path = os.path.join(VENV_BIN, "mtxrun")
    if not os.path.exists(path):
        pytest.fail(
            f"the mtxrun console script is not installed ({path} is missing)", pytrace=False
        )
    return [path]


class Job:
    def __init__(self, argv, cwd, timeout, extra_env=None):
        self.argv = argv
        self.timed_out = False
        env = job_env()
        env.update(extra_env or {})
        try:
            p = subprocess.run(
                argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
            )
            self.returncode, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            self.timed_out = True
            self.returncode = None
            self.stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            self.stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")

    def describe(self):
        tail = lambda s: "\n".join(s.splitlines()[-40:])  # noqa: E731
        return (
            f"command: {' '.join(self.argv)}\nreturn code: {self.returncode}"
            f"{' (TIMED OUT)' if self.timed_out else ''}\n"
            f"--- stdout (tail) ---\n{tail(self.stdout)}"
            f"\n--- stderr (tail) ---\n{tail(self.stderr)}"
        )

    def check_ok(self):
        assert not self.timed_out and self.returncode == 0, self.describe()


def jobs_together(*specs):
    """Runs the Jobs of SPECS (each a dict of Job's arguments) at the same time, each in a thread
    of its own, and returns them in order once all have ended. A 1-process reference run leaves
    a core idle on a 2-core machine: run beside the N-rank job it compares with, it uses it. The
    jobs must not write the same files (give them distinct names or working folders)."""
    out = [None] * len(specs)

    def run(i):
        try:
            out[i] = Job(**specs[i])
        except BaseException as e:  # raised again below, on the test's thread
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for job in out:
        if isinstance(job, BaseException):
            raise job
    return out


def plain_beside_transparent(tmp, script, stem, np_, *args, extra_env=None):
    """SCRIPT's 1-process run (output STEM1.{rank}.json) beside `mtxrun -np NP_ --transparent`
    of it (STEMNP_.{rank}.json), ARGS after the output name, EXTRA_ENV for the mtxrun job; both
    checked to have exited 0. Returns (the 1-process Job, the mtxrun Job)."""
    out = f"{stem}%d.{{rank}}.json"
    one, job = jobs_together(
        dict(argv=["python", script, out % 1, *args], cwd=str(tmp), timeout=JOB_TIMEOUT),
        dict(
            argv=mtxrun() + ["-np", str(np_), "--transparent", "python", script, out % np_, *args],
            cwd=str(tmp),
            timeout=JOB_TIMEOUT,
            extra_env=extra_env,
        ),
    )
    one.check_ok()
    job.check_ok()
    return one, job


def example(np_, tmp, *args, transparent=True, timeout=JOB_TIMEOUT):
    """Runs the example: plain `python` when np_ is None, else under mtxrun."""
    cmd = ["python", EXAMPLE, *args]
    if np_ is not None:
        cmd = mtxrun() + ["-np", str(np_)] + (["--transparent"] if transparent else []) + cmd
    return Job(cmd, cwd=str(tmp), timeout=timeout)


def load_npz(path):
    with np.load(path) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def accuracy_lines(text):
    return re.findall(r"^.*test accuracy: ([0-9.]+)\s*$", text, re.MULTILINE)
