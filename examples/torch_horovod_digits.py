"""A Horovod-style PyTorch script (scikit-learn's digits), run by mtxcomm with one import changed.

Written as for horovod.torch, with `import horovod.torch as hvd` replaced by the line below:

    mtxrun -np 2 python examples/torch_horovod_digits.py
    torchrun --nproc-per-node 2 examples/torch_horovod_digits.py

Each rank trains on its shard of the training set (rank r takes rows r, r + size, ...);
DistributedOptimizer averages the gradients, broadcast_parameters and
broadcast_optimizer_state start every rank from rank 0's state, and the test accuracy is
averaged with hvd.allreduce. Options: --epochs N (default 20), --batch B per rank (default 32),
--save-weights P (as in torch_ddp_digits.py).
"""

import argparse

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mtxcomm.torch as hvd  # was: import horovod.torch as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--save-weights")
    args = ap.parse_args()
    hvd.init()
    torch.manual_seed(hvd.rank())  # different initial weights: broadcast_parameters fixes them
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.25, random_state=0)
    X_train = torch.tensor(X_train, dtype=torch.float32)[hvd.rank() :: hvd.size()]
    y_train = torch.tensor(y_train)[hvd.rank() :: hvd.size()]
    X_test, y_test = torch.tensor(X_test, dtype=torch.float32), torch.tensor(y_test)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    steps = len(X_train) // args.batch
    for epoch in range(args.epochs):
        perm = torch.randperm(len(X_train), generator=torch.Generator().manual_seed(epoch))
        for s in range(steps):
            idx = perm[s * args.batch : (s + 1) * args.batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(X_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        acc = (model(X_test).argmax(1) == y_test).float().mean()
    acc = hvd.allreduce(acc, name="accuracy")
    if hvd.rank() == 0:
        print(
            "ranks %d: %d epochs, loss %.4f, test accuracy %.3f"
            % (hvd.size(), args.epochs, loss.item(), acc.item())
        )
    if args.save_weights and (hvd.rank() == 0 or "{rank}" in args.save_weights):
        torch.save(
            [p.detach().clone() for p in model.parameters()],
            args.save_weights.replace("{rank}", str(hvd.rank())),
        )


if __name__ == "__main__":
    main()
