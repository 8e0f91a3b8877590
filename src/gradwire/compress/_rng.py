"""Deterministic per-call random streams that agree across ranks and survive checkpoints."""
from __future__ import annotations

import zlib
from typing import Hashable

import torch

__all__ = ["CallCounter", "label", "stable_hash", "uniform"]


def stable_hash(key: Hashable) -> int:
    """A hash of ``key`` that is the same in every process (unlike ``hash`` of a str)."""
    return zlib.crc32(label(key).encode())


def label(key: Hashable) -> str:
    """``key`` as a string that is the same in every process: per-key state is kept under it,
    so a checkpoint holds plain strings (``torch.load(weights_only=True)`` reads them)."""
    return key if isinstance(key, str) else repr(key)


def uniform(shape: torch.Size, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """U[0, 1) draws on ``device``: from ``generator`` (a CPU generator, so every rank and device
    draws the same numbers) or, when None, from the device's global RNG."""
    if generator is None:
        return torch.rand(shape, device=device)
    return torch.rand(shape, generator=generator).to(device)


class CallCounter:
    """Counts calls per key; ``generator(key)`` is seeded by (seed, key, count).

    With ``seed=None`` it returns None, i.e. the global torch RNG.
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.counts: dict[str, int] = {}

    def generator(self, key: Hashable) -> torch.Generator | None:
        name = label(key)
        count = self.counts.get(name, 0)
        self.counts[name] = count + 1
        if self.seed is None:
            return None
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + stable_hash(key) * 7919 + count) % (2**63 - 1))
        return g

    def state_dict(self) -> dict:
        return {"seed": self.seed, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.counts = dict(state["counts"])
