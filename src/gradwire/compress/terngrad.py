"""``terngrad``: stochastic ternary {-1, 0, +1} * max|x|, 2 bits per element.

TernGrad (Wen et al., 2017, https://arxiv.org/abs/1705.07878):

1. ``scale = max |x|``.
2. Each element becomes ``sign(x)`` with probability ``|x| / scale`` and 0
   otherwise: unbiased.
3. Codes (0 -> 0, 1 -> +1, 2 -> -1) are packed four per byte; payload is
   ``ceil(n/4)`` bytes plus the fp32 scale.
4. Decode by a 256-row table lookup, scaled.

Pattern: all_gather (scales differ per rank).

Traps: a NaN makes ``scale`` NaN, so every decoded value is NaN (visible);
the probability test ``u < p`` is False for NaN and never raises.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._rng import CallCounter, uniform
from .base import Compressor, Ctx, Pattern
from .packing import TERNARY_TABLE, decode_table, pack_codes2


class TernGradCompressor(Compressor):
    """Unbiased ternary quantisation with a per-tensor max-norm scale."""

    name = "terngrad"
    pattern = Pattern.ALLGATHER
    unbiased = True

    def __init__(self, seed: int | None = None) -> None:
        self._rng = CallCounter(seed)

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        x = flat.float()
        scale = x.abs().amax()
        s = float(scale)
        inv = 1.0 / s if 0 < s < float("inf") else 0.0
        keep = uniform(x.shape, self._rng.generator(ctx.key, x.device), x.device) < x.abs().mul_(inv)
        codes = keep.to(torch.uint8) << torch.lt(x, 0).to(torch.uint8)  # 0, 1 (+) or 2 (-)
        return [pack_codes2(codes), scale.reshape(1)]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        packed, scale = payload
        return decode_table(packed, TERNARY_TABLE, ctx.numel, float(scale))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.load_state_dict(state["rng"])
