"""PyTorch jobs end to end, each in processes of its own with a timeout (a hang fails the test):
DDP over the "mtxcomm" backend against a 1-process run, under torchrun (the c10d Store
rendezvous) and under mtxrun; the Horovod-style script with only its import changed; a killed
rank and the group's timeout make the survivors raise, naming the cause.
Runs in ONE plain process (not under mpirun), like test_engine_jobs.py:
    python -m pytest -q -p no:cacheprovider tests/python/test_torch_jobs.py
"""

import os
import re
import socket
import subprocess
import sys

import pytest
from conftest import REPO
from mtxrun_jobs import SCRIPTS, VENV_BIN, Job, job_env, mtxrun

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed (scripts/setup_python.sh "
    "installs it; --no-torch leaves it out)",
)

TIMEOUT = 240
DDP = os.path.join(REPO, "examples", "torch_ddp_digits.py")
HVD = os.path.join(REPO, "examples", "torch_horovod_digits.py")
STEPS = ["--steps", "30"]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_jobs")


def torchrun():
    return [
        os.path.join(VENV_BIN, "torchrun"),
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, tmp, env=None):
    job = Job(argv, cwd=str(tmp), timeout=TIMEOUT, extra_env=env or {})
    assert not job.timed_out, "the job hung\n" + job.describe()
    return job


def load(path):
    return torch.load(path)


@pytest.fixture(scope="module")
def reference(tmp):
    """The 1-process run on whole batches."""
    job = run(["python", DDP, *STEPS, "--save-weights", "ref.pt"], tmp)
    job.check_ok()
    return load(tmp / "ref.pt")


def check_ddp(job, tmp, prefix, reference):
    job.check_ok()
    assert "ranks 2 backend mtxcomm" in job.stdout, job.describe()
    w0, w1 = load(tmp / (prefix + ".0.pt")), load(tmp / (prefix + ".1.pt"))
    for a, b, ref in zip(w0, w1, reference):
        assert torch.equal(a, b), "the ranks' weights differ"
        # DDP divides each rank's gradient by 2 before summing: (g0 + g1) / 2 is the whole
        # batch's mean gradient up to rounding.
        torch.testing.assert_close(a, ref, rtol=0, atol=1e-6)


def test_ddp_under_torchrun_matches_one_process(tmp, reference):
    env = {k: "" for k in ("MTXCOMM_STORE", "MTXCOMM_RANK", "MTXCOMM_SIZE")}
    job = run(torchrun() + [DDP, *STEPS, "--save-weights", "tr.{rank}.pt"], tmp, env)
    check_ddp(job, tmp, "tr", reference)


def test_ddp_under_mtxrun_matches_one_process(tmp, reference):
    job = run(mtxrun() + ["-np", "2", "python", DDP, *STEPS, "--save-weights", "mr.{rank}.pt"], tmp)
    check_ddp(job, tmp, "mr", reference)


def test_ddp_under_mtxrun_over_tcp_with_torchcomms_asked_for_matches_one_process(tmp, reference):
    # MTXCOMM_TRANSPORT=tcp under mtxrun: the ranks meet at the TCP store mtxrun names, with
    # mpirun's ranks; shared memory off, so every byte goes over the TCP mesh. In the same job,
    # TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 where torchcomms is not installed (PyPI has only a
    # placeholder): torch keeps its ProcessGroup backends, and "mtxcomm" serves.
    env = {"MTXCOMM_TRANSPORT": "tcp", "MTXCOMM_SHM": "off", "MTXCOMM_LOG_LEVEL": "INFO"}
    env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
    for k in ("MTXCOMM_STORE", "MTXCOMM_RANK", "MTXCOMM_SIZE"):
        env[k] = ""
    argv = ["-np", "2", "python", DDP, *STEPS, "--save-weights", "mt.{rank}.pt"]
    job = run(mtxrun() + argv, tmp, env)
    check_ddp(job, tmp, "mt", reference)
    routes = [line for line in job.stderr.splitlines() if "INFO routes:" in line]
    for r in (0, 1):
        assert any("rank %d]" % r in line for line in routes), job.describe()
    assert all("point-to-point over tcp" in line for line in routes), job.describe()


