"""Classify scikit-learn's digits with a LightningModule and ``Trainer(strategy="ddp")`` under torchrun.

As a Lightning user writes it: a ``LightningModule`` with automatic
optimization (Lightning calls ``optimizer.step(closure)``, forward and
backward run inside the step), SGD with momentum, ``self.log(...,
sync_dist=True)`` for the loss and the accuracy, and a ``Trainer`` on CPU
with DDP. Lightning sees torchrun's environment (``RANK``, ``GROUP_RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and joins the processes torchrun
started instead of spawning its own; ``--devices`` must match
``--nproc-per-node`` (it defaults to ``LOCAL_WORLD_SIZE``). Nothing is
downloaded: the digits (1797 images of 8x8) ship with scikit-learn.

    torchrun --nproc-per-node 2 examples/lightning_digits.py
    gradwire profile --net bandwidth=200mbit --out prof -- torchrun --nproc-per-node 2 examples/lightning_digits.py
    gradwire compare --net bandwidth=200mbit -- torchrun --nproc-per-node 2 examples/lightning_digits.py --seed {seed}

The validation accuracy of every epoch goes into ``gradwire compare``'s table
through ``gradwire.report`` (a no-op anywhere else, and not needed: without
gradwire installed the script runs as it is). ``--summary FILE`` writes rank
0's optimizer steps and final metrics as JSON.
"""
from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from gradwire import report
except ImportError:  # gradwire not installed: nothing to report to
    def report(step=None, **metrics):  # type: ignore[no-untyped-def]
        pass


def datasets(test_share: float = 0.25) -> tuple[TensorDataset, TensorDataset]:
    """Digits as 1x8x8 images scaled to [0, 1]; the same fixed split on every rank."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_test = int(len(y) * test_share)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


class DigitsNet(L.LightningModule):
    """A small CNN: two 3x3 convolutions, a hidden layer, ten classes."""

    def __init__(self, lr: float = 0.05, momentum: float = 0.9, width: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(width * 16, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


class ReportToGradwire(L.Callback):
    """Hands the synced validation accuracy of every epoch to ``gradwire.report`` (rank 0)."""

    def on_validation_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        report(step=trainer.global_step, val_acc=float(metrics["val_acc"]), val_loss=float(metrics["val_loss"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="images per rank and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches: micro-steps per step")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the data order")
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                   help="processes per node (default: torchrun's --nproc-per-node)")
    p.add_argument("--summary", default=None, help="write rank 0's steps and final metrics to this JSON file")
    args = p.parse_args()

    L.seed_everything(args.seed, workers=True, verbose=False)
    train, test = datasets()
    model = DigitsNet(lr=args.lr)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp", max_epochs=args.epochs,
                        accumulate_grad_batches=args.accumulate,
                        callbacks=[ReportToGradwire()], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    # Lightning puts a DistributedSampler under both loaders; shuffle=True makes it shuffle per epoch
    trainer.fit(model, DataLoader(train, batch_size=args.batch, shuffle=True),
                DataLoader(test, batch_size=256))
    if trainer.is_global_zero:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        print(f"{trainer.global_step} optimizer steps on {trainer.world_size} ranks: "
              + ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())), flush=True)
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump({"optimizer_steps": trainer.global_step, "world": trainer.world_size,
                           "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                           "metrics": metrics}, f)


if __name__ == "__main__":
    main()
