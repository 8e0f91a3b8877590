"""Classify scikit-learn's digits in a plain loop prepared by Hugging Face Accelerate, under torchrun.

As an Accelerate user writes it: ``Accelerator(cpu=True)``,
``accelerator.prepare(model, optimizer, train_loader, test_loader,
scheduler)`` (DDP for the model, a sharded loader per rank),
``accelerator.backward(loss)``, ``optimizer.step()``, and the test accuracy
gathered with ``gather_for_metrics``. On CPU ``accelerate launch`` refuses
``--multi_gpu --cpu``; torchrun is the launcher, and Accelerate reads its
environment (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``...) to join the group
(gloo). Nothing is downloaded: the digits ship with scikit-learn.

    torchrun --nproc-per-node 2 examples/accelerate_loop.py
    gradwire profile --net bandwidth=200mbit --out prof -- torchrun --nproc-per-node 2 examples/accelerate_loop.py
    gradwire compare --net bandwidth=200mbit -- torchrun --nproc-per-node 2 examples/accelerate_loop.py --seed {seed}

The test accuracy of every epoch goes into ``gradwire compare``'s table
through ``gradwire.report`` (a no-op anywhere else; without gradwire
installed the script runs as it is). ``--summary FILE`` writes rank 0's
optimizer steps and final metrics as JSON.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from gradwire import report
except ImportError:  # gradwire not installed: nothing to report to
    def report(step=None, **metrics):  # type: ignore[no-untyped-def]
        pass


def datasets(test_share: float = 0.25) -> tuple[TensorDataset, TensorDataset]:
    """Digits as 64 features scaled to [0, 1]; the same fixed split on every rank."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_test = int(len(y) * test_share)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="examples per rank and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the data order")
    p.add_argument("--summary", default=None, help="write rank 0's steps and final metrics to this JSON file")
    args = p.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(args.seed)
    train, test = datasets()
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    train_loader = DataLoader(train, batch_size=args.batch, shuffle=True)
    test_loader = DataLoader(test, batch_size=128)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler)

    steps = 0
    accuracy = float("nan")
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            steps += 1
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in test_loader:
                pred, y = accelerator.gather_for_metrics((model(x).argmax(1), y))
                correct += int((pred == y).sum())
                total += len(y)
        accuracy = correct / total
        if accelerator.is_main_process:
            report(step=steps, test_accuracy=accuracy)
            accelerator.print(f"epoch {epoch + 1}: train loss {loss.item():.4f}, test accuracy {accuracy:.4f}")
    if accelerator.is_main_process:
        accelerator.print(f"{steps} optimizer steps on {accelerator.num_processes} ranks")
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump({"optimizer_steps": steps, "world": accelerator.num_processes,
                       "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                           "metrics": {"test_accuracy": accuracy}}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
