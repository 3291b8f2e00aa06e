"""The "mtxcomm" torch.distributed backend and the Horovod-style mtxcomm.torch, on every rank.

Run under mtxrun (which gives torch.distributed's env:// its MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) with 1, 2 and 3 ranks (tests/python/run_suite.sh):
    mtxrun -np 3 python -m pytest -q -p no:cacheprovider tests/python/test_torch.py
Every collective × dtype × op against closed-form values (conftest.expected_reduce), async Work
and futures, errors. Every rank runs every test in the same order; a test's collectives come
before its asserts. test_torch_jobs.py has the multi-process jobs (DDP, torchrun, killed ranks).
"""

import datetime
import math
import os
import time

import numpy as np
import pytest
from conftest import assert_same, expected_reduce, values

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/setup_python.sh "
                                            "installs it; --no-torch leaves it out)")
import torch.distributed as dist  # noqa: E402

import mtxcomm.torch as hvd  # noqa: E402

SIZE = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))
multi_rank = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks")

DTYPES = [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
          torch.int64, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.bool]
IDS = [str(d).replace("torch.", "") for d in DTYPES]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}
NP = {torch.bfloat16: np.float32, torch.bool: np.bool_}


@pytest.fixture(scope="module", autouse=True)
def group():
    assert "mtxcomm" in dist.Backend.backend_list
    dist.init_process_group("mtxcomm", timeout=datetime.timedelta(seconds=120))
    yield dist.group.WORLD
    dist.destroy_process_group()


def backend():
    """The default group's mtxcomm backend object itself (its Works are mtxcomm's)."""
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def np_dtype(dt):
    if dt in NP:
        return NP[dt]
    return torch.empty(0, dtype=dt).numpy().dtype


def tensor_of(shape, dt, rank, offset=0):
    """Rank's deterministic tensor (small values, exact in every dtype)."""
    a = values(shape, np_dtype(dt), rank, offset)
    return torch.from_numpy(np.array(a, copy=True)).to(dt)


def as_np(t):
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def want_reduce(shape, dt, op, offset=0):
    arrays = [values(shape, np_dtype(dt), r, offset) for r in range(SIZE)]
    if dt == torch.bfloat16:
        # bfloat16: accumulated in float32 and rounded once, as float16 (conftest).
        got = expected_reduce(arrays, op, np.float32)
        return torch.from_numpy(got).to(torch.bfloat16).float().numpy()
    return expected_reduce(arrays, op, np_dtype(dt))


def check(got, want, op, dt):
    g = as_np(got)
    if dt == torch.bfloat16:
        w = np.asarray(want, dtype=np.float32)
        if op == "avg":
            np.testing.assert_allclose(g, w, rtol=1e-2)
        else:
            np.testing.assert_array_equal(g, w)
        return
    assert_same(g, np.asarray(want), op)


def test_backend_is_mtxcomm():
    assert dist.get_backend() == "mtxcomm"
    assert dist.get_rank() == RANK and dist.get_world_size() == SIZE
    assert hvd.rank() == RANK and hvd.size() == SIZE
    assert os.environ["LOCAL_RANK"] == str(hvd.local_rank())
    assert os.environ["LOCAL_WORLD_SIZE"] == str(hvd.local_size())


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce(dt, op):
    t = tensor_of((37,), dt, RANK)
    if dt == torch.bool and op == "avg":
        with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
            dist.all_reduce(t, op=OPS[op])
        return
    dist.all_reduce(t, op=OPS[op])
    check(t, want_reduce((37,), dt, op), op, dt)


@pytest.mark.parametrize("dt", [torch.float32, torch.int64, torch.bfloat16],
                         ids=["float32", "int64", "bfloat16"])
def test_allreduce_shapes_and_views(dt):
    empty = torch.zeros(0, dtype=dt)
    scalar = tensor_of((), dt, RANK)
    big = tensor_of((3, 1000), dt, RANK)
    # A non-contiguous view: reduced through a copy, written back into the caller's tensor.
    base = tensor_of((8, 6), dt, RANK)
    view = base.t()
    dist.all_reduce(empty)
    dist.all_reduce(scalar)
    dist.all_reduce(big)
    dist.all_reduce(view)
    assert empty.numel() == 0
    check(scalar, want_reduce((), dt, "sum"), "sum", dt)
    check(big, want_reduce((3, 1000), dt, "sum"), "sum", dt)
    check(base, want_reduce((8, 6), dt, "sum"), "sum", dt)


def test_allreduce_coalesced():
    ts = [tensor_of((5,), torch.float32, RANK), tensor_of((7, 2), torch.float32, RANK, 2),
          tensor_of((3,), torch.float32, RANK, 1)]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
    # The backend itself also takes several dtypes in one call (one request per dtype).
    mixed = [tensor_of((4,), torch.int32, RANK), tensor_of((4,), torch.float64, RANK)]
    backend().allreduce_coalesced(mixed, dist.AllreduceCoalescedOptions()).wait()
    check(ts[0], want_reduce((5,), torch.float32, "max"), "max", torch.float32)
    check(ts[1], want_reduce((7, 2), torch.float32, "max", 2), "max", torch.float32)
    check(ts[2], want_reduce((3,), torch.float32, "max", 1), "max", torch.float32)
    check(mixed[0], want_reduce((4,), torch.int32, "sum"), "sum", torch.int32)
    check(mixed[1], want_reduce((4,), torch.float64, "sum"), "sum", torch.float64)


