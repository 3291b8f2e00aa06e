"""The C++ "mtxcomm" backend of torch.distributed (bindings/torch: mtxcomm.torch._c10d) and its
fallback to the Python backend, on every rank.

Run under mtxrun with 1, 2 and 3 ranks (tests/python/run_suite.sh):
    mtxrun -np 2 python -m pytest -q -p no:cacheprovider tests/python/test_torch_c10d.py
The collectives themselves (every dtype and op) are test_torch.py's, which runs on whichever
backend is the default; this file checks what is the C++ backend's own: that it is the one made,
that small calls complete on the caller's thread and large ones overlap, the order of native and
delegated calls, and the fallback (a torch it was not built for, MTXCOMM_TORCH_BACKEND=python).
"""

import time
import warnings

import pytest
from torch_common import RANK, SIZE, backend, multi_rank

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from mtxcomm.torch import _native  # noqa: E402
from mtxcomm.torch import backend as mtx_backend  # noqa: E402

_c10d = pytest.importorskip(
    "mtxcomm.torch._c10d",
    reason="the C++ backend was not built (no torch headers at install)",
)


@pytest.fixture(scope="module", autouse=True)
def group(torch_group):
    if type(backend()) is not _c10d.MtxcommBackend:
        pytest.skip("the default group runs the Python backend (MTXCOMM_TORCH_BACKEND=python)")
    return torch_group


def test_the_default_group_runs_the_cpp_backend():
    be = backend()
    assert type(be) is _c10d.MtxcommBackend, type(be)
    assert isinstance(be, torch._C._distributed_c10d.Backend)
    assert dist.get_backend() == "mtxcomm"
    assert _c10d.TORCH_VERSION == str(torch.__version__)
    assert isinstance(mtx_backend.python_backend(be), mtx_backend.MtxcommBackend)
    assert be.inline_bytes == 65536


def test_it_serves_cuda_tensors_exactly_when_libmtxcomm_has_cuda():
    from mtxcomm import _core

    cuda = bool(_core.build_feature("cuda"))
    assert dist.Backend.backend_capability["mtxcomm"] == (["cpu", "cuda"] if cuda else ["cpu"])
    assert _native.devices() == dist.Backend.backend_capability["mtxcomm"]
    # The group's ProcessGroup holds the backend for every device it serves.
    pg = dist.group.WORLD
    assert pg._get_backend(torch.device("cpu")) is backend()
    if cuda:
        assert pg._get_backend(torch.device("cuda")) is backend()
    if torch.cuda.is_available() and cuda:
        t = torch.full((1000,), float(RANK + 1), device="cuda")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [SIZE * (SIZE + 1) / 2] * 1000
        out = torch.empty(SIZE * 3, device="cuda")
        dist.all_gather_into_tensor(out, torch.full((3,), float(RANK), device="cuda"))
        assert out.cpu().tolist() == [float(r) for r in range(SIZE) for _ in range(3)]
        with pytest.raises(ValueError, match="all_to_all_single is not supported on CUDA"):
            dist.all_to_all_single(
                torch.empty(SIZE, device="cuda"), torch.ones(SIZE, device="cuda")
            )
    else:
        print("no CUDA device (or libmtxcomm without CUDA): bench/gpu_check.sh runs CUDA tensors")


def test_ddp_runs_on_it_and_names_it():
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.ones(3, 4)).sum().backward()
    assert backend().name() == "mtxcomm"  # the backend's getBackendName()
    # DDP logs ProcessGroup::getBackendName(): the C++ backend's own ProcessGroup says "mtxcomm"
    # (PyTorch's says "custom" for every backend registered with register_backend).
    assert ddp._get_ddp_logging_data()["backend_name"] == "mtxcomm"
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        dist.all_reduce(g, op=dist.ReduceOp.MAX)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))


def test_a_small_waited_call_completes_on_the_callers_thread_and_an_async_one_returns_a_work():
    for n in (1, 2, 16384):  # 4 B .. 64 KiB
        t = torch.ones(n)
        assert dist.all_reduce(t) is None  # ran here: no Work to wait for
        assert t[0].item() == SIZE and t[-1].item() == SIZE
        # async_op=True goes to the group's worker (never blocks this thread for its peers)
        work = dist.all_reduce(t, async_op=True)
        assert work is not None
        work.wait()
        assert work.is_completed()
        assert torch.equal(t, torch.full((n,), float(SIZE * SIZE)))
        assert work.get_future().value()[0] is t or torch.equal(work.get_future().value()[0], t)


