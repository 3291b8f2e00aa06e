"""What only the C++ "mtxcomm" backend (bindings/torch: c10d_group.cc, c10d_backend.cc) offers
of torch.distributed: a receive from any source (``dist.recv(t)`` without ``src``),
``monitored_barrier`` (naming the ranks that did not arrive, as Gloo's), ``split_group``, and the
group's ProcessGroup naming the backend "mtxcomm" (DDP's logging data). Every value is checked
against a closed form.

Run under mtxrun with 1, 2, 3 and 4 ranks (tests/python/run_suite.sh):
    mtxrun -np 3 python -m pytest -q -p no:cacheprovider tests/python/test_torch_c10d_group.py
"""

import datetime
import time

import pytest
from torch_common import RANK, SIZE, backend, multi_rank

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

_c10d = pytest.importorskip(
    "mtxcomm.torch._c10d",
    reason="the C++ backend was not built (no torch headers at install)",
)

SECONDS = datetime.timedelta


@pytest.fixture(scope="module", autouse=True)
def group(torch_group):
    if type(backend()) is not _c10d.MtxcommBackend:
        pytest.skip("the default group runs the Python backend (MTXCOMM_TORCH_BACKEND=python)")
    return torch_group


def value_of(rank, n=5):
    return torch.arange(n, dtype=torch.float32) + 100 * rank


# ---- the ProcessGroup names the backend ----------------------------------------------------


def test_the_group_and_ddp_logging_name_the_backend_mtxcomm():
    pg = dist.group.WORLD
    assert type(pg) is _c10d.ProcessGroup and isinstance(pg, dist.ProcessGroup)
    assert pg.name() == "mtxcomm" and dist.get_backend() == "mtxcomm"
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.ones(3, 4) * (RANK + 1)).sum().backward()
    assert ddp._get_ddp_logging_data()["backend_name"] == "mtxcomm"
    # the gradient is the mean over ranks: d/dW of sum(W x + b) with x = (rank + 1) * ones
    mean = sum(r + 1 for r in range(SIZE)) / SIZE
    assert torch.allclose(model.weight.grad, torch.full((2, 4), 3.0 * mean))


def test_a_group_with_another_devices_backend_keeps_pytorchs_process_group():
    g = dist.new_group(list(range(SIZE)), backend="cpu:mtxcomm,cuda:gloo")
    assert type(g) is not _c10d.ProcessGroup  # PyTorch's, holding both backends
    assert type(g._get_backend(torch.device("cpu"))) is _c10d.MtxcommBackend
    x = torch.ones(3)
    dist.all_reduce(x, group=g)
    assert x.tolist() == [float(SIZE)] * 3
    dist.destroy_process_group(g)


# ---- receive from any source ---------------------------------------------------------------


@multi_rank
@pytest.mark.parametrize("n", [5, 1 << 16], ids=["20B", "256KiB"])
def test_recv_from_any_source_takes_every_rank_once_and_names_it(n):
    if RANK == 0:
        seen = []
        for _ in range(SIZE - 1):
            t = torch.zeros(n)
            src = dist.recv(t, tag=4)
            assert torch.equal(t, value_of(src, n)), src
            seen.append(src)
        assert sorted(seen) == list(range(1, SIZE))
    else:
        dist.send(value_of(RANK, n), dst=0, tag=4)
    dist.barrier()


@multi_rank
def test_any_source_and_named_receives_take_messages_in_posting_order():
    if RANK == 1:
        for k in range(4):
            dist.send(torch.tensor([float(k)]), dst=0, tag=6)
    elif RANK == 0:
        got = [torch.full((1,), -1.0) for _ in range(4)]
        works = [
            dist.irecv(got[0], src=1, tag=6),
            dist.irecv(got[1], tag=6),
            dist.irecv(got[2], tag=6),
            dist.irecv(got[3], src=1, tag=6),
        ]
        for w in works:
            w.wait()
        assert [t.item() for t in got] == [0.0, 1.0, 2.0, 3.0]
        assert works[1]._source_rank() == 1 and works[2]._source_rank() == 1
    dist.barrier()


@multi_rank
def test_recv_from_any_source_on_a_subgroup_returns_the_global_rank():
    order = list(reversed(range(SIZE)))  # group rank 0 is the last global rank
    g = dist.new_group(order)
    if RANK == order[0]:
        seen = set()
        for _ in range(SIZE - 1):
            t = torch.zeros(5)
            src = dist.recv(t, group=g)
            assert torch.equal(t, value_of(src)), src
            seen.add(src)
        assert seen == set(order[1:])
    else:
        dist.send(value_of(RANK), dst=order[0], group=g)
    dist.barrier(group=g)
    dist.destroy_process_group(g)


# ---- monitored_barrier ---------------------------------------------------------------------


