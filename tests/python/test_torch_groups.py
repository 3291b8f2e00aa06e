"""Process groups of the "mtxcomm" backend other than the world: ``new_group`` of a subset,
``new_subgroups``, overlapping groups used alternately, ``DeviceMesh`` dimensions; every
collective on them against closed forms; ranks that make different calls. Run as test_torch.py
(tests/python/run_suite.sh), under mtxrun with 1, 2 and 3 ranks (test_torch_jobs.py runs 4).
"""

import pytest

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed (scripts/setup_python.sh "
    "installs it; --no-torch leaves it out)",
)

import torch.distributed as dist  # noqa: E402
from torch_common import RANK, SIZE, multi_rank  # noqa: E402

import mtxcomm  # noqa: E402
import mtxcomm.torch  # noqa: E402,F401
from mtxcomm.torch.backend import python_backend  # noqa: E402

# Every rank but 0 (at np=1: rank 0, the world again), and the ranks in reverse order.
TAIL = list(range(1, SIZE)) or [0]


@pytest.fixture(scope="module", autouse=True)
def group(torch_group):
    return torch_group


@pytest.fixture(scope="module")
def tail():
    """new_group(TAIL): collective over the world, a group on TAIL's ranks only."""
    return dist.new_group(TAIL)


def test_a_subset_group_is_its_ranks_only(tail):
    if RANK not in TAIL:
        assert tail == dist.GroupMember.NON_GROUP_MEMBER
        return
    assert dist.get_world_size(tail) == len(TAIL)
    assert dist.get_rank(tail) == TAIL.index(RANK)
    assert dist.get_backend(tail) == "mtxcomm"


@pytest.mark.parametrize("op", ["sum", "max", "min", "avg", "prod"])
def test_all_reduce_on_a_subset(tail, op):
    if RANK not in TAIL:
        return
    x = torch.arange(6, dtype=torch.float64) + RANK
    dist.all_reduce(
        x, op=getattr(dist.ReduceOp, op.upper() if op != "prod" else "PRODUCT"), group=tail
    )
    cols = torch.stack([torch.arange(6, dtype=torch.float64) + r for r in TAIL])
    want = {
        "sum": cols.sum(0),
        "max": cols.max(0).values,
        "min": cols.min(0).values,
        "avg": cols.mean(0),
        "prod": cols.prod(0),
    }[op]
    torch.testing.assert_close(x, want)


def test_int_all_reduce_and_every_other_collective_on_a_subset(tail):
    if RANK not in TAIL:
        return
    n, me = len(TAIL), TAIL.index(RANK)
    x = torch.full((3,), RANK + 1, dtype=torch.int32)
    dist.all_reduce(x, group=tail)
    assert x.tolist() == [sum(r + 1 for r in TAIL)] * 3

    # broadcast from the group's last rank (a global rank as src)
    y = torch.arange(5) * (RANK + 1)
    dist.broadcast(y, src=TAIL[-1], group=tail)
    assert y.tolist() == (torch.arange(5) * (TAIL[-1] + 1)).tolist()

    # reduce to the group's first rank
    z = torch.full((2,), float(RANK))
    dist.reduce(z, dst=TAIL[0], group=tail)
    assert z.tolist() == ([float(sum(TAIL))] * 2 if RANK == TAIL[0] else [float(RANK)] * 2)

    # all_gather, all_gather_into_tensor
    outs = [torch.zeros(2, dtype=torch.int64) for _ in TAIL]
    dist.all_gather(outs, torch.tensor([RANK, -RANK]), group=tail)
    assert [o.tolist() for o in outs] == [[r, -r] for r in TAIL]
    flat = torch.empty(2 * n)
    dist.all_gather_into_tensor(flat, torch.tensor([RANK, 0.5]), group=tail)
    assert flat.view(n, 2)[:, 0].tolist() == [float(r) for r in TAIL]

    # reduce_scatter_tensor: block j of rank r is r*10 + j
    inp = torch.tensor([RANK * 10.0 + j for j in range(n) for _ in range(3)])
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, inp, group=tail)
    assert out.tolist() == [float(sum(r * 10 + me for r in TAIL))] * 3

    # all_to_all_single, even and with split sizes
    send = torch.tensor([RANK * 100 + j for j in range(n)], dtype=torch.int64)
    recv = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(recv, send, group=tail)
    assert recv.tolist() == [r * 100 + me for r in TAIL]
    # group rank i sends i + 1 rows to every rank: rank me receives i + 1 rows from each i
    rows = me + 1
    send = torch.full((rows * n,), RANK, dtype=torch.int64)
    recv = torch.empty(sum(i + 1 for i in range(n)), dtype=torch.int64)
    dist.all_to_all_single(recv, send, [i + 1 for i in range(n)], [rows] * n, group=tail)
    want = [r for i, r in enumerate(TAIL) for _ in range(i + 1)]
    assert recv.tolist() == want

    # gather, scatter to / from the group's last rank
    root = TAIL[-1]
    got = [torch.zeros(1) for _ in TAIL] if RANK == root else None
    dist.gather(torch.tensor([float(RANK)]), got, dst=root, group=tail)
    if RANK == root:
        assert [g.item() for g in got] == [float(r) for r in TAIL]
    piece = torch.zeros(2)
    parts = [torch.full((2,), float(i)) for i in range(n)] if RANK == root else None
    dist.scatter(piece, parts, src=root, group=tail)
    assert piece.tolist() == [float(me)] * 2

    dist.barrier(group=tail)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": RANK}, group=tail)
    assert objs == [{"rank": r} for r in TAIL]


