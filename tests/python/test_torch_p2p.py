"""Point-to-point of the "mtxcomm" backend: send/recv, isend/irecv, batch_isend_irecv, on the
world and on a subgroup, against closed forms; ordering per (peer, tag); the exchange in which
both ranks post their receive first, at 8 B and 16 MiB; a size mismatch; a 2-stage pipeline
whose loss and gradients equal one process's. Run as test_torch.py (tests/python/run_suite.sh),
under mtxrun with 1, 2 and 3 ranks (a killed rank: test_torch_jobs.py).
"""

import pytest

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed (scripts/setup_python.sh "
    "installs it; --no-torch leaves it out)",
)

import torch.distributed as dist  # noqa: E402
from torch_common import DTYPES, IDS, RANK, SIZE, multi_rank  # noqa: E402

import mtxcomm  # noqa: E402
import mtxcomm.torch  # noqa: E402,F401

NEXT, PREV = (RANK + 1) % SIZE, (RANK - 1) % SIZE


@pytest.fixture(scope="module", autouse=True)
def group(torch_group):
    return torch_group


def ramp(n, dtype, rank, offset=0):
    """Rank's message: small values exact in every dtype."""
    x = (torch.arange(n) + 3 * rank + offset) % 7
    return x.to(torch.bool) if dtype == torch.bool else x.to(dtype)


@multi_rank
@pytest.mark.parametrize("dt", DTYPES, ids=IDS)
def test_send_recv_ring_every_dtype(dt):
    # Even ranks send first, odd ranks receive first: blocking calls in a ring.
    got = torch.zeros(33, dtype=dt)
    if RANK % 2 == 0:
        dist.send(ramp(33, dt, RANK), dst=NEXT)
        dist.recv(got, src=PREV)
    else:
        dist.recv(got, src=PREV)
        dist.send(ramp(33, dt, RANK), dst=NEXT)
    assert torch.equal(got, ramp(33, dt, PREV))


@multi_rank
@pytest.mark.parametrize("n", [2, 4 << 20], ids=["8B", "16MiB"])
def test_both_ranks_post_the_receive_first(n):
    got = torch.empty(n, dtype=torch.float32)
    r = dist.irecv(got, src=PREV)
    s = dist.isend(torch.full((n,), float(RANK)), dst=NEXT)
    r.wait()
    s.wait()
    assert bool((got == float(PREV)).all())


@multi_rank
def test_batch_isend_irecv_ring_and_its_reverse():
    a, b = torch.empty(5, dtype=torch.int64), torch.empty(5, dtype=torch.int64)
    ops = [
        dist.P2POp(dist.irecv, a, PREV),
        dist.P2POp(dist.irecv, b, NEXT, tag=1),
        dist.P2POp(dist.isend, torch.arange(5) + 10 * RANK, NEXT),
        dist.P2POp(dist.isend, torch.arange(5) - 10 * RANK, PREV, tag=1),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert a.tolist() == (torch.arange(5) + 10 * PREV).tolist()
    assert b.tolist() == (torch.arange(5) - 10 * NEXT).tolist()


@multi_rank
def test_messages_of_one_tag_arrive_in_order_and_tags_are_independent():
    if RANK == 0:
        sends = [
            dist.isend(torch.tensor([float(100 * tag + k)]), dst=1, tag=tag)
            for k in range(4)
            for tag in (3, 7)
        ]
        for w in sends:
            w.wait()
    elif RANK == 1:
        # tag 7 first, then tag 3: each tag's messages in their order
        got = {}
        for tag in (7, 3):
            got[tag] = []
            for _ in range(4):
                t = torch.empty(1)
                dist.recv(t, src=0, tag=tag)
                got[tag].append(t.item())
        assert got == {3: [300.0, 301.0, 302.0, 303.0], 7: [700.0, 701.0, 702.0, 703.0]}
    dist.barrier()


@multi_rank
def test_a_size_mismatch_fails_the_receive_naming_both_sizes():
    if RANK == 0:
        dist.send(torch.ones(3), dst=1, tag=5)
        dist.send(torch.full((2,), 4.0), dst=1, tag=5)
    elif RANK == 1:
        t = torch.full((4,), -1.0)
        # mtxcomm.InvalidUsageError from the Python backend, RuntimeError from the C++ one.
        with pytest.raises(RuntimeError) as e:
            dist.recv(t, src=0, tag=5)
        assert "12" in str(e.value) and "16" in str(e.value), str(e.value)
        assert t.tolist() == [-1.0] * 4  # nothing written
        ok = torch.empty(2)
        dist.recv(ok, src=0, tag=5)  # the next message matches the next receive
        assert ok.tolist() == [4.0, 4.0]
    dist.barrier()


@multi_rank
def test_bad_arguments_raise_before_anything_is_sent():
    with pytest.raises(ValueError, match="tag 1048576 is outside"):
        dist.send(torch.ones(1), dst=NEXT, tag=1 << 20)
    with pytest.raises((ValueError, RuntimeError)):
        dist.send(torch.ones(1), dst=SIZE + 3)


@multi_rank
def test_p2p_on_a_subgroup_uses_group_ranks():
    tail = list(range(1, SIZE)) if SIZE > 2 else [0, 1]
    g = dist.new_group(tail)
    if RANK in tail:
        me, n = tail.index(RANK), len(tail)
        got = torch.empty(3)
        peer_next, peer_prev = tail[(me + 1) % n], tail[(me - 1) % n]
        r = dist.irecv(got, src=peer_prev, group=g)
        s = dist.isend(torch.full((3,), float(RANK)), dst=peer_next, group=g)
        r.wait()
        s.wait()
        assert got.tolist() == [float(peer_prev)] * 3
        # a collective of the group between p2p calls
        x = torch.ones(1)
        dist.all_reduce(x, group=g)
        assert x.item() == float(n)


@multi_rank
def test_p2p_beside_async_collectives():
    works = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(4)]
    got = torch.empty(1000)
    r = dist.irecv(got, src=PREV, tag=2)
    s = dist.isend(torch.full((1000,), float(RANK)), dst=NEXT, tag=2)
    for w in works + [r, s]:
        w.wait()
    assert bool((got == float(PREV)).all())


