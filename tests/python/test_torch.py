"""The "mtxcomm" torch.distributed backend and the Horovod-style mtxcomm.torch, on every rank.

Run under mtxrun (which gives torch.distributed's env:// its MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) with 1, 2 and 3 ranks (tests/python/run_suite.sh):
    mtxrun -np 3 python -m pytest -q -p no:cacheprovider tests/python/test_torch.py
Every collective × dtype × op against closed-form values (conftest.expected_reduce), async Work
and futures, errors. Every rank runs every test in the same order; a test's collectives come
before its asserts. test_torch_jobs.py has the multi-process jobs (DDP, torchrun, killed ranks).
"""

import os
import time

import numpy as np
import pytest
from conftest import values

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed (scripts/setup_python.sh "
    "installs it; --no-torch leaves it out)",
)
import torch.distributed as dist  # noqa: E402
from torch_common import (  # noqa: E402,F401
    DTYPES,
    IDS,
    OPS,
    RANK,
    SIZE,
    as_np,
    backend,
    check,
    multi_rank,
    np_dtype,
    tensor_of,
    want_reduce,
)

import mtxcomm.torch as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def group(torch_group):
    """The default process group over "mtxcomm" (conftest.torch_group: once per session)."""
    return torch_group


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


@pytest.mark.parametrize(
    "dt", [torch.float32, torch.int64, torch.bfloat16], ids=["float32", "int64", "bfloat16"]
)
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
    ts = [
        tensor_of((5,), torch.float32, RANK),
        tensor_of((7, 2), torch.float32, RANK, 2),
        tensor_of((3,), torch.float32, RANK, 1),
    ]
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
        np.testing.assert_array_equal(as_np(flat[2 * r : 2 * r + 2]).astype(np.float64), want)


@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_reduce_scatter(dt, op):
    if dt == torch.bool and op == "avg":
        with pytest.raises(RuntimeError, match="avg is not defined for datatype bool"):
            dist.reduce_scatter_tensor(
                torch.empty(4, dtype=dt), tensor_of((SIZE, 4), dt, RANK), op=OPS[op]
            )
        return
    full = tensor_of((SIZE, 4), dt, RANK)
    out = torch.empty(4, dtype=dt)
    dist.reduce_scatter_tensor(out, full, op=OPS[op])
    listed = torch.empty((2,), dtype=dt)
    dist.reduce_scatter(
        listed, [tensor_of((2,), dt, RANK, offset=j) for j in range(SIZE)], op=OPS[op]
    )
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
        2 * SIZE, 3
    )
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
        np.testing.assert_array_equal(as_np(out[2 * src : 2 * src + 2]).astype(np.float64), want)
        want = values((RANK + 1, 2), np_dtype(dt), src, offset=RANK).astype(np.float64)
        block = got[(RANK + 1) * src : (RANK + 1) * (src + 1)]
        np.testing.assert_array_equal(as_np(block).astype(np.float64), want)
        want = values((3,), np_dtype(dt), src, offset=RANK).astype(np.float64)
        np.testing.assert_array_equal(as_np(outs[src]).astype(np.float64), want)


@pytest.mark.parametrize(
    "dt",
    [torch.uint8, torch.int64, torch.bfloat16, torch.float32, torch.bool],
    ids=["uint8", "int64", "bfloat16", "float32", "bool"],
)
def test_gather_and_scatter_at_every_root(dt):
    gathered, scattered = [], []
    for root in range(SIZE):
        gl = [torch.empty((2, 3), dtype=dt) for _ in range(SIZE)] if RANK == root else None
        dist.gather(tensor_of((2, 3), dt, RANK, offset=root), gl, dst=root)
        gathered.append(gl)
        out = torch.empty((4,), dtype=dt)
        sl = [tensor_of((4,), dt, root, offset=j) for j in range(SIZE)] if RANK == root else None
        dist.scatter(out, sl, src=root)
        scattered.append(out)
    for root in range(SIZE):
        if RANK == root:
            for src in range(SIZE):
                np.testing.assert_array_equal(
                    as_np(gathered[root][src]), values((2, 3), np_dtype(dt), src, offset=root)
                )
        else:
            assert gathered[root] is None
        np.testing.assert_array_equal(
            as_np(scattered[root]), values((4,), np_dtype(dt), root, offset=RANK)
        )


def test_gather_object_and_scatter_object_list():
    # Both are PyTorch's own functions over the backend's gather and scatter (and allgather).
    objs = [None] * SIZE if RANK == SIZE - 1 else None
    dist.gather_object({"rank": RANK, "text": "x" * (100 * RANK)}, objs, dst=SIZE - 1)
    got = [None]
    dist.scatter_object_list(
        got, [("row", i, [i] * i) for i in range(SIZE)] if RANK == 0 else None, src=0
    )
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
    own.wait()  # asyncOp (True by default): the C++ backend's worker runs it
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
    dist.all_to_all(
        a2a_out, [torch.full((2,), float(RANK * 10 + j)) for j in range(SIZE)], async_op=True
    )
    dist.barrier()
    assert _eventually(
        lambda: all(g.tolist() == [float(r)] * 3 for r, g in enumerate(gathered))
        and all(o.tolist() == [float(r * 10 + RANK)] * 2 for r, o in enumerate(a2a_out))
    ), (gathered, a2a_out)


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
        with pytest.raises(
            ValueError, match="this rank's output tensor has 999 elements but its input 1000"
        ):
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


def _cpp_backend():
    """Whether the default group runs the C++ backend (mtxcomm.torch._c10d)."""
    return type(backend()).__module__ == "mtxcomm.torch._c10d"