def test_ddp_on_a_2d_device_mesh_at_np4(tmp):
    job = run(mtxrun() + ["-np", "4", "python", os.path.join(SCRIPTS, "torch_mesh.py")], tmp)
    job.check_ok()
    for r, (dp, tp) in enumerate(
        [([0, 2], [0, 1]), ([1, 3], [0, 1]), ([0, 2], [2, 3]), ([1, 3], [2, 3])]
    ):
        assert "mesh ok rank %d dp %s tp %s" % (r, dp, tp) in job.stdout, job.describe()


def test_horovod_style_script_with_one_import_changed(tmp):
    launcher = "mtxrun"
    with open(HVD) as f:
        source = f.read()
    assert "import mtxcomm.torch as hvd  # was: import horovod.torch as hvd" in source
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    body = code.split('"""', 2)[2]  # after the docstring
    assert body.count("mtxcomm") == 1, "the script names mtxcomm beyond its one import"
    args = [HVD, "--epochs", "8", "--save-weights", launcher + ".{rank}.pt"]
    job = run(mtxrun() + ["-np", "2", "python"] + args, tmp)
    job.check_ok()
    m = re.search(r"ranks 2: 8 epochs, loss [0-9.]+, test accuracy ([0-9.]+)", job.stdout)
    assert m, job.describe()
    assert float(m.group(1)) > 0.85, job.describe()
    w0, w1 = load(tmp / (launcher + ".0.pt")), load(tmp / (launcher + ".1.pt"))
    assert all(torch.equal(a, b) for a, b in zip(w0, w1)), "the ranks' weights differ"


def ranks(mode, tmp, size=2, env=None):
    """Starts `size` ranks of torch_fault.py with env:// variables; returns (code, out) each."""
    base = job_env()
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(size),
        MTXCOMM_TIMEOUT="20",
    )
    base.update(env or {})
    procs = []
    for r in range(size):
        e = dict(base, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(SCRIPTS, "torch_fault.py"), mode],
                cwd=str(tmp),
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung (mode %s)" % mode)
        out.append((p.returncode, text))
    return out


def survivors_of_a_killed_rank_1(out):
    """Rank 1 of 3 was SIGKILLed; ranks 0 and 2 each raised (exit 3) an error naming it.
    Returns their "RAISED seconds type: message" matches."""
    assert out[1][0] == -9, out[1]
    matches = []
    for r in (0, 2):
        code, text = out[r]
        m = re.search(r"RAISED ([0-9.]+) (\w+): (.*)", text)
        assert m and code == 3, "rank %d: exit %s\n%s" % (r, code, text[-3000:])
        assert "rank 1" in m.group(3), m.group(3)[:500]
        matches.append(m)
    return matches


def cpp_backend(text):
    """Whether the rank's default group ran the C++ backend (torch_fault.py prints BACKEND)."""
    m = re.search(r"BACKEND (\w+)", text)
    assert m, text[-2000:]
    return m.group(1) == "MtxcommBackend"


def test_a_killed_rank_makes_the_survivors_raise_naming_it(tmp):
    out = ranks("kill", tmp, size=3)
    for m in survivors_of_a_killed_rank_1(out):
        assert float(m.group(1)) < 60, m.group(0)
        # PyTorch's class for a failed collective from the C++ backend, as its own backends
        # raise; mtxcomm's from the Python backend.
        wanted = "DistBackendError" if cpp_backend(out[0][1]) else "RemoteError"
        assert m.group(2) == wanted, m.group(0)


def test_a_killed_rank_in_a_p2p_exchange_makes_the_others_raise_naming_it(tmp):
    for m in survivors_of_a_killed_rank_1(ranks("p2p_kill", tmp, size=3)):
        assert float(m.group(1)) < 60, m.group(0)


def test_a_killed_rank_fails_a_receive_from_any_source_naming_it(tmp):
    # Rank 2 lives on, silent: the receive could still be answered by it, yet a peer that died
    # fails it (as Gloo's), where before it waited forever.
    out = ranks("anysource_kill", tmp, size=3)
    assert out[1][0] == -9, out[1]
    code, text = out[0]
    m = re.search(r"RAISED ([0-9.]+) (\w+): (.*)", text)
    assert m and code == 3, text[-3000:]
    assert "peer rank 1" in m.group(3) and "any source" in m.group(3), m.group(0)
    assert float(m.group(1)) < 10, m.group(0)  # MTXCOMM_TIMEOUT is 20 s here


