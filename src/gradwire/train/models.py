"""Models for the digits workload, by name.

- ``cnn``: two 3x3 convolutions and two linear layers, about 38 K parameters
  (150 KB of fp32 gradient per step): compute-bound, few bytes.
- ``cnn-wide``: the same CNN 4x wider, about 600 K parameters (2.4 MB per
  step): the default of ``gradwire compare``.
- ``mlp``: 64 -> 2048 -> 2048 -> 10, about 4.3 M parameters (17 MB per step):
  communication-heavy on the same data; what compression and overlap are for.
- ``mlp-deep``: 64 -> 512, eight hidden 512 -> 512 layers, -> 10: about
  2.1 M parameters (8.2 MB) in ten equal layers of 1 MB, so that DDP with
  ``bucket_cap_mb=1`` has one bucket per layer and backward produces them
  one after another: what bucket-level overlap is about.
- ``tiny``: a linear classifier (650 parameters) for fast tests.

Every model is built from the global torch seed: seed, then build, and every
rank holds the same initial weights (the strategies still broadcast rank 0's).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ["MODELS", "DeepMLP", "DigitsCNN", "DigitsMLP", "DigitsWideCNN", "build_model", "num_parameters"]


class DigitsCNN(nn.Module):
    """conv(1->16) relu conv(16->32) relu maxpool(2) -> fc(512->64) relu -> fc(64->10)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsWideCNN(DigitsCNN):
    """The digits CNN, 4x wider: conv(1->64) conv(64->128) fc(2048->256) fc(256->10), about 600 K parameters.

    Enough compute per step that fixed per-step costs (Python, hook plumbing)
    do not hide what the network and the strategies do; 2.4 MB of gradient.
    """

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.features = nn.Sequential(
            nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))


class DigitsMLP(nn.Module):
    """A wide MLP on the flattened 8x8 images: many parameters, little compute per byte."""

    def __init__(self, hidden: int = 2048) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DeepMLP(nn.Module):
    """``depth`` hidden layers of ``width``: many equal buckets, little compute per byte."""

    def __init__(self, width: int = 512, depth: int = 8) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "cnn": DigitsCNN,
    "cnn-wide": DigitsWideCNN,
    "mlp": DigitsMLP,
    "mlp-deep": DeepMLP,
    "tiny": _tiny,
}


def build_model(name: str, seed: int | None = None) -> nn.Module:
    """Build model ``name``; with ``seed``, seed torch first so every rank gets the same weights."""
    factory = MODELS.get(name)
    if factory is None:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}")
    if seed is not None:
        torch.manual_seed(seed)
    return factory()


def num_parameters(model: nn.Module) -> int:
    """Number of trainable parameter elements."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
