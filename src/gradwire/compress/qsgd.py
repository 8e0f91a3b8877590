"""``qsgd:s`` and ``int8``: stochastic quantisation to ``s`` levels, one int8 per element.

QSGD (Alistarh et al., 2017, https://arxiv.org/abs/1610.02132):

1. ``norm = ||x||_2`` (``int8``: ``max |x|`` per block of 512 elements, which
   wastes fewer levels: one large layer no longer flattens a small one's
   gradient to level 0; see :mod:`gradwire.compress.blocks`).
2. ``a = |x| / norm * s`` lies in [0, s]; ``level = floor(a + u)`` with
   ``u ~ U[0, 1)`` is ``ceil(a)`` with probability ``a - floor(a)``: unbiased.
3. Payload: ``sign(x) * level`` as int8 (s <= 127) plus the norms (fp32).
4. Decode: ``level * norm / s``.

Pattern: all_gather for ``qsgd`` (int8 levels of different ranks have
different norms); ``int8`` uses the two-phase compressed all_reduce
(:mod:`gradwire.compress.twophase`), about 4x fewer bytes than an fp32 ring
all_reduce at any world size (``int8:allgather`` grows with the world size).

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

from ._rng import CallCounter, uniform
from .base import Compressor, Ctx, Pattern
from .blocks import block_scales, mul_blocks_


class QSGDCompressor(Compressor):
    """Unbiased stochastic quantisation to ``levels`` levels per sign, int8 on the wire."""

    name = "qsgd"
    pattern = Pattern.ALLGATHER
    unbiased = True

    def __init__(self, levels: int = 16, norm: str = "l2", seed: int | None = None, block: int | None = None,
                 pattern: Pattern | str = Pattern.ALLGATHER) -> None:
        if not 1 <= int(levels) <= 127:
            raise ValueError(f"qsgd levels must be an integer in [1, 127] (int8 payload), got {levels}")
        if norm not in ("l2", "max"):
            raise ValueError(f"qsgd norm must be 'l2' or 'max', got {norm!r}")
        if block and norm != "max":
            raise ValueError("per-block scales (block=N) need norm='max'")
        if int(block or 0) < 0:
            raise ValueError(f"block must be >= 0 (0: one norm per tensor), got {block}")
        self.pattern = Pattern(pattern)
        if self.pattern is Pattern.ALLREDUCE:
            raise ValueError("qsgd payloads are not summable; pattern must be 'allgather' or 'two_phase'")
        self.levels = int(levels)
        self.norm = norm
        self.block = int(block or 0)
        self._rng = CallCounter(seed)

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        x = flat.float()
        if self.norm == "l2":
            norm = torch.linalg.vector_norm(x, 2).reshape(1)
        else:
            norm = block_scales(x, self.block, "max")
        # 1/norm, with 0 for zero or non-finite norms (a NaN stays visible through the norm itself)
        finite = torch.isfinite(norm) & (norm > 0)
        mult = torch.where(finite, self.levels / norm.where(finite, torch.ones_like(norm)), torch.zeros_like(norm))
        a = mul_blocks_(x.abs(), mult, self.block)
        a.add_(uniform(a.shape, self._rng.generator(ctx.key, a.device), a.device)).floor_()
        levels = a.copysign_(x).to(torch.int8)
        return [levels, norm.float()]

    def slice_units(self) -> tuple[int, ...] | None:
        return (1, self.block) if self.block else None  # one norm for the whole tensor is not local

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        levels, norm = payload
        return mul_blocks_(levels.float(), norm / self.levels, self.block)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.load_state_dict(state["rng"])