def _model():
    torch.manual_seed(0)
    return (
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()),
        torch.nn.Sequential(torch.nn.Linear(16, 4)),
    )


@multi_rank
def test_a_two_stage_pipeline_over_batch_isend_irecv_equals_one_process():
    """Ranks 0 and 1 hold the two stages of a model; 3 steps of 4 micro-batches each (forward
    activations 0 -> 1, backward gradients 1 -> 0, through batch_isend_irecv); the loss and the
    trained weights equal the same model's in one process."""
    stage0, stage1 = _model()
    ref0, ref1 = _model()
    opt = torch.optim.SGD(list(stage0.parameters()) + list(stage1.parameters()), lr=0.05)
    ref_opt = torch.optim.SGD(list(ref0.parameters()) + list(ref1.parameters()), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _step in range(3):
        xs = [torch.randn(5, 8, generator=g) for _ in range(4)]
        ys = [torch.randn(5, 4, generator=g) for _ in range(4)]
        # the reference, in this process
        ref_opt.zero_grad()
        ref_loss = sum(torch.nn.functional.mse_loss(ref1(ref0(x)), y) for x, y in zip(xs, ys))
        ref_loss.backward()
        ref_opt.step()
        if RANK > 1:
            continue
        opt.zero_grad()
        if RANK == 0:
            outs = [stage0(x) for x in xs]
            works = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, o.detach().contiguous(), 1) for o in outs]
            )
            for w in works:
                w.wait()
            grads = [torch.empty_like(o) for o in outs]
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, gr, 1) for gr in grads]):
                w.wait()
            for o, gr in zip(outs, grads):
                o.backward(gr)
            loss = torch.empty(1)
            dist.recv(loss, src=1)
        else:
            acts = [torch.empty(5, 16) for _ in xs]
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, a, 0) for a in acts]):
                w.wait()
            acts = [a.requires_grad_() for a in acts]
            loss = sum(torch.nn.functional.mse_loss(stage1(a), y) for a, y in zip(acts, ys))
            loss.backward()
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, a.grad, 0) for a in acts])
            for w in works:
                w.wait()
            dist.send(loss.detach().reshape(1), dst=0)
        opt.step()
        torch.testing.assert_close(loss.reshape(()), ref_loss.detach(), rtol=1e-6, atol=1e-6)
        mine, ref = (stage0, ref0) if RANK == 0 else (stage1, ref1)
        for p, q in zip(mine.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    dist.barrier()
