"""``none``: no compression; the payload is the tensor itself (the reference)."""
from __future__ import annotations

from torch import Tensor

from .base import Compressor, Ctx, Pattern


class NoneCompressor(Compressor):
    """Send the tensor as it is (all_reduce); the baseline every compressor is measured against."""

    name = "none"
    pattern = Pattern.ALLREDUCE
    unbiased = True

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        return [flat]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return payload[0]