def test_premul_sum_and_complex():
    t = torch.full((4,), float(RANK + 1), dtype=torch.float64)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    c = torch.full((3,), complex(RANK + 1, -RANK), dtype=torch.complex64)
    dist.all_reduce(c)
    total = SIZE * (SIZE + 1) / 2
    assert t.tolist() == [0.5 * total] * 4
    assert c.tolist() == [complex(total, -(SIZE - 1) * SIZE / 2)] * 3


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
def test_broadcast_from_every_root(dt):
    got = []
    for root in range(SIZE):
        t = tensor_of((9,), dt, RANK, offset=1)
        dist.broadcast(t, src=root)
        got.append(t)
    for root, t in enumerate(got):
        want = values((9,), np_dtype(dt), root, offset=1)
        np.testing.assert_array_equal(as_np(t).astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
def test_allgather(dt):
    inp = tensor_of((2, 3), dt, RANK)
    outs = [torch.empty((2, 3), dtype=dt) for _ in range(SIZE)]
    dist.all_gather(outs, inp)
    flat = torch.empty((2 * SIZE, 3), dtype=dt)
    dist.all_gather_into_tensor(flat, inp)
    for r in range(SIZE):
        want = values((2, 3), np_dtype(dt), r).astype(np.float64)
        np.testing.assert_array_equal(as_np(outs[r]).astype(np.float64), want)
        np.testing.assert_array_equal(as_np(flat[2 * r:2 * r + 2]).astype(np.float64), want)


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_reduce_scatter(dt, op):
    if dt == torch.bool and op == "avg":
        with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
            dist.reduce_scatter_tensor(torch.empty(4, dtype=dt), tensor_of((SIZE, 4), dt, RANK),
                                       op=OPS[op])
        return
    full = tensor_of((SIZE, 4), dt, RANK)
    out = torch.empty(4, dtype=dt)
    dist.reduce_scatter_tensor(out, full, op=OPS[op])
    listed = torch.empty((2,), dtype=dt)
    dist.reduce_scatter(listed, [tensor_of((2,), dt, RANK, offset=j) for j in range(SIZE)],
                        op=OPS[op])
    check(out, want_reduce((SIZE, 4), dt, op)[RANK], op, dt)
    check(listed, want_reduce((2,), dt, op, offset=RANK), op, dt)


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_reduce_keeps_non_root_tensors(dt, op):
    if dt == torch.bool and op == "avg":
        with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
            dist.reduce(tensor_of((6,), dt, RANK), dst=0, op=OPS[op])
        return
    results = []
    for root in range(SIZE):
        t = tensor_of((6,), dt, RANK)
        dist.reduce(t, dst=root, op=OPS[op])
        results.append(t)
    for root, t in enumerate(results):
        if RANK == root:
            check(t, want_reduce((6,), dt, op), op, dt)
        else:
            assert torch.equal(t, tensor_of((6,), dt, RANK))


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
def test_all_to_all(dt):
    # Equal splits: rank r sends row block j (2 rows of 3) to rank j.
    inp = torch.stack([tensor_of((2, 3), dt, RANK, offset=j) for j in range(SIZE)]).reshape(
        2 * SIZE, 3)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    # Uneven splits: rank r sends j + 1 rows to rank j, so receives r + 1 from each.
    in_splits = [j + 1 for j in range(SIZE)]
    uneven = torch.cat([tensor_of((j + 1, 2), dt, RANK, offset=j) for j in range(SIZE)])
    got = torch.empty(((RANK + 1) * SIZE, 2), dtype=dt)
    dist.all_to_all_single(got, uneven, [RANK + 1] * SIZE, in_splits)
    # Lists.
    outs = [torch.empty(3, dtype=dt) for _ in range(SIZE)]
    dist.all_to_all(outs, [tensor_of((3,), dt, RANK, offset=j) for j in range(SIZE)])
    for src in range(SIZE):
        want = values((2, 3), np_dtype(dt), src, offset=RANK).astype(np.float64)
        np.testing.assert_array_equal(as_np(out[2 * src:2 * src + 2]).astype(np.float64), want)
        want = values((RANK + 1, 2), np_dtype(dt), src, offset=RANK).astype(np.float64)
        block = got[(RANK + 1) * src:(RANK + 1) * (src + 1)]
        np.testing.assert_array_equal(as_np(block).astype(np.float64), want)
        want = values((3,), np_dtype(dt), src, offset=RANK).astype(np.float64)
        np.testing.assert_array_equal(as_np(outs[src]).astype(np.float64), want)


@pytest.mark.parametrize("dt", [torch.uint8, torch.int64, torch.bfloat16, torch.float32,
                                torch.bool], ids=["uint8", "int64", "bfloat16", "float32", "bool"])
def test_gather_and_scatter_at_every_root(dt):
    gathered, scattered = [], []
    for root in range(SIZE):
        gl = [torch.empty((2, 3), dtype=dt) for _ in range(SIZE)] if RANK == root else None
        dist.gather(tensor_of((2, 3), dt, RANK, offset=root), gl, dst=root)
        gathered.append(gl)
        out = torch.empty((4,), dtype=dt)
        sl = ([tensor_of((4,), dt, root, offset=j) for j in range(SIZE)] if RANK == root
              else None)
        dist.scatter(out, sl, src=root)
        scattered.append(out)
    for root in range(SIZE):
        if RANK == root:
            for src in range(SIZE):
                np.testing.assert_array_equal(as_np(gathered[root][src]),
                                              values((2, 3), np_dtype(dt), src, offset=root))
        else:
            assert gathered[root] is None
        np.testing.assert_array_equal(as_np(scattered[root]),
                                      values((4,), np_dtype(dt), root, offset=RANK))


def test_gather_object_and_scatter_object_list():
    # Both are PyTorch's own functions over the backend's gather and scatter (and allgather).
    objs = [None] * SIZE if RANK == SIZE - 1 else None
    dist.gather_object({"rank": RANK, "text": "x" * (100 * RANK)}, objs, dst=SIZE - 1)
    got = [None]
    dist.scatter_object_list(got, [("row", i, [i] * i) for i in range(SIZE)] if RANK == 0
                             else None, src=0)
    if RANK == SIZE - 1:
        assert objs == [{"rank": i, "text": "x" * (100 * i)} for i in range(SIZE)]
    assert got == [("row", RANK, [RANK] * RANK)]


@multi_rank
def test_gather_into_a_non_contiguous_list_and_a_wrong_size():
    gl = [torch.empty(4, 2).t() for _ in range(SIZE)] if RANK == 0 else None
    work = dist.gather(torch.full((2, 4), float(RANK)), gl, dst=0, async_op=True)
    work.wait()
    # One rank sends 4 elements where the root's list holds 3: the root fails naming both
    # sizes (the senders, as with Gloo, do not hear of it); the group still works.
    gl2 = [torch.empty(3) for _ in range(SIZE)] if RANK == 0 else None
    err = None
    try:
        dist.gather(torch.ones(4 if RANK == SIZE - 1 else 3), gl2, dst=0)
    except RuntimeError as e:
        err = str(e)
    t = torch.ones(2)
    dist.all_reduce(t)
    if RANK == 0:
        assert all(torch.equal(gl[i], torch.full((2, 4), float(i))) for i in range(SIZE))
        assert err is not None and "(%d,)" % (3 * SIZE) in err and "(%d,)" % (3 * SIZE + 1) in err
    else:
        assert err is None
    assert t.tolist() == [SIZE] * 2


def test_barrier_and_monotonic_progress():
    for _ in range(3):
        dist.barrier()
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == SIZE


def test_async_work_and_futures():
    # More requests in flight than the backend's name window (64): the oldest are waited for.
    tensors = [torch.full((10,), float(i + RANK)) for i in range(150)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futs = [w.get_future() for w in works[:5]]
    chained = futs[0].then(lambda f: f.value()[0] * 2)
    for w in works:
        assert w.wait() is True
    # Through torch.distributed, a Python backend's Work is wrapped by PyTorch
    # (PyProcessGroup::PyWorkHolder), which forwards wait() and get_future() only: completion
    # is polled with get_future().done(). The backend's own Work has them all.
    assert all(w.get_future().done() for w in works)
    opts = dist.AllreduceOptions()
    own = backend().allreduce([torch.ones(3)], opts)
    own.wait()
    assert own.is_completed() and own.is_success() and own.exception() is None
    base = SIZE * (SIZE - 1) / 2
    for i, t in enumerate(tensors):
        assert t.tolist() == [SIZE * i + base] * 10, i
    assert futs[2].wait()[0].tolist() == [SIZE * 2 + base] * 10
    assert chained.wait().tolist() == [2 * base] * 10
    # A future asked for before the work is done is completed by the backend's thread.
    t = torch.ones(1000)
    fut = dist.all_reduce(t, async_op=True).get_future()
    assert fut.wait()[0][0].item() == SIZE
    w = dist.all_gather_into_tensor(torch.empty(2 * SIZE), torch.ones(2), async_op=True)
    got = w.get_future().wait()
    assert len(got) == 1 and got[0].tolist() == [1.0] * 2 * SIZE
    own = backend().allreduce([torch.ones(2)], dist.AllreduceOptions())
    assert own.result()[0].tolist() == [SIZE] * 2


def test_an_async_call_whose_handle_is_dropped_keeps_its_tensors_until_done():
    # Legal with Gloo, whose Work owns its tensors: the backend must not let the engine read and
    # write temporaries the caller no longer holds (their memory is reused by the next
    # allocations, whose values the engine's writes would change, or the heap corrupted).
    for it in range(30):
        for k in range(20):
            dist.all_reduce(torch.full((1000,), float(k)), async_op=True)
        junk = [torch.full((1000,), 7.0) for _ in range(40)]
        t = torch.ones(1000)
        dist.all_reduce(t)  # after the dropped ones: they are done when it returns
        assert t.tolist() == [float(SIZE)] * 1000, it
        assert all(bool((j == 7.0).all()) for j in junk), it


def _eventually(pred, seconds=10.0):
    end = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_a_dropped_work_still_fills_its_outputs():
    # Gloo copies into the caller's list outputs when the call completes, waited for or not.
    gathered = [torch.full((3,), -1.0) for _ in range(SIZE)]
    dist.all_gather(gathered, torch.full((3,), float(RANK)), async_op=True)  # handle dropped
    a2a_out = [torch.full((2,), -1.0) for _ in range(SIZE)]
    dist.all_to_all(a2a_out, [torch.full((2,), float(RANK * 10 + j)) for j in range(SIZE)],
                    async_op=True)
    dist.barrier()
    assert _eventually(lambda: all(g.tolist() == [float(r)] * 3 for r, g in enumerate(gathered))
                       and all(o.tolist() == [float(r * 10 + RANK)] * 2
                               for r, o in enumerate(a2a_out))), (gathered, a2a_out)


def test_an_allgathers_future_is_a_flat_list_of_tensors():
    outs = [torch.zeros(2) for _ in range(SIZE)]
    got = dist.all_gather(outs, torch.full((2,), float(RANK)), async_op=True).get_future().wait()
    assert len(got) == SIZE and all(isinstance(t, torch.Tensor) for t in got), got
    assert [t.tolist() for t in got] == [[float(r)] * 2 for r in range(SIZE)]


def test_all_gather_coalesced_fills_out_rank_then_tensor():
    # c10d's layout is out[rank][i] (as Gloo reads it); with as many inputs as ranks the shape
    # checks pass either way, and the result came back transposed.
    for inputs in (SIZE, 2):
        inp = [torch.full((3,), float(10 * RANK + i)) for i in range(inputs)]
        out = [[torch.zeros(3) for _ in range(inputs)] for _ in range(SIZE)]
        dist.all_gather_coalesced(out, inp)
        got = [[int(t[0]) for t in row] for row in out]
        assert got == [[10 * q + i for i in range(inputs)] for q in range(SIZE)], got
    with pytest.raises(ValueError, match="output lists for a group of %d ranks" % SIZE):
        dist.all_gather_coalesced([[torch.zeros(3)]] * (SIZE + 1), [torch.ones(3)])


def test_a_list_refused_after_a_valid_one_submits_nothing():
    # The second input's outputs are wrong on every rank: the first must not be left in flight
    # with its staging buffers freed by the error (every rank raises; the next call pairs).
    for _ in range(5):
        out = [[torch.zeros(1000), torch.zeros(999 if r == RANK else 1000)] for r in range(SIZE)]
        with pytest.raises(ValueError, match="this rank's output tensor has 999 elements but its "
                                             "input 1000"):
            dist.all_gather_coalesced(out, [torch.ones(1000), torch.ones(1000)])
        junk = [torch.full((1000,), 7.0) for _ in range(40)]
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t.tolist() == [float(SIZE)] * 4
        assert all(bool((j == 7.0).all()) for j in junk)


def test_the_future_of_a_failed_call_fails():
    # AVG of bool is refused by the library on every rank; through torch.distributed's own
    # Work (PyTorch re-wraps it), the future must fail, not succeed with the error as value.
    work = dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value())
    with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
        fut.wait()
    with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
        chained.wait()
    ok = torch.ones(2)
    dist.all_reduce(ok)
    assert ok.tolist() == [SIZE] * 2


@multi_rank
def test_one_rank_refusing_its_arguments_keeps_the_ranks_in_step():
    # Only the last rank passes a bad root: it raises its own ValueError, the others' broadcast
    # fails at once (not after the timeout), and the next call pairs with the next everywhere.
    root = 99 if RANK == SIZE - 1 else 0
    if RANK == SIZE - 1:
        with pytest.raises(ValueError, match="root 99 is not a rank"):
            backend().broadcast([torch.ones(3)], _bcast_opts(root))
    else:
        with pytest.raises(RuntimeError, match="disagree on the collective: .*rank %d has a "
                           "call it refused before sending anything" % (SIZE - 1)):
            backend().broadcast([torch.ones(3)], _bcast_opts(root)).wait()
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [SIZE] * 4


def _bcast_opts(root):
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o


def test_unsupported_op_and_collective():
    t = torch.ones(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="reduce op .*BAND.* is not supported"):
        dist.all_reduce(t, op=dist.ReduceOp.BAND)
    with pytest.raises((RuntimeError, NotImplementedError), match="(?i)send|not supported|"
                                                                  "not implemented"):
        backend().send([t], (RANK + 1) % SIZE, 0)
    with pytest.raises(ValueError, match="complex|not defined"):
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match="root 99 is not a rank|99"):
        hvd.broadcast_(torch.ones(2), 99)
    # The group still works.
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [SIZE] * 2


