"""The Horovod-style mtxcomm.torch (``import mtxcomm.torch as hvd``) on every rank: the facts,
every collective with its gradient, names, handles and poll, join, the optimizer, sparse
tensors, integer scaling, process sets. Run as test_torch.py (tests/python/run_suite.sh), under
mtxrun with 1, 2 and 3 ranks; every rank runs every test in the same order.
"""

import math
import time

import pytest

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed (scripts/setup_python.sh "
    "installs it; --no-torch leaves it out)",
)

from torch_common import (  # noqa: E402,F401
    RANK,
    SIZE,
    multi_rank,
)

import mtxcomm.torch as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def group(torch_group):
    """The default process group over "mtxcomm" (conftest.torch_group: once per session)."""
    return torch_group


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
    scaled = hvd.allreduce(
        torch.ones(3, dtype=torch.int32), op=hvd.Sum, prescale_factor=2, postscale_factor=3
    )
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
    handles = {
        n: hvd.allreduce_async(torch.full((3,), float(i)), name=n, op=hvd.Sum)
        for n, i in zip(order, range(6))
        for _ in [0]
    }
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
        assert g[start : start + r + 1].tolist() == [[float(r)] * 2] * (r + 1)
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
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
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
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=2,
    )
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
    for what, call in (
        ("allreduce", lambda t: hvd.allreduce(t, op=hvd.Sum)),
        ("broadcast", lambda t: hvd.broadcast(t, root_rank=0)),
        ("reducescatter", lambda t: hvd.reducescatter(t, op=hvd.Sum)),
    ):
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
@pytest.mark.parametrize(
    "kind", ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
)
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
    want = {
        "allreduce": [[SIZE] * 2] * 2 * SIZE,
        "allgather": [[1.0] * 2] * 2 * SIZE * SIZE,
        "broadcast": [[1.0] * 2] * 2 * SIZE,
        "alltoall": [[1.0] * 2] * 2 * SIZE,
        "reducescatter": [[SIZE] * 2] * 2,
    }[kind]
    for r in (r1, r2, r3):
        r = r[0] if kind == "alltoall" else r
        assert r.tolist() == want


@multi_rank
@pytest.mark.parametrize(
    "kind", ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
)
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
        calls = (
            ("allgather", lambda: hvd.allgather(torch.ones(2, 3), name="j.ag")),
            ("grouped_allgather", lambda: hvd.grouped_allgather([torch.ones(2)] * 2, name="j.gag")),
            ("broadcast", lambda: hvd.broadcast(torch.ones(3), RANK, name="j.bc")),
            ("alltoall", lambda: hvd.alltoall(torch.ones(SIZE, 2), name="j.a2a")),
            ("reducescatter", lambda: hvd.reducescatter(torch.ones(SIZE, 2), name="j.rs")),
        )
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
        assert raised == [
            (w, True)
            for w in ("allgather", "grouped_allgather", "broadcast", "alltoall", "reducescatter")
        ]


def test_hvd_grouped_allreduce_in_place_and_its_gradient():
    ts = [torch.full((3,), float(RANK + 1)), torch.arange(4, dtype=torch.float64) * (RANK + 1)]
    same = hvd.grouped_allreduce_(ts, op=hvd.Sum)
    h = hvd.grouped_allreduce_async_([torch.full((2,), RANK, dtype=torch.int32)], op=hvd.Max)
    ints = hvd.synchronize(h)
    xs = [
        torch.full((2,), float(RANK), requires_grad=True),
        torch.full((3,), 2.0 * RANK, requires_grad=True),
    ]
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
        retain_graph=True
    )
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
    single = hvd.reducescatter(
        torch.full((SIZE, 1), float(RANK)), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5
    )
    tri = SIZE * (SIZE + 1) / 2
    scale = tri if op == "sum" else tri / SIZE
    mine = 2 + (1 if RANK == 0 else 0)
    first = 0 if RANK == 0 else 3 + 2 * (RANK - 1)
    want_x = torch.tensor([[scale * (first + i + 1)] * 2 for i in range(mine)], dtype=torch.float64)
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
    model = torch.nn.ModuleDict(
        {"a": torch.nn.Linear(2, 1, bias=False), "b": torch.nn.Linear(2, 1, bias=False)}
    )
    with torch.no_grad():
        model["a"].weight.fill_(1.0)
        model["b"].weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters()
    )
    x = torch.tensor([[1.0, 2.0]]) * (RANK + 1)
    model["a" if RANK % 2 == 0 else "b"](x).sum().backward()
    opt.step()
    ga = sum(r + 1 for r in range(SIZE) if r % 2 == 0) / SIZE
    gb = sum(r + 1 for r in range(SIZE) if r % 2 == 1) / SIZE
    assert model["a"].weight.detach().reshape(-1).tolist() == pytest.approx([1 - ga, 1 - 2 * ga])
    assert model["b"].weight.detach().reshape(-1).tolist() == pytest.approx([1 - gb, 1 - 2 * gb])


@pytest.mark.parametrize("as_dense", [False, True], ids=["sparse", "sparse_as_dense"])
def test_hvd_distributed_optimizer_sparse_gradients(as_dense):
    # Embedding(SIZE + 2, 2, sparse=True), weights 0; rank r looks up rows r and SIZE + 1: the
    # gradient of the sum counts the lookups, so row r gets 1 / SIZE and row SIZE + 1 gets 1.
    emb = torch.nn.Embedding(SIZE + 2, 2, sparse=True)
    with torch.no_grad():
        emb.weight.zero_()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=1.0),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=as_dense,
    )
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
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(
            [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.0
        )
    )
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
        "optimizer.step() called without optimizer.skip_synchronize()"
    ]
    assert not quiet


def test_hvd_broadcast_optimizer_state_creates_a_new_optimizers_state():
    # A fresh SGD with momentum has no state: as Horovod, it gets zero gradients and a local
    # step (momentum buffers of zeros) first; a parameter without requires_grad gets neither.
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    w = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([frozen, w], lr=0.5 * (RANK + 1), momentum=0.9),
        named_parameters=[("frozen", frozen), ("w", w)],
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    lr = hvd.allgather(torch.tensor([opt.param_groups[0]["lr"]]))
    assert frozen.grad is None and w.grad.tolist() == [0.0] * 3
    assert opt.state[w]["momentum_buffer"].tolist() == [0.0] * 3
    assert frozen not in opt.state
    assert lr.tolist() == [0.5] * SIZE
