"""Horovod's process sets in mtxcomm.torch (``hvd.add_process_set``, ``process_set=``) on every
rank: a set of every rank is the global one, collectives among a set's ranks, ranks that make
different calls, DistributedOptimizer of a set, names. Run as test_torch.py
(tests/python/run_suite.sh), under mtxrun with 1, 2 and 3 ranks.
"""

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
    a, recv = hvd.alltoall(torch.arange(2.0 * n) + 100 * RANK, splits=[2] * n, process_set=mine)
    rs = hvd.reducescatter(torch.ones(2 * n + 1, 2) * (RANK + 1), op=hvd.Sum, process_set=mine)
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, process_set=mine).sum().backward()
    obj = hvd.broadcast_object({"from": RANK}, root_rank=ranks[0], process_set=mine)
    objs = hvd.allgather_object(RANK * 10, process_set=mine)
    hvd.barrier(process_set=mine)
    with pytest.raises(ValueError, match="is not in"):
        hvd.allreduce(torch.ones(1), process_set=other)
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum)  # the global set, still in step
    removed = [
        hvd.remove_process_set(odd),
        hvd.remove_process_set(even),
        hvd.remove_process_set(even),
    ]
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
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)], process_set=even
    )
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
