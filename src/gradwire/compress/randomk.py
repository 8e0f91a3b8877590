"""``randomk:ratio``: ``k`` random coordinates, the same on every rank, summable.

1. Every rank draws the same ``k = ceil(ratio * n)`` indices (with replacement)
   from a generator seeded by (seed, key, call count): ranks agree without
   communicating, and a checkpoint restores the count.
2. Payload: the values at those indices only (no indices on the wire), so the
   payloads of all ranks can be all_reduced.
3. Decode: ``zeros(n).index_add_(indices, values * n / k)`` (``rescale=True``,
   the default): unbiased, since each index is drawn with probability k/n per
   draw.

Traps:
- The unbiased estimate has a large variance (``n / k`` times the values); for
  error feedback use ``RandomKCompressor(ratio, rescale=False)``: the rescaled
  residual would grow instead of shrink.
- A NaN/inf outside the drawn indices would vanish: the tensor's sum is checked
  and a non-finite sum is written into the first value, so the result shows it.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ._rng import CallCounter
from .base import Compressor, Ctx, Pattern


class RandomKCompressor(Compressor):
    """Random sparsification with indices shared through a common seed."""

    name = "randomk"
    pattern = Pattern.ALLREDUCE

    def __init__(self, ratio: float = 0.01, seed: int = 0, rescale: bool = True) -> None:
        if not 0.0 < float(ratio) <= 1.0:
            raise ValueError(f"randomk ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)
        self.rescale = bool(rescale)
        self.unbiased = self.rescale
        self._rng = CallCounter(int(seed))

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        n = flat.numel()
        k = max(1, math.ceil(self.ratio * n))
        # drawn on the CPU from the shared seed, so every rank (and device) picks the same coordinates
        idx = torch.randint(0, n, (k,), generator=self._rng.generator(ctx.key)).to(flat.device)
        vals = flat[idx]
        total = flat.sum()
        if not torch.isfinite(total):
            vals[0] = total
        ctx.info["idx"] = idx
        return [vals]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        idx = ctx.info["idx"]
        vals = payload[0]
        if self.rescale:
            vals = vals * (ctx.numel / idx.numel())
        return torch.zeros(ctx.numel, dtype=vals.dtype, device=vals.device).index_add_(0, idx, vals)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.load_state_dict(state["rng"])
