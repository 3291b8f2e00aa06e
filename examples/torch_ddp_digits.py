"""Train a small MLP on scikit-learn's 8x8 digits with PyTorch DDP over the "mtxcomm" backend.

    torchrun --nproc-per-node 2 examples/torch_ddp_digits.py
    mtxrun -np 2 python examples/torch_ddp_digits.py
    python examples/torch_ddp_digits.py                # 1 process (world of one)

The only mtxcomm-specific lines are `import mtxcomm.torch` and the backend's name. Every step
takes one global batch (--batch rows, shuffled the same way on every rank) and gives rank r its
r-th slice, so an N-rank run computes the same steps as a 1-process run on whole batches (DDP
averages the ranks' gradients). Options:
  --steps N          optimizer steps (default 300)
  --batch B          the global batch (default 64; divisible by the number of ranks)
  --backend NAME     torch.distributed backend (default mtxcomm; gloo for comparison)
  --save-weights P   rank 0 (or every rank with "{rank}" in P) writes the final parameters to P
                     (torch.save of a list of tensors)
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mtxcomm.torch  # noqa: F401  (registers the "mtxcomm" backend)


def data():
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.25, random_state=0)
    f = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return f(X_train), torch.tensor(y_train), f(X_test), torch.tensor(y_test)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--backend", default="mtxcomm")
    ap.add_argument("--save-weights")
    args = ap.parse_args()
    if "RANK" in os.environ:  # torchrun, mtxrun
        dist.init_process_group(args.backend)
    else:  # a plain `python`: a world of one
        dist.init_process_group(args.backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.batch % size:
        raise SystemExit("--batch %d is not divisible by %d ranks" % (args.batch, size))
    X, y, X_test, y_test = data()
    net = model()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    order = torch.randperm(len(X), generator=g)
    share = args.batch // size
    start = time.perf_counter()
    for step in range(args.steps):
        first = (step * args.batch) % (len(X) - args.batch)
        idx = order[first : first + args.batch][rank * share : (rank + 1) * share]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(X[idx]), y[idx])
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        acc = (net(X_test).argmax(1) == y_test).float().mean().item()
    if rank == 0:
        print(
            "ranks %d backend %s: %d steps in %.2f s (%.2f ms/step), loss %.4f, test "
            "accuracy %.3f"
            % (
                size,
                args.backend,
                args.steps,
                elapsed,
                1e3 * elapsed / args.steps,
                loss.item(),
                acc,
            )
        )
    if args.save_weights and (rank == 0 or "{rank}" in args.save_weights):
        torch.save(
            [p.detach().clone() for p in net.parameters()],
            args.save_weights.replace("{rank}", str(rank)),
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