def test_non_cpu_tensor_is_refused():
    if torch.cuda.is_available():
        with pytest.raises((RuntimeError, ValueError), match="(?i)cuda"):
            dist.all_reduce(torch.ones(2, device="cuda"))
    else:
        print("no CUDA device: the backend's refusal is checked with a 'meta' tensor")
    with pytest.raises(ValueError, match="a tensor on meta; mtxcomm runs torch collectives on "
                                         "CPU tensors .*cpu:mtxcomm,cuda:nccl"):
        backend().allreduce([torch.ones(2, device="meta")], dist.AllreduceOptions())
    ok = torch.ones(1)
    dist.all_reduce(ok)
    assert ok.item() == SIZE


@multi_rank
def test_mismatched_shapes_raise_on_every_rank():
    t = torch.ones(3 + (RANK == 0), dtype=torch.float32)
    with pytest.raises(RuntimeError) as e:
        dist.all_reduce(t)
    assert "shape" in str(e.value), str(e.value)
    t = torch.ones(4)
    dist.all_reduce(t)  # the next call works
    assert t.tolist() == [SIZE] * 4


def test_groups():
    same = dist.new_group(list(range(SIZE)))
    t = torch.ones(2)
    dist.all_reduce(t, group=same)
    assert t.tolist() == [SIZE] * 2
    if SIZE > 1:
        if RANK == 0:  # the only member: its backend is created, and refused
            with pytest.raises(RuntimeError, match="whole world.*gloo"):
                dist.new_group([0])
        else:
            assert dist.new_group([0]) == dist.GroupMember.NON_GROUP_MEMBER


