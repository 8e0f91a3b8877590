"""Encode + decode wall time of a compressor (one process), for comparisons.

1. Build a random fp32 tensor of ``numel`` elements (fixed seed).
2. Run one warm-up round trip (allocator, lazy tables), then ``repeats`` timed
   ones (:func:`~gradwire.compress.base.roundtrip`: every round, no network).
3. Return the median seconds.

Traps: compare compressors measured in the same process and moment (the
machine's other load moves absolute numbers by 2x); torch runs with its
default thread count unless the caller sets it.
"""
from __future__ import annotations

import statistics
import time

import torch

from . import get_compressor
from .base import roundtrip

__all__ = ["time_roundtrip", "time_table"]


def time_roundtrip(name: str, numel: int = 25_000_000, repeats: int = 5, seed: int = 0) -> float:
    """Median seconds of ``compress`` + ``decompress`` of ``numel`` fp32 values with compressor ``name``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    compressor = get_compressor(name)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    roundtrip(compressor, x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        roundtrip(compressor, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_table(names: list[str], numel: int = 25_000_000, repeats: int = 5) -> dict[str, float]:
    """``time_roundtrip`` of each name, measured one after another in this process."""
    return {name: time_roundtrip(name, numel, repeats) for name in names}