@multi_rank
def test_ranks_making_different_calls_on_a_subset_raise_on_every_member(tail):
    world = dist.group.WORLD._get_backend(torch.device("cpu"))
    cpp = type(world).__module__ == "mtxcomm.torch._c10d"
    # The C++ backend: no negotiation; the library's check names both calls and the group's
    # communicator is then failed (as an NCCL one would be): a group of its own (new_group is
    # collective over the world: every rank makes it).
    fresh = dist.new_group(TAIL) if cpp else None
    if RANK not in TAIL or len(TAIL) < 2:
        return
    t = torch.ones(3 + (RANK == TAIL[0]))
    if cpp:
        with pytest.raises(RuntimeError, match="disagree on the call"):
            dist.all_reduce(t, group=fresh)
        dist.destroy_process_group(fresh)
        return
    with pytest.raises(mtxcomm.InvalidUsageError, match="disagree on the shapes"):
        dist.all_reduce(t, group=tail)
    t = torch.ones(4)
    dist.all_reduce(t, group=tail)  # the next call works
    assert t.tolist() == [float(len(TAIL))] * 4


def test_new_subgroups_of_every_shape():
    for per in [d for d in range(1, SIZE + 1) if SIZE % d == 0]:
        mine, _ = dist.new_subgroups(per)
        first = RANK - RANK % per
        x = torch.tensor([float(RANK)])
        dist.all_reduce(x, group=mine)
        assert x.item() == float(sum(range(first, first + per))), per


@multi_rank
def test_overlapping_groups_used_alternately():
    # Every pair of neighbours (at np=2 the world twice), used in turn.
    pairs = [sorted({i, (i + 1) % SIZE}) for i in range(SIZE)]
    groups = [dist.new_group(p) for p in pairs]
    for step in range(4):
        for p, g in zip(pairs, groups):
            if RANK in p:
                t = torch.full((4,), float(step + RANK))
                dist.all_reduce(t, group=g)
                assert t.tolist() == [float(sum(step + r for r in p))] * 4


def test_a_group_of_the_whole_world_shares_the_engine():
    g = dist.new_group(list(range(SIZE)))
    assert dist.get_backend(g) == "mtxcomm"
    # The Python backend (the C++ one's fallback) on the engine, not a communicator of its own.
    be = python_backend(g._get_backend(torch.device("cpu")))
    assert be._comm is None
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    assert t.tolist() == [float(SIZE)] * 2


def test_destroying_a_subset_group_frees_its_communicator():
    g = dist.new_group(TAIL)
    if RANK in TAIL:
        be = python_backend(g._get_backend(torch.device("cpu")))
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        comm = be._comm
        dist.destroy_process_group(g)
        if comm is not None:
            assert comm._comm is None
    # Rank 0 hosts the c10d store the group's members still use (the C++ backend bootstraps
    # its communicator through it): it ends the session only after them.
    dist.barrier()