def test_a_waited_small_call_hands_back_no_work_and_an_async_one_does():
    pg = dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # what dist.all_reduce(t) sets
    t = torch.full((4,), float(RANK + 1))
    assert pg.allreduce([t], opts) is None  # completed on this thread: nothing to wait for
    assert t.tolist() == [SIZE * (SIZE + 1) / 2] * 4
    assert dist.all_reduce(t) is None
    assert t.tolist() == [SIZE * SIZE * (SIZE + 1) / 2] * 4
    b = torch.full((3,), float(RANK))
    bopts = dist.BroadcastOptions()
    bopts.rootRank, bopts.asyncOp = SIZE - 1, False
    assert pg.broadcast([b], bopts) is None
    assert b.tolist() == [SIZE - 1.0] * 3
    assert dist.barrier() is None
    opts.asyncOp = True
    work = pg.allreduce([t], opts)
    assert work is not None and work.wait() and work.is_completed()
    # A waited call that fails still raises, naming what was wrong.
    bopts.rootRank = SIZE
    with pytest.raises(Exception, match="root"):
        pg.broadcast([b], bopts)


def test_bench_allreduce_runs_the_library_call_in_a_loop():
    t = torch.ones(5, dtype=torch.float64)
    seconds = backend().bench_allreduce(t, 3)  # in place, SUM, 3 times: SIZE**3
    assert 0 < seconds < 10
    assert t.tolist() == [float(SIZE**3)] * 5
    with pytest.raises(ValueError, match="iters > 0"):
        backend().bench_allreduce(t, 0)


def test_torch_attaches_no_flight_recorder_hook_of_its_own_by_default():
    own = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if own is None:
        pytest.skip("this torch attaches no flight-recorder hook to a backend's groups")
    # mtxcomm records its calls itself (MTXCOMM_FLIGHT_RECORDER): torch's hook, which gathers a
    # Python traceback per call, is not attached to its groups.
    assert "mtxcomm" in own
    assert dist.group.WORLD not in dist.distributed_c10d._world.pg_flight_recorder_hooks


@pytest.mark.parametrize(
    "env, declared",
    [
        ({}, True),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, True),
        ({"TORCH_FR_BUFFER_SIZE": "100"}, False),  # the user asked for torch's recorder
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "20"}, False),
        ({"MTXCOMM_FLIGHT_RECORDER": "0"}, False),  # mtxcomm's own is off
    ],
)
def test_torch_flight_recorder_hook_stays_where_the_user_asks_for_it(monkeypatch, env, declared):
    own = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if own is None:
        pytest.skip("this torch attaches no flight-recorder hook to a backend's groups")
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "MTXCOMM_FLIGHT_RECORDER"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    name = "mtxcomm-test-recorder"
    try:
        assert _native.records_its_own_calls(name) is declared
        assert (name in own) is declared
    finally:
        own.discard(name)


@multi_rank
def test_a_large_call_returns_before_it_is_done():
    t = torch.full((4 << 20,), float(RANK))  # 16 MiB
    if RANK == SIZE - 1:
        time.sleep(0.5)  # the others' call cannot complete before this rank makes it
    work = dist.all_reduce(t, async_op=True)
    if RANK != SIZE - 1:
        assert not work.is_completed()
        assert backend().pending() >= 1
    # A small call made meanwhile queues behind it (calls reach the communicator in order).
    s = torch.ones(2)
    small = dist.all_reduce(s, async_op=True)
    work.wait()
    small.wait()
    assert t[0].item() == sum(range(SIZE)) and t[-1].item() == sum(range(SIZE))
    assert s.tolist() == [SIZE] * 2
    assert backend().pending() == 0


def test_the_future_of_a_queued_call_carries_the_outputs():
    t = torch.full((1 << 20,), 1.0)  # 4 MiB: on the worker
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert doubled.wait()[0].item() == 2 * SIZE