def test_monitored_barrier_passes_when_every_rank_calls_it():
    for wait_all in (False, True, False):
        dist.monitored_barrier(timeout=SECONDS(seconds=30), wait_all_ranks=wait_all)
    x = torch.ones(2)
    dist.all_reduce(x)  # the group goes on
    assert x.tolist() == [float(SIZE)] * 2


@multi_rank
@pytest.mark.parametrize("wait_all", [False, True], ids=["first", "wait_all_ranks"])
def test_monitored_barrier_names_the_ranks_that_did_not_arrive(wait_all):
    # A group of its own: the missing ranks' barriers stay out of step afterwards.
    g = dist.new_group(list(range(SIZE)))
    missing = [r for r in range(1, SIZE) if r % 2 == 1]  # every odd rank
    timeout = SECONDS(seconds=1.5)
    if RANK == 0:
        if wait_all:
            want = "Ranks %s failed to pass monitoredBarrier" % ", ".join(map(str, missing))
        else:
            want = "Rank %d failed to pass monitoredBarrier" % missing[0]
        with pytest.raises(RuntimeError, match=want):
            dist.monitored_barrier(group=g, timeout=timeout, wait_all_ranks=wait_all)
    elif RANK not in missing:
        with pytest.raises(
            RuntimeError, match="Rank %d successfully reached monitoredBarrier" % RANK
        ):
            dist.monitored_barrier(group=g, timeout=timeout, wait_all_ranks=wait_all)
    dist.barrier()  # the world's, not the group's
    dist.destroy_process_group(g)


def test_monitored_barrier_with_no_time_left_says_rank_0_timed_out():
    if SIZE == 1:
        dist.monitored_barrier(timeout=SECONDS(seconds=0))  # nobody to wait for
        return
    g = dist.new_group(list(range(SIZE)))
    if RANK == 0:
        with pytest.raises(RuntimeError, match="Rank 0 timed out in monitoredBarrier"):
            dist.monitored_barrier(group=g, timeout=SECONDS(seconds=0))
    dist.barrier()
    dist.destroy_process_group(g)


# ---- split_group ---------------------------------------------------------------------------


def test_split_group_into_halves_every_collective_against_closed_forms():
    half = (SIZE + 1) // 2
    parts = [list(range(half)), list(range(half, SIZE))] if SIZE > 1 else [[0]]
    g = dist.split_group(split_ranks=parts, timeout=SECONDS(seconds=60))
    mine = next(p for p in parts if RANK in p)
    assert dist.get_process_group_ranks(g) == mine
    assert dist.get_rank(g) == mine.index(RANK) and dist.get_world_size(g) == len(mine)
    x = torch.full((4,), float(RANK + 1))
    dist.all_reduce(x, group=g)
    assert x.tolist() == [float(sum(r + 1 for r in mine))] * 4
    out = torch.empty(len(mine), dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([RANK]), group=g)
    assert out.tolist() == mine
    y = torch.tensor([float(RANK)])
    dist.broadcast(y, src=mine[-1], group=g)
    assert y.item() == float(mine[-1])
    objs = [None] * len(mine)
    dist.all_gather_object(objs, {"rank": RANK}, group=g)  # a delegated collective
    assert objs == [{"rank": r} for r in mine]
    dist.destroy_process_group(g)


def test_split_group_leaves_out_the_ranks_of_no_part():
    g = dist.split_group(split_ranks=[[0]])
    if RANK == 0:
        x = torch.ones(1) * 7
        dist.all_reduce(x, group=g)
        assert x.item() == 7.0
        dist.destroy_process_group(g)
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER


# ---- direct_all_reduce ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "op,want",
    [
        (dist.ReduceOp.SUM, lambda vals: sum(vals)),
        (dist.ReduceOp.AVG, lambda vals: sum(vals) / len(vals)),
        (dist.ReduceOp.MAX, max),
        (dist.ReduceOp.MIN, min),
        (dist.ReduceOp.PRODUCT, lambda vals: float(torch.tensor(vals).prod())),
    ],
    ids=["sum", "avg", "max", "min", "product"],
)
@pytest.mark.parametrize("n", [3, 1 << 18], ids=["12B", "1MiB"])
def test_direct_all_reduce_every_op_against_closed_forms(op, want, n):
    from mtxcomm.torch import direct_all_reduce

    t = torch.full((n,), float(RANK + 2))
    assert direct_all_reduce(t, op=op) is t
    expected = want([float(r + 2) for r in range(SIZE)])
    assert bool((t == expected).all()), (t[:3], expected)


def test_direct_all_reduce_follows_the_calls_queued_before_it():
    from mtxcomm.torch import direct_all_reduce

    big = torch.ones(1 << 20)  # above the inline size: queued on the worker
    work = dist.all_reduce(big, async_op=True)
    small = torch.full((4,), float(RANK))
    direct_all_reduce(small)
    work.wait()
    assert small.tolist() == [float(sum(range(SIZE)))] * 4
    assert bool((big == float(SIZE)).all())


