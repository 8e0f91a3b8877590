"""Train a small ResNet with DDP and SGD (momentum) on the digits images, as a torchrun script does.

The data is scikit-learn's digits (1797 8x8 images, bundled with the
library, nothing to download), upscaled to 16x16 and shifted by up to two
pixels at random while training. The model is a ResNet in the usual shape:
a 3x3 stem, three stages of basic blocks (3x3 conv, batch norm, ReLU, with a
shortcut), global average pooling and a linear classifier. Every rank takes
its share of each epoch (``DistributedSampler``); rank 0 measures the test
accuracy after every epoch.

    torchrun --nproc-per-node 2 examples/resnet_digits.py
    gradwire compare --net bandwidth=500mbit -- torchrun --nproc-per-node 2 examples/resnet_digits.py --seed {seed}

Under ``gradwire compare`` the test accuracy goes into the table through
``gradwire.report`` (a no-op anywhere else).
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:
    from gradwire import report
except ImportError:  # gradwire not installed: nothing to report to
    def report(step=None, **metrics):  # type: ignore[no-untyped-def]
        pass


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def digits(size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and test images (N, 1, size, size) in [0, 1] and labels; a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    y = torch.tensor(bunch.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1797))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def shift(x: torch.Tensor, pixels: int, generator: torch.Generator) -> torch.Tensor:
    """Move each image by up to ``pixels`` in both directions (zero padding)."""
    padded = F.pad(x, (pixels,) * 4)
    out = torch.empty_like(x)
    n, size = x.shape[0], x.shape[-1]
    dx, dy = torch.randint(0, 2 * pixels + 1, (2, n), generator=generator)
    for i in range(n):
        out[i] = padded[i, :, dy[i]:dy[i] + size, dx[i]:dx[i] + size]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=32, help="images per rank and step")
    p.add_argument("--width", type=int, default=32, help="channels of the first stage (x2, x4 after)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0, help="seeds the weights, the data order and the shifts")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args()

    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    x_train, y_train, x_test, y_test = digits()
    train = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)
    model = ResNet(args.width).to(device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    steps = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    shifts = torch.Generator().manual_seed(1000 * args.seed + rank)

    def accuracy() -> float:
        model.eval()
        with torch.no_grad():
            acc = (model(x_test.to(device)).argmax(1) == y_test.to(device)).float().mean().item()
        model.train()
        return acc

    step, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x = shift(x, 2, shifts)
            loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
        if rank == 0:
            acc = accuracy()
            report(step=step, accuracy=acc)
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, test accuracy {acc:.4f}, "
                  f"{(time.perf_counter() - t0) / step * 1e3:.1f} ms/step", flush=True)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"{n} parameters on {world} ranks, {step} steps in {time.perf_counter() - t0:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