# ---- the Horovod-style API ---------------------------------------------------------------------

def test_hvd_facts():
    hvd.init()  # idempotent
    assert hvd.is_initialized()
    assert hvd.cross_size() * hvd.local_size() == SIZE
    assert isinstance(hvd.mpi_built(), bool) and hvd.gloo_built() is False


def test_hvd_allreduce_and_grad():
    x = torch.full((4,), float(RANK + 1), requires_grad=True)
    avg = hvd.allreduce(x)  # Average by default
    summed = hvd.allreduce(x, op=hvd.Sum, name="hvd.sum")
    (avg.sum() + 2 * summed.sum()).backward()
    scaled = hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Sum, prescale_factor=2,
                           postscale_factor=3)
    inplace = torch.full((2,), float(RANK))
    hvd.allreduce_(inplace, op=hvd.Max)
    fp16 = hvd.allreduce(torch.full((5,), 1.5), compression=hvd.Compression.fp16, op=hvd.Sum)
    mean = (SIZE + 1) / 2
    assert avg.tolist() == [mean] * 4
    assert summed.tolist() == [SIZE * mean] * 4
    # d/dx of sum(avg) is the average of ones (1); of 2 * sum(summed), 2 * size.
    assert x.grad.tolist() == [1 + 2 * SIZE] * 4
    assert scaled.tolist() == [6 * SIZE] * 3 and scaled.dtype == torch.int32
    assert inplace.tolist() == [SIZE - 1] * 2
    assert fp16.dtype == torch.float32 and fp16.tolist() == [1.5 * SIZE] * 5


def test_hvd_named_requests_pair_by_name_in_any_order():
    names = ["grad.%d" % i for i in range(6)]
    order = names if RANK % 2 == 0 else list(reversed(names))
    handles = {n: hvd.allreduce_async(torch.full((3,), float(i)), name=n, op=hvd.Sum)
               for n, i in zip(order, range(6)) for _ in [0]}
    results = {n: hvd.synchronize(h) for n, h in handles.items()}
    for i, n in enumerate(order):
        # rank r gave name n the value i_r (its position in r's order); sum over ranks.
        want = sum(names.index(n) if r % 2 == 0 else 5 - names.index(n) for r in range(SIZE))
        assert results[n].tolist() == [float(want)] * 3, (n, i)
    assert all(isinstance(n, str) for n in results)


def test_hvd_grouped_and_poll():
    outs = hvd.grouped_allreduce([torch.ones(3), torch.full((2,), 2.0)], op=hvd.Sum)
    h = hvd.allreduce_async(torch.ones(1), op=hvd.Sum)
    while not hvd.poll(h):
        pass
    r = hvd.synchronize(h)
    assert outs[0].tolist() == [SIZE] * 3 and outs[1].tolist() == [2 * SIZE] * 2
    assert r.tolist() == [SIZE]
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.synchronize(h)


def test_hvd_allgather_uneven_and_grad():
    x = torch.full((RANK + 1, 2), float(RANK), requires_grad=True)
    g = hvd.allgather(x)
    g.sum().backward()
    rows = sum(r + 1 for r in range(SIZE))
    assert g.shape == (rows, 2)
    start = 0
    for r in range(SIZE):
        assert g[start:start + r + 1].tolist() == [[float(r)] * 2] * (r + 1)
        start += r + 1
    # Horovod: the gradient of allgather is the average over ranks of the upstream gradient.
    assert x.grad.tolist() == [[1.0, 1.0]] * (RANK + 1)


def test_hvd_broadcast_alltoall_reducescatter():
    b = hvd.broadcast(torch.full((3,), float(RANK)), root_rank=SIZE - 1)
    splits = [r + 1 for r in range(SIZE)]
    data = torch.cat([torch.full((r + 1,), float(RANK * 10 + r)) for r in range(SIZE)])
    out, received = hvd.alltoall(data, splits=splits)
    even = hvd.alltoall(torch.arange(SIZE, dtype=torch.float32) + RANK * 100)
    rs = hvd.reducescatter(torch.ones(SIZE * 2, 3) * (RANK + 1), op=hvd.Sum)
    assert b.tolist() == [float(SIZE - 1)] * 3
    assert received.tolist() == [RANK + 1] * SIZE
    assert out.tolist() == [float(s * 10 + RANK) for s in range(SIZE) for _ in range(RANK + 1)]
    assert even.tolist() == [float(s * 100 + RANK) for s in range(SIZE)]
    assert rs.shape == (2, 3) and rs.tolist() == [[SIZE * (SIZE + 1) / 2] * 3] * 2