def test_direct_all_reduce_on_a_subgroup_and_its_errors():
    from mtxcomm.torch import direct_all_reduce

    g = dist.new_group(list(reversed(range(SIZE))))
    t = torch.tensor([float(RANK)], dtype=torch.float64)
    direct_all_reduce(t, group=g)
    assert t.item() == float(sum(range(SIZE)))
    with pytest.raises(ValueError, match="contiguous"):
        direct_all_reduce(torch.ones(4, 4).t(), group=g)
    with pytest.raises(ValueError, match="is not one of"):
        direct_all_reduce(torch.ones(1), op="sum", group=g)
    dist.destroy_process_group(g)


@multi_rank
def test_split_group_naming_a_rank_outside_the_parent_raises_on_its_members():
    parts = [[0], list(range(1, SIZE)) + [SIZE]]  # SIZE is no rank of the world
    if RANK == 0:
        g = dist.split_group(split_ranks=parts)
        x = torch.ones(1)
        dist.all_reduce(x, group=g)
        assert x.item() == 1.0
        dist.destroy_process_group(g)
    else:
        with pytest.raises(ValueError, match="ranks \\[%d\\] are not ranks of the parent" % SIZE):
            dist.split_group(split_ranks=parts)
    dist.barrier()


@multi_rank
def test_direct_all_reduce_on_a_group_this_rank_is_not_in_raises():
    from mtxcomm.torch import direct_all_reduce

    g = dist.new_group([0])
    t = torch.ones(2)
    if RANK == 0:
        direct_all_reduce(t, group=g)
        assert t.tolist() == [1.0, 1.0]
        dist.destroy_process_group(g)
    else:
        with pytest.raises(ValueError, match="not a process group of this rank"):
            direct_all_reduce(t, group=g)
    dist.barrier()


# ---- asynchronous calls never block; a disagreement is not lost at the end -------------------


@multi_rank
@pytest.mark.parametrize("n", [4, 100000])  # inline-sized, and the worker's
def test_async_calls_on_two_groups_issued_in_other_orders_by_the_ranks_complete(n):
    # Each group is used in one order on every rank (what torch asks), but rank 0 issues g1's
    # call first and the others g2's: a small async call that blocked its caller until the
    # peers came would wait for a call its peer makes only after its own blocked one.
    g1 = dist.new_group(list(range(SIZE)), timeout=SECONDS(seconds=20))
    g2 = dist.new_group(list(range(SIZE)), timeout=SECONDS(seconds=20))
    a = torch.full((n,), float(RANK + 1))
    b = torch.full((n,), float(10 * (RANK + 1)))
    if RANK == 0:
        works = [dist.all_reduce(a, group=g1, async_op=True)]
        works.append(dist.all_reduce(b, group=g2, async_op=True))
    else:
        works = [dist.all_reduce(b, group=g2, async_op=True)]
        works.append(dist.all_reduce(a, group=g1, async_op=True))
    for w in works:
        w.wait()
    total = SIZE * (SIZE + 1) / 2
    assert torch.equal(a, torch.full((n,), total))
    assert torch.equal(b, torch.full((n,), 10 * total))
    dist.destroy_process_group(g1)
    dist.destroy_process_group(g2)


@multi_rank
def test_a_receive_from_any_source_that_nobody_answers_times_out_at_the_groups_timeout():
    # dist.recv waits with no timeout of its own: the group's bounds it (it waited forever).
    g = dist.new_group(list(range(SIZE)), timeout=SECONDS(seconds=2))
    if RANK == 0:
        start = time.monotonic()
        with pytest.raises(dist.DistBackendError, match="timed out"):
            dist.recv(torch.empty(3), group=g)
        assert 1.5 < time.monotonic() - start < 30
    dist.barrier()
    dist.destroy_process_group(g)


@multi_rank
def test_destroying_a_group_after_a_broadcast_with_disagreeing_roots_raises_on_every_rank():
    # Every rank names itself the root: each returns at once (a root waits for nobody), and with
    # no later call on the group the disagreement is found when the group is destroyed.
    g = dist.new_group(list(range(SIZE)))
    dist.barrier()  # every rank has made g (a failed destroy tells the peers that are in it)
    t = torch.full((3,), float(RANK))
    dist.broadcast(t, src=RANK, group=g)
    # This rank's own finding, or a peer's that found it first and told it.
    with pytest.raises(RuntimeError, match="the ranks disagree on the call") as e:
        dist.destroy_process_group(g)
    assert "found when this rank destroyed the communicator" in str(e.value)
    assert "broadcast(count 3, float32, root" in str(e.value)
    dist.barrier()