def test_delegated_calls_keep_the_order_of_queued_ones():
    # gather goes to the Python backend; the big allreduce queued before it must come first.
    big = torch.full((1 << 20,), float(RANK))
    work = dist.all_reduce(big, async_op=True)
    out = [torch.zeros(3) for _ in range(SIZE)] if RANK == 0 else None
    dist.gather(torch.full((3,), float(RANK)), out, dst=0)
    work.wait()
    assert big[0].item() == sum(range(SIZE))
    if RANK == 0:
        assert [o[0].item() for o in out] == [float(r) for r in range(SIZE)]


def test_non_contiguous_and_every_native_collective():
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + RANK
    col = m[:, 1]  # a strided view
    dist.all_reduce(col)
    assert col.tolist() == [float(SIZE * (1 + 4 * i) + sum(range(SIZE))) for i in range(3)]
    b = torch.full((5,), float(RANK))
    dist.broadcast(b, src=SIZE - 1)
    assert b.tolist() == [float(SIZE - 1)] * 5
    r = torch.full((3,), float(RANK + 1))
    dist.reduce(r, dst=0, op=dist.ReduceOp.MAX)
    assert r.tolist() == ([float(SIZE)] * 3 if RANK == 0 else [float(RANK + 1)] * 3)
    out = torch.empty(2 * SIZE, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([RANK, RANK * 10]))
    assert out.tolist() == [v for q in range(SIZE) for v in (q, q * 10)]
    rs = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * SIZE, dtype=torch.float64))
    assert rs.tolist() == [float(SIZE * (2 * RANK)), float(SIZE * (2 * RANK + 1))]
    # alltoall with splits: rank r sends q+1 rows of width 2 to rank q.
    ins = [q + 1 for q in range(SIZE)]
    inp = torch.cat([torch.full((q + 1, 2), float(10 * RANK + q)) for q in range(SIZE)])
    outs = [RANK + 1] * SIZE
    got = torch.empty(sum(outs), 2)
    dist.all_to_all_single(got, inp, outs, ins)
    want = torch.cat([torch.full((RANK + 1, 2), float(10 * q + RANK)) for q in range(SIZE)])
    assert torch.equal(got, want)
    dist.barrier()


def test_a_library_error_carries_its_message():
    with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
        dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG)
    ok = torch.ones(2)
    dist.all_reduce(ok)
    assert ok.tolist() == [SIZE] * 2


def _new_world_group():
    g = dist.new_group(list(range(SIZE)))
    return g, g._get_backend(torch.device("cpu"))


def test_a_torch_it_was_not_built_for_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_native, "_torch_version", lambda: "0.0.0+other")
    monkeypatch.setattr(_native, "_warned", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g, be = _new_world_group()
        g2, be2 = _new_world_group()
    mine = [w for w in caught if "C++ torch.distributed backend" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    text = str(mine[0].message)
    assert "built for torch %s but torch 0.0.0+other" % _c10d.TORCH_VERSION in text, text
    assert _native.REBUILD in text
    for grp, b in ((g, be), (g2, be2)):
        assert type(b) is mtx_backend.MtxcommBackend, type(b)
        t = torch.ones(3)
        dist.all_reduce(t, group=grp)
        assert t.tolist() == [SIZE] * 3


def test_an_extension_that_does_not_import_falls_back(monkeypatch):
    import builtins

    real = builtins.__import__

    def refuse(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "mtxcomm.torch._c10d" or (fromlist and "_c10d" in fromlist):
            raise ImportError("undefined symbol: _ZN4c10d7Backend3fooEv (simulated)")
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", refuse)
    monkeypatch.setattr(_native, "_warned", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g, be = _new_world_group()
    mine = [w for w in caught if "C++ torch.distributed backend" in str(w.message)]
    assert len(mine) == 1 and "undefined symbol" in str(mine[0].message)
    assert type(be) is mtx_backend.MtxcommBackend
    t = torch.ones(1)
    dist.all_reduce(t, group=g)
    assert t.item() == SIZE


def test_mtxcomm_torch_backend_python_forces_the_python_one(monkeypatch):
    monkeypatch.setenv("MTXCOMM_TORCH_BACKEND", "python")
    monkeypatch.setattr(_native, "_warned", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g, be = _new_world_group()
    assert not [w for w in caught if "C++ torch.distributed backend" in str(w.message)]
    assert type(be) is mtx_backend.MtxcommBackend
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    assert t.tolist() == [SIZE] * 2