def test_hvd_alltoall_bad_splits_raise_before_anything_is_sent():
    # A negative split adding up to dimension 0 ([5, -1, ...]), a short list and a wrong sum:
    # ValueError on every rank, and the group stays in step (the next collective is right).
    n = SIZE
    for splits in ([5, -1] + [0] * (n - 2), [4] * (n - 1), [1] * n):
        with pytest.raises(ValueError, match="do not split 4 rows over %d ranks" % n):
            hvd.alltoall(torch.ones(4), splits=torch.tensor(splits))
    total = hvd.allreduce(torch.full((2,), float(RANK)), op=hvd.Sum)
    assert total.tolist() == [float(sum(range(n)))] * 2


def test_hvd_objects_and_parameters():
    obj = hvd.broadcast_object({"rank": RANK, "list": list(range(RANK + 2))}, root_rank=0)
    gathered = hvd.allgather_object(("r", RANK))
    torch.manual_seed(RANK)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (RANK + 1), momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()  # momentum buffers exist, different on every rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mom = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    every = hvd.allgather(torch.cat([flat, mom]).unsqueeze(0))
    lr = hvd.allgather(torch.tensor([opt.param_groups[0]["lr"]]))
    assert obj == {"rank": 0, "list": [0, 1]}
    assert gathered == [("r", r) for r in range(SIZE)]
    assert all(torch.equal(every[0], every[r]) for r in range(SIZE))
    assert lr.tolist() == pytest.approx([0.1] * SIZE)


def test_hvd_distributed_optimizer_averages():
    # y = w . x with a squared loss: rank r's gradient is 2 (w.x_r - t_r) x_r, in closed form.
    w0 = torch.tensor([0.5, -1.0, 2.0])
    xs = [torch.tensor([1.0 + r, 2.0, -1.0 * r]) for r in range(SIZE)]
    ts = [float(r) for r in range(SIZE)]
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(w0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss = (model(xs[RANK].unsqueeze(0)).squeeze() - ts[RANK]) ** 2
    loss.backward()
    opt.step()
    grads = [2 * (torch.dot(w0, xs[r]) - ts[r]) * xs[r] for r in range(SIZE)]
    want = w0 - 0.1 * sum(grads) / SIZE
    torch.testing.assert_close(model.weight.detach().reshape(-1), want, rtol=1e-6, atol=1e-6)
    assert isinstance(opt, torch.optim.SGD)


def test_hvd_distributed_optimizer_accumulates_passes():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    for k in range(2):  # gradients x = (rank + 1 + k) * (1, 1)
        model(torch.full((1, 2), float(RANK + 1 + k))).sum().backward()
    opt.step()
    # As Horovod: the passes' gradients summed in p.grad, then averaged over the ranks.
    mean = sum(r + 1 + k for r in range(SIZE) for k in range(2)) / SIZE
    want = 1.0 - mean
    assert model.weight.detach().reshape(-1).tolist() == pytest.approx([want, want], abs=1e-6)


def test_hvd_join_last():
    # Every rank but the last joins at once; the last reduces once with the others standing in
    # (zeros), then joins: every rank learns it was the last.
    if RANK == SIZE - 1:
        t = hvd.allreduce(torch.full((2,), 5.0), op=hvd.Sum, name="join.tail")
        last = hvd.join()
        assert t.tolist() == [5.0, 5.0]
    else:
        last = hvd.join()
    assert last == SIZE - 1
    t = hvd.allreduce(torch.ones(1), op=hvd.Sum)  # everyone is back
    assert t.tolist() == [SIZE]


@pytest.mark.parametrize("dt", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_hvd_integer_scale_factors_truncate_toward_zero(dt):
    # As Horovod: an integer tensor is scaled in float64 and the product truncated toward zero
    # (0.9 * -7 = -6.3 -> -6), before the sum (prescale) or after it (postscale).
    v = [-7, 7, 5, -5, 3, -1, 0, 100]
    pre = hvd.allreduce(torch.tensor(v, dtype=dt), op=hvd.Sum, prescale_factor=0.9)
    post = hvd.allreduce(torch.tensor(v, dtype=dt), op=hvd.Sum, postscale_factor=0.3)
    inplace = torch.tensor(v, dtype=dt)
    hvd.allreduce_(inplace, op=hvd.Sum, prescale_factor=0.5, postscale_factor=0.7)
    assert pre.dtype == dt and post.dtype == dt
    assert pre.tolist() == [SIZE * math.trunc(x * 0.9) for x in v]
    assert post.tolist() == [math.trunc(SIZE * x * 0.3) for x in v]
    assert inplace.tolist() == [math.trunc(SIZE * math.trunc(x * 0.5) * 0.7) for x in v]


@multi_rank
def test_hvd_same_element_count_but_another_shape_raises_on_every_rank():
    # (2*SIZE, 3) on rank 0 and (3, 2*SIZE) elsewhere: the same count, not the same tensor.
    shape = (2 * SIZE, 3) if RANK == 0 else (3, 2 * SIZE)
    raised = {}
    for what, call in (("allreduce", lambda t: hvd.allreduce(t, op=hvd.Sum)),
                       ("broadcast", lambda t: hvd.broadcast(t, root_rank=0)),
                       ("reducescatter", lambda t: hvd.reducescatter(t, op=hvd.Sum))):
        try:
            call(torch.ones(shape))
        except RuntimeError as e:
            raised[what] = str(e)
    after = hvd.allreduce(torch.ones(2), op=hvd.Sum)  # the ranks are still in step
    assert sorted(raised) == ["allreduce", "broadcast", "reducescatter"], raised
    assert all("disagree on the shapes" in m for m in raised.values()), raised
    assert after.tolist() == [SIZE] * 2


def _dup_call(kind, name):
    t = torch.ones(2 * SIZE, 2)
    if kind == "allreduce":
        return hvd.allreduce_async(t, name=name, op=hvd.Sum)
    if kind == "allgather":
        return hvd.allgather_async(t, name=name)
    if kind == "broadcast":
        return hvd.broadcast_async(t, root_rank=0, name=name)
    if kind == "alltoall":
        return hvd.alltoall_async(t, name=name)
    return hvd.reducescatter_async(t, name=name, op=hvd.Sum)


@multi_rank
@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast", "alltoall",
                                  "reducescatter"])