def test_a_killed_rank_makes_ddp_raise_on_the_survivors(tmp):
    survivors_of_a_killed_rank_1(ranks("ddp_kill", tmp, size=3))


# The engine's semantics (a window of names in flight, the engine's TimeoutError and refusal
# after it): the Python backend's. The C++ backend has no engine; its timeout is the library's
# (the group's timeout, or MTXCOMM_TIMEOUT where shorter), a DistBackendError naming the peer
# waited for.
_ENGINE = {"MTXCOMM_TORCH_BACKEND": "python"}


def test_more_calls_in_flight_than_names_time_out_instead_of_blocking(tmp):
    out = ranks("window", tmp, env=_ENGINE)
    code, text = out[0]
    m = re.search(r"RAISED ([0-9.]+) (\w+): (.*)", text)
    assert m and code == 3, text
    assert m.group(2) == "TimeoutError", m.group(0)
    assert float(m.group(1)) < 12, m.group(0)


def test_the_group_timeout_is_honoured(tmp):
    out = ranks("timeout", tmp, env=_ENGINE)
    code, text = out[0]
    m = re.search(r"RAISED ([0-9.]+) (\w+): (.*)", text)
    assert m and code == 3, text
    assert m.group(2) == "TimeoutError" and "timeout of 3 s" in m.group(3), m.group(0)
    assert 2.5 <= float(m.group(1)) < 30, m.group(0)
    # Afterwards the group refuses calls (a late pairing would mix up requests).
    assert re.search(
        r"AFTER_TIMEOUT refused: .*no more collectives after an earlier one timed "
        r"out",
        text,
    ), text


def test_mtxcomm_timeout_shorter_than_the_group_timeout_ends_the_wait(tmp):
    # The group's timeout is 60 s; MTXCOMM_TIMEOUT=3 is shorter, so rank 1's missing call
    # fails rank 0's after 3 s, before rank 1 exits (at 8 s), on either backend.
    code, text = ranks("env_timeout", tmp, env={"MTXCOMM_TIMEOUT": "3"})[0]
    m = re.search(r"RAISED ([0-9.]+) (\w+): (.*)", text)
    assert m and code == 3, text[-3000:]
    assert 2.5 <= float(m.group(1)) < 7.5, m.group(0)
    if cpp_backend(text):
        assert m.group(2) == "DistBackendError", m.group(0)
        assert "timed out after 3 s" in m.group(3) and "peer rank 1" in m.group(3), m.group(0)
    else:
        assert m.group(2) == "TimeoutError" and "timeout of 3 s" in m.group(3), m.group(0)


def test_destroying_the_group_with_a_dropped_call_in_flight_keeps_memory_intact(tmp):
    # The backend keeps the call's tensors until the engine is done with them, beyond the
    # group's life (they were freed with the group: heap corruption).
    for r, (code, text) in enumerate(ranks("destroy", tmp)):
        assert code == 0 and "JUNK %d intact" % r in text, "rank %d: exit %s\n%s" % (
            r,
            code,
            text[-3000:],
        )


def test_the_job_secret_is_not_left_in_the_environment(tmp):
    out = ranks("secret", tmp)
    for r, (code, text) in enumerate(out):
        assert code == 0, text
        assert "SECRET_IN_ENV %d False" % r in text, text


def test_a_process_set_never_removed_is_freed_at_exit(tmp):
    for r, (code, text) in enumerate(ranks("process_set_exit", tmp)):
        assert code == 0 and "SET_SUM %d [1.0, 1.0]" % r in text, "rank %d: exit %s\n%s" % (
            r,
            code,
            text[-3000:],
        )
        assert "terminate called" not in text, text[-3000:]


def test_a_subgroup_never_destroyed_exits_cleanly(tmp):
    for r, (code, text) in enumerate(ranks("subgroup_exit", tmp, size=3)):
        assert code == 0, "rank %d: exit %s\n%s" % (r, code, text[-3000:])
        assert "terminate called" not in text, text[-3000:]
        if r < 2:
            assert "SUB_SUM %d [2.0, 2.0]" % r in text, text[-3000:]
