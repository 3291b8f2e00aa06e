"""DDP over one dimension of a 2-D DeviceMesh ("dp" x "tp") of the "mtxcomm" backend, at np=4
(test_torch_jobs.py): each rank trains on its own batch; every step, the "dp" pair's gradients
are averaged by DDP and checked against the mean each rank computes itself from both batches
(a local copy of the model); a "tp" allreduce is checked against its closed form. Prints
"mesh ok" with the ranks of both groups."""

import copy
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import mtxcomm.torch  # noqa: F401  (registers the backend)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def main():
    dist.init_process_group("mtxcomm")
    rank, n = dist.get_rank(), dist.get_world_size()
    assert n % 2 == 0, "needs an even number of ranks"
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    dp_ranks, tp_ranks = dist.get_process_group_ranks(dp), dist.get_process_group_ranks(tp)
    assert rank in dp_ranks and rank in tp_ranks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    shadow = copy.deepcopy(model)  # the same weights: computes every dp rank's gradient here
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=dp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    shadow_opt = torch.optim.SGD(shadow.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    for step in range(5):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        # The mean of the dp ranks' own gradients, computed here on the shadow model.
        shadow_opt.zero_grad()
        for r in dp_ranks:
            xr, yr = batch(r, step)
            (loss_fn(shadow(xr), yr) / len(dp_ranks)).backward()
        for p, q in zip(model.parameters(), shadow.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        opt.step()
        shadow_opt.step()
        t = torch.tensor([float(rank + step)])
        dist.all_reduce(t, group=tp)
        assert t.item() == float(sum(r + step for r in tp_ranks)), t
    print("mesh ok rank %d dp %s tp %s" % (rank, dp_ranks, tp_ranks), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