def test_hvd_a_second_call_of_a_name_in_flight_raises_valueerror(kind):
    # Rank 0 makes "a" before the barrier, the others after it; the others make "b" before it,
    # rank 0 after it: each rank's first call of its name is surely still in flight (a rank
    # it pairs with is in the barrier) when it makes a second one, which raises ValueError
    # and submits nothing (the first still pairs with the others' call).
    first, second = ("a", "b") if RANK == 0 else ("b", "a")
    h1 = _dup_call(kind, "dup.%s.%s" % (kind, first))
    with pytest.raises(ValueError, match="in flight on this rank"):
        _dup_call(kind, "dup.%s.%s" % (kind, first))
    hvd.barrier()
    h2 = _dup_call(kind, "dup.%s.%s" % (kind, second))
    r1, r2 = hvd.synchronize(h1), hvd.synchronize(h2)
    h3 = _dup_call(kind, "dup.%s.a" % kind)  # done: the name is free again
    r3 = hvd.synchronize(h3)
    want = {"allreduce": [[SIZE] * 2] * 2 * SIZE, "allgather": [[1.0] * 2] * 2 * SIZE * SIZE,
            "broadcast": [[1.0] * 2] * 2 * SIZE, "alltoall": [[1.0] * 2] * 2 * SIZE,
            "reducescatter": [[SIZE] * 2] * 2}[kind]
    for r in (r1, r2, r3):
        r = r[0] if kind == "alltoall" else r
        assert r.tolist() == want


@multi_rank
@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast", "alltoall",
                                  "reducescatter"])
def test_hvd_poll_is_false_until_the_result_is_there(kind):
    # Rank 0's call cannot complete before the others make theirs, after the barrier.
    if RANK == 0:
        h = _dup_call(kind, "poll." + kind)
        early = hvd.poll(h)
        hvd.barrier()
    else:
        hvd.barrier()
        h = _dup_call(kind, "poll." + kind)
    while not hvd.poll(h):
        time.sleep(0.001)
    r = hvd.synchronize(h)
    r = r[0] if kind == "alltoall" else r
    if RANK == 0:
        assert early is False
    assert r.shape[1:] == (2,) and r.numel() > 0


@multi_rank
def test_hvd_only_allreduce_runs_while_a_rank_has_joined():
    # As Horovod: the last rank's allgather, broadcast, alltoall and reducescatter raise while
    # the others have joined; its allreduce runs, with zeros from the joined ranks. (Calls
    # made by some ranks only are named: an unnamed one would take a number the joined ranks
    # do not, and their later unnamed calls would pair with the wrong ones, as in Horovod.)
    raised = []
    if RANK == SIZE - 1:
        calls = (("allgather", lambda: hvd.allgather(torch.ones(2, 3), name="j.ag")),
                 ("grouped_allgather",
                  lambda: hvd.grouped_allgather([torch.ones(2)] * 2, name="j.gag")),
                 ("broadcast", lambda: hvd.broadcast(torch.ones(3), RANK, name="j.bc")),
                 ("alltoall", lambda: hvd.alltoall(torch.ones(SIZE, 2), name="j.a2a")),
                 ("reducescatter", lambda: hvd.reducescatter(torch.ones(SIZE, 2), name="j.rs")))
        for what, call in calls:
            try:
                call()
            except RuntimeError as e:
                raised.append((what, "join" in str(e)))
        t = hvd.allreduce(torch.full((2,), 3.0), op=hvd.Sum, name="j.ar")
        last = hvd.join()
        assert t.tolist() == [3.0, 3.0]
    else:
        last = hvd.join()
    after = hvd.allgather(torch.full((1,), float(RANK)))
    assert last == SIZE - 1
    assert after.tolist() == [float(r) for r in range(SIZE)]
    if RANK == SIZE - 1:
        assert raised == [(w, True) for w in ("allgather", "grouped_allgather", "broadcast",
                                              "alltoall", "reducescatter")]


def test_hvd_grouped_allreduce_in_place_and_its_gradient():
    ts = [torch.full((3,), float(RANK + 1)), torch.arange(4, dtype=torch.float64) * (RANK + 1)]
    same = hvd.grouped_allreduce_(ts, op=hvd.Sum)
    h = hvd.grouped_allreduce_async_([torch.full((2,), RANK, dtype=torch.int32)], op=hvd.Max)
    ints = hvd.synchronize(h)
    xs = [torch.full((2,), float(RANK), requires_grad=True),
          torch.full((3,), 2.0 * RANK, requires_grad=True)]
    avg = hvd.grouped_allreduce(xs)  # Average
    (avg[0].sum() * 2 + avg[1].sum() * 3).backward()
    tri = SIZE * (SIZE + 1) / 2
    assert same is ts or same == ts
    assert ts[0].tolist() == [tri] * 3 and ts[1].tolist() == [tri * i for i in range(4)]
    assert ints[0].tolist() == [SIZE - 1] * 2
    mean = (SIZE - 1) / 2
    assert avg[0].tolist() == pytest.approx([mean] * 2)
    assert avg[1].tolist() == pytest.approx([2 * mean] * 3)
    # The gradient of an average over ranks: the average of the upstream gradients (2 and 3).
    assert xs[0].grad.tolist() == pytest.approx([2.0] * 2)
    assert xs[1].grad.tolist() == pytest.approx([3.0] * 3)