@multi_rank
def test_one_rank_refusing_its_arguments_keeps_the_ranks_in_step():
    if _cpp_backend():
        return _one_rank_refusing_its_arguments_on_the_cpp_backend()
    # Only the last rank passes a bad root: it raises its own ValueError, the others' broadcast
    # fails at once (not after the timeout), and the next call pairs with the next everywhere.
    root = 99 if RANK == SIZE - 1 else 0
    if RANK == SIZE - 1:
        with pytest.raises(ValueError, match="root 99 is not a rank"):
            backend().broadcast([torch.ones(3)], _bcast_opts(root))
    else:
        with pytest.raises(
            RuntimeError,
            match="disagree on the collective: .*rank %d has a "
            "call it refused before sending anything" % (SIZE - 1),
        ):
            backend().broadcast([torch.ones(3)], _bcast_opts(root)).wait()
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [SIZE] * 4


def _one_rank_refusing_its_arguments_on_the_cpp_backend():
    # No negotiation (c10d's same-order rule): the refusing rank raises its ValueError at once;
    # the library finds the disagreement over shared memory, the others get it in this call or
    # their next one (a broadcast's root and readers wait for nobody), and the group's
    # communicator is failed, as an NCCL one would be. A group of its own, so the default one
    # stays usable.
    g = dist.new_group(list(range(SIZE)))
    be = g._get_backend(torch.device("cpu"))
    root = 99 if RANK == SIZE - 1 else 0
    if RANK == SIZE - 1:
        with pytest.raises(ValueError, match="root 99 is not a rank"):
            be.broadcast([torch.ones(3)], _bcast_opts(root))
    else:
        try:
            be.broadcast([torch.ones(3)], _bcast_opts(root)).wait()
        except RuntimeError as e:
            assert "root 99" in str(e), str(e)
    with pytest.raises(RuntimeError, match="root 99"):
        dist.all_reduce(torch.ones(4), group=g)
    dist.destroy_process_group(g)
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
    if not _cpp_backend():
        # A receive from any source is the C++ backend's (test_torch_c10d_group.py); PyTorch
        # reaches it only through C++, so the Python backend cannot offer it.
        with pytest.raises((RuntimeError, NotImplementedError), match="(?i)recvAnysource"):
            dist.recv(torch.empty(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="complex|not defined"):
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match="root 99 is not a rank|99"):
        hvd.broadcast_(torch.ones(2), 99)
    # The group still works.
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [SIZE] * 2


def test_non_cpu_tensor_is_refused():
    from mtxcomm import _core

    if torch.cuda.is_available() and _cpp_backend() and _core.build_feature("cuda"):
        t = torch.ones(2, device="cuda")  # the C++ backend over a CUDA libmtxcomm serves it
        dist.all_reduce(t)
        assert t.tolist() == [SIZE] * 2
    elif torch.cuda.is_available():
        with pytest.raises((RuntimeError, ValueError), match="(?i)cuda"):
            dist.all_reduce(torch.ones(2, device="cuda"))
    else:
        print("no CUDA device: the backend's refusal is checked with a 'meta' tensor")
    with pytest.raises(
        ValueError,
        match="a tensor on meta; this \\(Python\\) backend runs torch collectives on "
        "CPU tensors .*cpu:mtxcomm,cuda:nccl",
    ):
        backend().allreduce([torch.ones(2, device="meta")], dist.AllreduceOptions())
    ok = torch.ones(1)
    dist.all_reduce(ok)
    assert ok.item() == SIZE


@multi_rank
def test_mismatched_shapes_raise_on_every_rank():
    t = torch.ones(3 + (RANK == 0), dtype=torch.float32)
    if _cpp_backend():
        # The library's check (over shared memory) names both calls; the group's communicator
        # is then failed (no negotiation): a group of its own.
        g = dist.new_group(list(range(SIZE)))
        with pytest.raises(RuntimeError, match="disagree on the call") as e:
            dist.all_reduce(t, group=g)
        assert "count 4" in str(e.value) and "count 3" in str(e.value), str(e.value)
        dist.destroy_process_group(g)
    else:
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
        one = dist.new_group([0])  # a group of its own (test_torch_groups.py: the others)
        if RANK == 0:
            t = torch.full((2,), 5.0)
            dist.all_reduce(t, group=one)
            assert t.tolist() == [5.0, 5.0]
        else:
            assert one == dist.GroupMember.NON_GROUP_MEMBER


@pytest.mark.parametrize("dense_dims", [0, 1], ids=["scalar-values", "row-values"])
def test_sparse_all_reduce_sums_every_rank_s_entries(dense_dims):
    # Rank r holds entries at rows r and r + 1 (values r + 1), so neighbours overlap.
    shape = (SIZE + 2,) + ((3,) * dense_dims)
    idx = torch.tensor([[RANK, RANK + 1]])
    vals = torch.full((2,) + ((3,) * dense_dims), float(RANK + 1))
    t = torch.sparse_coo_tensor(idx, vals, shape)
    dist.all_reduce(t)
    want = torch.zeros(shape)
    for r in range(SIZE):
        want[r] += r + 1
        want[r + 1] += r + 1
    assert t.is_sparse
    torch.testing.assert_close(t.to_dense(), want)
    with pytest.raises(ValueError, match="SUM only"):
        dist.all_reduce(torch.sparse_coo_tensor(idx, vals, shape), op=dist.ReduceOp.MAX)
    x = torch.ones(2)
    dist.all_reduce(x)  # the group goes on
    assert x.tolist() == [float(SIZE)] * 2
