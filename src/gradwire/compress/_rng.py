"""Deterministic per-call random streams that agree across ranks and survive checkpoints.

A stochastic compressor (``qsgd``, ``int8``, ``terngrad``, ``randomk``) draws
from a fresh generator per call, seeded by ``(seed, key, count)`` where
``count`` is how often ``key`` has drawn before (:class:`CallCounter`). So:

1. The draws of a tensor do not depend on which thread compresses first: the
   server step of a two-phase exchange runs in a completion callback while
   the training thread encodes the next bucket, and one shared stream would
   hand them its numbers in whatever order they arrive.
2. The whole random state is ``seed`` and the counts, plain types: a
   checkpoint resumes the very draws an uninterrupted run makes.

Without a seed given, the seed is drawn once from torch's global generator
when the counter is made (each rank of :func:`gradwire.launch.spawn` seeds
its own; a script that seeds every rank alike gets alike draws, as it did
from the global generator). Those draws are made on the tensor's device; a
given seed draws on the CPU, so that every rank and device agrees (the shared
indices of ``randomk``).
"""
from __future__ import annotations

import threading
import zlib
from typing import Any, Hashable

import torch

__all__ = ["CallCounter", "label", "stable_hash", "uniform"]

_MOD = 2**63 - 1


def stable_hash(key: Hashable) -> int:
    """A hash of ``key`` that is the same in every process (unlike ``hash`` of a str)."""
    return zlib.crc32(label(key).encode())


def label(key: Hashable) -> str:
    """``key`` as a string that is the same in every process: per-key state is kept under it,
    so a checkpoint holds plain strings (``torch.load(weights_only=True)`` reads them)."""
    return key if isinstance(key, str) else repr(key)


def uniform(shape: torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """U[0, 1) draws on ``device`` from ``generator`` (drawn where the generator lives, then moved)."""
    if generator.device.type == torch.device(device).type:
        return torch.rand(shape, generator=generator, device=device)
    return torch.rand(shape, generator=generator).to(device)


class CallCounter:
    """Counts calls per key; ``generator(key)`` is seeded by (seed, key, count) (module doc).

    Args:
        seed: the seed shared by every rank that gives it (draws on the CPU);
            None: one drawn now from torch's global generator (draws on the
            tensor's device).
    """

    def __init__(self, seed: int | None) -> None:
        self.shared = seed is not None
        self.seed = int(seed) if seed is not None else int(torch.randint(0, _MOD, (1,)).item())
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def generator(self, key: Hashable, device: torch.device | str | None = None) -> torch.Generator:
        """The generator of ``key``'s next call (on ``device`` unless the seed is shared: then on the CPU)."""
        name = label(key)
        with self._lock:
            count = self.counts.get(name, 0)
            self.counts[name] = count + 1
        where = "cpu" if self.shared or device is None else device
        g = torch.Generator(device=where)
        g.manual_seed((self.seed * 1_000_003 + stable_hash(key) * 7919 + count) % _MOD)
        return g

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            # sorted: keys are first drawn by whichever thread comes first (module doc)
            return {"seed": self.seed, "shared": self.shared, "counts": dict(sorted(self.counts.items()))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.seed = int(state["seed"])
            self.shared = bool(state.get("shared", True))
            self.counts = {str(k): int(v) for k, v in state["counts"].items()}

    def __getstate__(self) -> dict[str, Any]:
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self.load_state_dict(state)
