"""``fp16``: cast to half precision (2 bytes per element), summable.

Traps: values above 65504 in magnitude become ±inf in fp16. The hooks divide
the payload by the world size before the all_reduce (as PyTorch's
``fp16_compress_hook`` does) so that the sum itself does not overflow.
NaN and inf stay NaN and inf.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Compressor, Ctx, Pattern


class CastCompressor(Compressor):
    """Cast to a narrower floating dtype for the wire and back afterwards."""

    pattern = Pattern.ALLREDUCE
    wire_dtype: torch.dtype = torch.float16

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        return [flat.to(self.wire_dtype)]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return payload[0].to(ctx.dtype)


class FP16Compressor(CastCompressor):
    """IEEE half precision: 10-bit mantissa, range ±65504."""

    name = "fp16"
    wire_dtype = torch.float16
