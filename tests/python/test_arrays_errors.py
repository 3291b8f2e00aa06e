"""The array API: the GIL released while a call waits, buffer protocol inputs, errors (wrong
dtypes and objects, device arrays, ranks that disagree, errors at shutdown, timeouts and remote
errors in a job of their own). Run like test_arrays.py, in the same session."""

import array
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from arrays_common import (
    RANK,
    SIZE,
    ml_dtypes,
    multi_rank,
)

# ---- the GIL ---------------------------------------------------------------------------------


@multi_rank
def test_the_gil_is_released_while_a_call_waits(mc):
    import threading
    import time

    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.005)

    if RANK == 1:
        time.sleep(0.5)  # rank 0 waits in the allreduce meanwhile
    t = threading.Thread(target=tick)
    start = len(ticks)
    t.start()
    got = mc.allreduce(np.ones(2, np.float32))
    stop.set()
    t.join()
    assert got.tolist() == [float(SIZE)] * 2
    if RANK == 0:
        assert len(ticks) - start >= 10, "another thread could not run while rank 0 waited"


# ---- buffer protocol -------------------------------------------------------------------------


def test_buffer_protocol_inputs_give_numpy_results(mc):
    raw = bytes([RANK, 1, 2, 3])
    got = mc.allreduce(raw, op="max")
    floats = mc.allreduce(array.array("f", [1.0, float(RANK)]))
    out = bytearray(4)
    got_out = mc.broadcast(memoryview(bytes([9, RANK, 7, 6])), root=0, out=out)
    assert isinstance(got, np.ndarray) and got.dtype == np.uint8
    assert got.tolist() == [SIZE - 1, 1, 2, 3]
    assert floats.dtype == np.float32
    assert floats.tolist() == [float(SIZE), float(sum(range(SIZE)))]
    assert got_out is out and list(out) == [9, 0, 7, 6]


# ---- errors ----------------------------------------------------------------------------------


def test_unsupported_dtypes_and_objects_are_type_errors(mc):
    with pytest.raises(TypeError, match="dtype complex64"):
        mc.allreduce(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="dtype >f4 \\(non-native byte order\\)"):
        mc.allreduce(np.zeros(3, ">f4"))
    with pytest.raises(TypeError, match="dtype <U1"):
        mc.allreduce(np.array(["a"]))
    with pytest.raises(TypeError, match="must be an array.*got list"):
        mc.allreduce([1.0, 2.0])
    if ml_dtypes is not None:
        with pytest.raises(TypeError, match="float8_e4m3fn"):
            mc.allreduce(np.zeros(3, ml_dtypes.float8_e4m3fn))


