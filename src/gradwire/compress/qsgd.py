"""``qsgd:s`` and ``int8``: stochastic quantisation to ``s`` levels, one int8 per element.

QSGD (Alistarh et al., 2017, https://arxiv.org/abs/1610.02132):

1. ``norm = ||x||_2`` (``int8``: ``max |x|``, which wastes fewer levels).
2. ``a = |x| / norm * s`` lies in [0, s]; ``level = floor(a + u)`` with
   ``u ~ U[0, 1)`` is ``ceil(a)`` with probability ``a - floor(a)``: unbiased.
3. Payload: ``sign(x) * level`` as int8 (s <= 127) plus ``norm`` (fp32).
4. Decode: ``level * norm / s``.

Pattern: all_gather (int8 levels of different ranks have different norms).

Traps:
- With the L2 norm and large tensors almost every ``a`` is below 1, so most
  levels are 0 or 1 and the variance is large; use ``int8`` (max norm, 127
  levels) for low error, ``qsgd:s`` for the paper's scheme.
- A zero tensor has norm 0: levels are all 0, no division by zero.
- NaN/inf: the norm becomes NaN/inf and is sent; every decoded value is then
  NaN, so the bad step is visible, never silently dropped.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._rng import CallCounter
from .base import Compressor, Ctx, Pattern


class QSGDCompressor(Compressor):
    """Unbiased stochastic quantisation to ``levels`` levels per sign, int8 on the wire."""

    name = "qsgd"
    pattern = Pattern.ALLGATHER
    unbiased = True

    def __init__(self, levels: int = 16, norm: str = "l2", seed: int | None = None) -> None:
        if not 1 <= int(levels) <= 127:
            raise ValueError(f"qsgd levels must be an integer in [1, 127] (int8 payload), got {levels}")
        if norm not in ("l2", "max"):
            raise ValueError(f"qsgd norm must be 'l2' or 'max', got {norm!r}")
        self.levels = int(levels)
        self.norm = norm
        self._rng = CallCounter(seed)

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        x = flat.float()
        norm = torch.linalg.vector_norm(x, 2) if self.norm == "l2" else x.abs().amax()
        n = float(norm)
        mult = self.levels / n if n > 0 and n != float("inf") else 0.0
        a = x.abs().mul_(mult)
        a.add_(torch.rand(a.shape, generator=self._rng.generator(ctx.key))).floor_()
        levels = a.copysign_(x).to(torch.int8)
        return [levels, norm.reshape(1).float()]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        levels, norm = payload
        return levels.float().mul_(norm / self.levels)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.load_state_dict(state["rng"])