def test_hvd_grouped_allgather_and_its_gradient():
    # Rank r gives r + 1 rows of value r to the first, 2 rows of value 10 r to the second.
    a = torch.full((RANK + 1, 2), float(RANK), requires_grad=True)
    b = torch.full((2,), 10.0 * RANK, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    h = hvd.grouped_allgather_async([torch.full((1,), RANK, dtype=torch.int16)] * 3)
    small = hvd.synchronize(h)
    # Upstream gradient: row i of ga gets weight i, element j of gb weight 100 + j.
    (ga * torch.arange(ga.shape[0], dtype=torch.float32).unsqueeze(1)).sum().backward(
        retain_graph=True)
    (gb * (100 + torch.arange(gb.shape[0], dtype=torch.float32))).sum().backward()
    rows = [r + 1 for r in range(SIZE)]
    assert ga.tolist() == [[float(r)] * 2 for r in range(SIZE) for _ in range(r + 1)]
    assert gb.tolist() == [10.0 * r for r in range(SIZE) for _ in range(2)]
    assert [s.tolist() for s in small] == [list(range(SIZE))] * 3
    # Every rank's upstream gradients are the same, so their average is themselves: rank r
    # gets the weights of its own rows.
    start = sum(rows[:RANK])
    assert a.grad.tolist() == [[float(start + i)] * 2 for i in range(RANK + 1)]
    assert b.grad.tolist() == [100.0 + 2 * RANK, 101.0 + 2 * RANK]


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_hvd_grouped_reducescatter_and_its_gradient(op):
    # Rank r gives x_r[i, j] = (r + 1) * (i + 1) over 2 * SIZE + 1 rows (uneven: rank 0 gets
    # one more row), and a second tensor of SIZE rows of 5 (r + 1).
    hop = hvd.Sum if op == "sum" else hvd.Average
    d0 = 2 * SIZE + 1
    x = (torch.arange(1, d0 + 1, dtype=torch.float64).unsqueeze(1) * (RANK + 1)).repeat(1, 2)
    x.requires_grad_()
    y = torch.full((SIZE,), 5.0 * (RANK + 1), requires_grad=True)
    rx, ry = hvd.grouped_reducescatter([x, y], op=hop)
    (rx.sum() + 2 * ry.sum()).backward()
    single = hvd.reducescatter(torch.full((SIZE, 1), float(RANK)), op=hvd.Sum,
                               prescale_factor=2.0, postscale_factor=0.5)
    tri = SIZE * (SIZE + 1) / 2
    scale = tri if op == "sum" else tri / SIZE
    mine = 2 + (1 if RANK == 0 else 0)
    first = 0 if RANK == 0 else 3 + 2 * (RANK - 1)
    want_x = torch.tensor([[scale * (first + i + 1)] * 2 for i in range(mine)],
                          dtype=torch.float64)
    torch.testing.assert_close(rx.detach(), want_x)
    assert ry.tolist() == pytest.approx([5 * scale])
    # As Horovod: the allgather of the upstream gradients (1 and 2 everywhere), times SIZE for
    # Sum.
    factor = SIZE if op == "sum" else 1
    torch.testing.assert_close(x.grad, torch.full((d0, 2), float(factor), dtype=torch.float64))
    assert y.grad.tolist() == pytest.approx([2.0 * factor] * SIZE)
    assert single.tolist() == [[float(SIZE * (SIZE - 1) / 2)]]


def _sparse_of_rank(r):
    # Rank r's (SIZE + 2, 3) sparse tensor: row r and row SIZE + 1 hold r + 1 (the last row is
    # shared by every rank, so the result has duplicates to add up).
    idx = torch.tensor([[r, r, SIZE + 1], [0, 2, 1]])
    return torch.sparse_coo_tensor(idx, torch.full((3,), float(r + 1)), (SIZE + 2, 3))


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_hvd_sparse_allreduce_gathers_every_ranks_entries(op):
    hop = hvd.Sum if op == "sum" else hvd.Average
    fn = hvd.sparse_allreduce_async(_sparse_of_rank(RANK), name="sparse." + op, op=hop)
    via_allreduce = hvd.allreduce(_sparse_of_rank(RANK), op=hop)
    got = fn()
    want = sum(_sparse_of_rank(r).to_dense() for r in range(SIZE))
    if op == "avg":
        want = want / SIZE
    assert got.is_sparse and got.shape == (SIZE + 2, 3)
    assert got._nnz() == 3 * SIZE  # every rank's entries, duplicates not yet added
    torch.testing.assert_close(got.to_dense(), want)
    torch.testing.assert_close(via_allreduce.to_dense(), want)


def test_hvd_distributed_optimizer_reduces_parameters_a_rank_did_not_use():
    # Even ranks use only a, odd ranks only b (y = a.x or b.x, x = (1, 2) * (r + 1)): each
    # rank's unused parameter is reduced as a zero gradient, so no rank waits for it.
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 1, bias=False),
                                 "b": torch.nn.Linear(2, 1, bias=False)})
    with torch.no_grad():
        model["a"].weight.fill_(1.0)
        model["b"].weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    x = torch.tensor([[1.0, 2.0]]) * (RANK + 1)
    model["a" if RANK % 2 == 0 else "b"](x).sum().backward()
    opt.step()
    ga = sum(r + 1 for r in range(SIZE) if r % 2 == 0) / SIZE
    gb = sum(r + 1 for r in range(SIZE) if r % 2 == 1) / SIZE
    assert model["a"].weight.detach().reshape(-1).tolist() == pytest.approx(
        [1 - ga, 1 - 2 * ga])
    assert model["b"].weight.detach().reshape(-1).tolist() == pytest.approx(
        [1 - gb, 1 - 2 * gb])


@pytest.mark.parametrize("as_dense", [False, True], ids=["sparse", "sparse_as_dense"])
def test_hvd_distributed_optimizer_sparse_gradients(as_dense):
    # Embedding(SIZE + 2, 2, sparse=True), weights 0; rank r looks up rows r and SIZE + 1: the
    # gradient of the sum counts the lookups, so row r gets 1 / SIZE and row SIZE + 1 gets 1.
    emb = torch.nn.Embedding(SIZE + 2, 2, sparse=True)
    with torch.no_grad():
        emb.weight.zero_()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=as_dense)
    emb(torch.tensor([RANK, SIZE + 1])).sum().backward()
    opt.synchronize()
    grad = emb.weight.grad
    with opt.skip_synchronize():
        opt.step()
    want = torch.zeros(SIZE + 2, 2)
    want[:SIZE] = 1.0 / SIZE
    want[SIZE + 1] = 1.0
    assert grad.is_sparse
    torch.testing.assert_close(grad.to_dense(), want)
    torch.testing.assert_close(emb.weight.detach(), -want)


def test_hvd_distributed_optimizer_names_and_the_step_after_synchronize_warning():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.0))
    names = sorted(opt._parameter_names.values())
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()  # synchronizes again, with a warning
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        with opt.skip_synchronize():
            opt.step()
    assert names == ["allreduce.noname.%d.%d" % (g, i) for g in range(2) for i in range(2)]
    assert [str(w.message)[:60] for w in caught] == [
        "optimizer.step() called without optimizer.skip_synchronize()"]
    assert not quiet