class _FakeDeviceArray:
    """A DLPack producer on a CUDA device (what CuPy reports)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("must not be read")

    def __dlpack_device__(self):
        return (2, 0)


def test_a_device_array_is_refused(mc):
    with pytest.raises(ValueError, match="CUDA .*host \\(CPU\\) memory only"):
        mc.allreduce(_FakeDeviceArray())


@multi_rank
def test_ranks_that_disagree_get_an_error_naming_both_and_the_next_call_works(mc):
    with pytest.raises(mc.InvalidUsageError, match="disagree on the shapes") as shapes:
        mc.allreduce(np.zeros(RANK + 1, np.float32))
    with pytest.raises(mc.InvalidUsageError, match="disagree on the collective") as kinds:
        if RANK == 0:
            mc.allreduce(np.zeros(2, np.float32))
        else:
            mc.broadcast(np.zeros(2, np.float32), root=0)
    with pytest.raises(RuntimeError, match="disagree on the dtypes"):
        mc.allreduce(np.zeros(2, np.float32 if RANK == 0 else np.float64))
    after = mc.allreduce(np.ones(3, np.int32))
    message = str(shapes.value)
    assert "rank 0 has allreduce(sum) of float32[1]" in message, message
    assert "rank 1 has allreduce(sum) of float32[2]" in message, message
    assert "array call #" in message, message
    assert shapes.value.code == 2 and isinstance(shapes.value, RuntimeError)
    assert "broadcast(root 0)" in str(kinds.value)
    np.testing.assert_array_equal(after, np.full(3, SIZE, np.int32))


@multi_rank
def test_a_broadcast_where_every_rank_names_itself_root_fails_on_every_rank(mc):
    # The C API's broadcast over shared memory returns before its peers enter it and finds
    # such a disagreement at the next call or at destroy; through the array API the engine
    # compares the roots before any byte moves, so the call itself fails, on every rank, and
    # no rank's array is written.
    x = np.full(5, RANK + 1, np.float32)
    with pytest.raises(mc.InvalidUsageError, match="disagree on the root") as e:
        mc.broadcast(x, root=RANK, out=x)
    for r in range(SIZE):
        assert "rank %d has broadcast(root %d)" % (r, r) in str(e.value), str(e.value)
    np.testing.assert_array_equal(x, np.full(5, RANK + 1, np.float32))
    np.testing.assert_array_equal(mc.broadcast(x, root=0), np.ones(5, np.float32))


def test_an_error_at_shutdown_is_raised_and_fails_the_exit():
    """What the engine's destroy returns (a check an earlier call left pending that finds the
    ranks disagreeing) is raised by shutdown(); at exit, where Python would print an exception
    and exit with 0, it is written to standard error and the exit status is 1."""
    if RANK != 0 or SIZE != 1:
        pytest.skip("runs once, in the np=1 session")
    import mtxcomm

    message = "rank 0 of 2: mtxcomm_comm_destroy (transport shm): the ranks disagree on the call"
    with pytest.raises(mtxcomm.InvalidUsageError, match="disagree on the call"):
        mtxcomm._shutdown_or_exit(lambda: (2, message), at_exit=False)
    mtxcomm._shutdown_or_exit(lambda: (0, ""), at_exit=False)
    code = (
        "import atexit, mtxcomm\n"
        "atexit.register(mtxcomm._shutdown_or_exit, lambda: (2, %r), at_exit=True)\n"
        "print('END OF PROGRAM')\n" % message
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX", "PRTE"))}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert "END OF PROGRAM" in out.stdout, out.stdout
    assert "mtxcomm: error at exit: " + message in out.stderr, out.stderr


def test_error_classes_map_the_codes():
    import builtins

    from mtxcomm import _arrays

    cases = {
        1: (ValueError, "InvalidArgumentError"),
        2: (RuntimeError, "InvalidUsageError"),
        3: (RuntimeError, "Error"),
        4: (RuntimeError, "RemoteError"),
        5: (builtins.TimeoutError, "TimeoutError"),
        7: (RuntimeError, "Error"),
    }
    for code, (base, name) in cases.items():
        e = _arrays._error(code, "mtxcomm x failed on rank 3: why")
        assert type(e).__name__ == name and isinstance(e, base), (code, type(e))
        assert e.code == code and str(e) == "mtxcomm x failed on rank 3: why"


def test_timeout_and_remote_errors_in_a_job_of_their_own(tmp_path):
    """A 2-rank job over the file store (not under mpirun): a call one rank never makes fails
    after MTXCOMM_STALL_TIMEOUT with mtxcomm.TimeoutError on the rank that made it, the engine
    goes on, and a rank that shuts down while another waits gives it mtxcomm.RemoteError."""
    if RANK != 0 or SIZE != 1:
        pytest.skip("runs once, in the np=1 session")
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import mtxcomm
        flag = sys.argv[1]
        mtxcomm.init()
        r = mtxcomm.rank()
        if r == 0:
            t0 = time.time()
            try:
                mtxcomm.allreduce(np.ones(3, np.float32))
                print("STALL_NO_ERROR", flush=True)
            except mtxcomm.TimeoutError as e:
                print("STALL %.1f %d %s %s: %s" % (time.time() - t0, e.code,
                      isinstance(e, TimeoutError), e.code_name, e), flush=True)
            open(flag, "w").close()
        else:
            deadline = time.time() + 120
            while not os.path.exists(flag) and time.time() < deadline:
                time.sleep(0.05)
        mtxcomm.barrier()
        print("AFTER %d %d" % (r, int(mtxcomm.allreduce(np.ones(1, np.int32))[0])), flush=True)
        if r == 0:
            # The call that waited when rank 1 shut down, then one made after: the same error,
            # naming the request either way.
            for _ in range(2):
                try:
                    mtxcomm.allreduce(np.ones(2, np.float32))
                    print("REMOTE_NO_ERROR", flush=True)
                except mtxcomm.RemoteError as e:
                    print("REMOTE %d %s: %s" % (e.code, isinstance(e, mtxcomm.Error), e),
                          flush=True)
        else:
            mtxcomm.shutdown()
        mtxcomm.shutdown()
        try:
            mtxcomm.rank()
        except mtxcomm.InvalidUsageError as e:
            print("DOWN %d %s" % (r, e), flush=True)
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX", "PRTE"))}
    env.update(
        MTXCOMM_SIZE="2",
        MTXCOMM_STORE="file:%s" % (tmp_path / "store"),
        MTXCOMM_STALL_TIMEOUT="2",
        MTXCOMM_STALL_WARNING="0",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "flag")],
            env=dict(env, MTXCOMM_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the job hung:\n" + "\n".join(outs))
    text = "\n".join(outs)
    assert [p.returncode for p in procs] == [0, 0], text
    stall = [line for line in outs[0].splitlines() if line.startswith("STALL ")]
    assert len(stall) == 1, text
    seconds, code, builtin, name = stall[0].split()[1:5]
    assert 1.5 <= float(seconds) <= 60 and code == "5" and builtin == "True", stall
    assert name == "MTXCOMM_TIMEOUT:" and "rank 1" in stall[0], stall
    assert "AFTER 0 2" in outs[0] and "AFTER 1 2" in outs[1], text
    remote = [line for line in outs[0].splitlines() if line.startswith("REMOTE ")]
    assert len(remote) == 2 and all(x.startswith("REMOTE 4 True") for x in remote), text
    assert all("allreduce '" in x and "rank 1 called shutdown()" in x for x in remote), remote
    assert "DOWN 0" in outs[0] and "DOWN 1" in outs[1] and "not initialised" in text, text


def test_an_unknown_build_feature_is_a_value_error_naming_the_known_ones():
    from mtxcomm import _core

    assert type(_core.build_feature("mpi")) is bool
    with pytest.raises(ValueError, match=r"unknown build feature 'bogus' \(known: mpi, ucx"):
        _core.build_feature("bogus")
