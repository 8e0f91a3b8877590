"""A small model with small DDP buckets: a 28 k-parameter residual MLP on scikit-learn's digits, AdamW, under torchrun.

The ordinary script for a small model: ``DDP(model, bucket_cap_mb=0.01)``
(10 KB buckets: DDP rebuilds them into six of 12-23 KB, two blocks each, in
gradient-ready order), AdamW, a random batch per rank and step, the held-out accuracy at the
end of each epoch on rank 0. On a network where sync waits on every small
all_reduce, what a compressed exchange saves in bytes it can lose in
collectives and per-step CPU work: the case small-bucket fusion is for.

    torchrun --nproc-per-node 2 examples/small_adamw.py
    gradwire compare --net bandwidth=200mbit --strategies sync,onebit \\
        -- torchrun --nproc-per-node 2 examples/small_adamw.py --seed {seed}
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from gradwire import report
except ImportError:  # gradwire not installed: nothing to report to
    def report(step=None, **metrics):  # type: ignore[no-untyped-def]
        pass


def digits(test_share: float = 0.25) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 1797 digits (8x8, scaled to [0, 1]) split once with a fixed permutation: train x, y, test x, y."""
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    cut = int(len(y) * (1 - test_share))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


class Block(nn.Module):
    """``x + W relu(norm(x))``: a pre-norm residual layer (a deep plain ReLU stack this narrow trains slowly)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(F.relu(self.norm(x)))


def mlp(hidden: int = 48, depth: int = 10) -> nn.Module:
    """64 -> hidden, ``depth`` residual blocks, -> 10: 28 186 parameters and 46 tensors by default."""
    return nn.Sequential(nn.Linear(64, hidden), *(Block(hidden) for _ in range(depth)), nn.LayerNorm(hidden),
                         nn.Linear(hidden, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--hidden", type=int, default=48)
    p.add_argument("--depth", type=int, default=10, help="hidden -> hidden layers")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bucket-cap-mb", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the batches")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train_x, train_y, test_x, test_y = digits()
    torch.manual_seed(args.seed)
    model = mlp(args.hidden, args.depth)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    batches = torch.Generator().manual_seed(1000 * args.seed + rank)

    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        for _ in range(args.steps_per_epoch):
            idx = torch.randint(0, len(train_y), (args.batch,), generator=batches)
            loss = F.cross_entropy(ddp(train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if rank == 0:
            with torch.no_grad():
                accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
            report(step=epoch * args.steps_per_epoch, test_accuracy=accuracy)
            steps = epoch * args.steps_per_epoch
            print(f"epoch {epoch}: loss {loss.item():.4f}, test accuracy {accuracy:.4f}, "
                  f"{(time.perf_counter() - t0) / steps * 1e3:.2f} ms/step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