def test_hvd_broadcast_optimizer_state_creates_a_new_optimizers_state():
    # A fresh SGD with momentum has no state: as Horovod, it gets zero gradients and a local
    # step (momentum buffers of zeros) first; a parameter without requires_grad gets neither.
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    w = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([frozen, w], lr=0.5 * (RANK + 1), momentum=0.9),
        named_parameters=[("frozen", frozen), ("w", w)])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    lr = hvd.allgather(torch.tensor([opt.param_groups[0]["lr"]]))
    assert frozen.grad is None and w.grad.tolist() == [0.0] * 3
    assert opt.state[w]["momentum_buffer"].tolist() == [0.0] * 3
    assert frozen not in opt.state
    assert lr.tolist() == [0.5] * SIZE


# ---- process sets -------------------------------------------------------------------------

EVEN = [r for r in range(SIZE) if r % 2 == 0]
ODD = [r for r in range(SIZE) if r % 2 == 1]


def test_hvd_a_process_set_of_every_rank_is_the_global_one():
    with pytest.raises(ValueError, match="exists already"):
        hvd.add_process_set(list(range(SIZE)))
    with pytest.raises(ValueError, match="not a set of distinct ranks"):
        hvd.add_process_set([SIZE])
    g = hvd.global_process_set
    assert g.process_set_id == 0 and g.ranks == list(range(SIZE))
    assert g.size() == SIZE and g.rank() == RANK and g.included()
    assert hvd.remove_process_set(g) is False


@multi_rank
def test_hvd_process_sets_run_their_collectives_among_their_ranks():
    even, odd = hvd.add_process_set(EVEN), hvd.add_process_set(ODD)
    mine, other = (even, odd) if RANK % 2 == 0 else (odd, even)
    ranks, n, me = mine.ranks, mine.size(), mine.rank()
    s = hvd.allreduce(torch.full((3,), float(RANK + 1)), op=hvd.Sum, process_set=mine)
    avg = hvd.grouped_allreduce([torch.full((2,), float(RANK))], process_set=mine)[0]
    g = hvd.allgather(torch.full((RANK + 1, 2), float(RANK)), process_set=mine)
    b = hvd.broadcast(torch.full((2,), float(RANK)), root_rank=ranks[-1], process_set=mine)
    a, recv = hvd.alltoall(torch.arange(2.0 * n) + 100 * RANK, splits=[2] * n,
                           process_set=mine)
    rs = hvd.reducescatter(torch.ones(2 * n + 1, 2) * (RANK + 1), op=hvd.Sum,
                           process_set=mine)
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, process_set=mine).sum().backward()
    obj = hvd.broadcast_object({"from": RANK}, root_rank=ranks[0], process_set=mine)
    objs = hvd.allgather_object(RANK * 10, process_set=mine)
    hvd.barrier(process_set=mine)
    with pytest.raises(ValueError, match="is not in"):
        hvd.allreduce(torch.ones(1), process_set=other)
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum)  # the global set, still in step
    removed = [hvd.remove_process_set(odd), hvd.remove_process_set(even),
               hvd.remove_process_set(even)]
    with pytest.raises(ValueError, match="has not been added"):
        hvd.allreduce(torch.ones(1), process_set=mine)
    assert (n, ranks[me]) == (len(EVEN if RANK % 2 == 0 else ODD), RANK)
    assert s.tolist() == [float(sum(r + 1 for r in ranks))] * 3
    assert avg.tolist() == pytest.approx([sum(ranks) / n] * 2)
    assert g.tolist() == [[float(r)] * 2 for r in ranks for _ in range(r + 1)]
    assert b.tolist() == [float(ranks[-1])] * 2
    assert recv.tolist() == [2] * n
    assert a.tolist() == [100.0 * r + 2 * me + i for r in ranks for i in range(2)]
    rows = 2 + (1 if me == 0 else 0)
    assert rs.tolist() == [[float(sum(r + 1 for r in ranks))] * 2] * rows
    assert x.grad.tolist() == [float(n)] * 3
    assert obj == {"from": ranks[0]} and objs == [r * 10 for r in ranks]
    assert total.tolist() == [float(SIZE)]
    assert removed == [True, True, False]


@pytest.mark.skipif(SIZE < 3, reason="needs a process set of 2 ranks that is not every rank")
def test_hvd_process_set_ranks_that_make_different_calls_raise_on_every_rank():
    pair = hvd.add_process_set([0, 1])
    raised = None
    if RANK in (0, 1):
        try:
            hvd.allreduce(torch.ones(2 + RANK), process_set=pair)
        except RuntimeError as e:
            raised = str(e)
        after = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair)
        assert after.tolist() == [2.0]
    hvd.remove_process_set(pair)
    if RANK in (0, 1):
        assert raised is not None and "disagree on the shapes" in raised


@multi_rank
def test_hvd_distributed_optimizer_of_a_process_set():
    # Only the even ranks reduce (the average of their gradients, x = r + 1); an odd rank
    # steps on its own gradient.
    even = hvd.add_process_set(EVEN) if len(EVEN) < SIZE else hvd.global_process_set
    w = torch.nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   process_set=even)
    (w * float(RANK + 1)).sum().backward()
    opt.step()
    hvd.remove_process_set(even)
    want = -sum(r + 1 for r in EVEN) / len(EVEN) if RANK % 2 == 0 else -(RANK + 1)
    assert w.detach().tolist() == pytest.approx([want] * 2)


def test_hvd_a_name_is_taken_until_this_rank_has_seen_the_result():
    # Taken until synchronize() or a poll() that says True, whatever the other ranks' timing
    # (in a world of one rank the first call is done at once, but unseen); for a handle never
    # synchronized, until the call is done and another call was made since.
    h = hvd.allreduce_async(torch.ones(2), name="seen.a", op=hvd.Sum)
    with pytest.raises(ValueError, match="in flight on this rank"):
        hvd.allreduce_async(torch.ones(2), name="seen.a", op=hvd.Sum)
    first = hvd.synchronize(h)
    again = hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="seen.a", op=hvd.Sum))
    h = hvd.allreduce_async(torch.ones(1), name="seen.b", op=hvd.Sum)
    while not hvd.poll(h):
        time.sleep(0.001)
    polled = hvd.allreduce(torch.ones(1), name="seen.b", op=hvd.Sum)
    hvd.allreduce_async(torch.ones(1), name="seen.c", op=hvd.Sum)  # never synchronized
    later = hvd.allreduce(torch.ones(1), op=hvd.Sum)  # runs after seen.c on every rank
    dropped = hvd.allreduce(torch.ones(1), name="seen.c", op=hvd.Sum)
    assert first.tolist() == again.tolist() == [SIZE] * 2
    assert polled.tolist() == later.tolist() == dropped.tolist() == [SIZE]
