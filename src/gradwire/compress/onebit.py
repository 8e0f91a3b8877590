"""``onebit``: sign with a mean-magnitude scale, 8 signs per byte.

1-bit SGD (Seide et al., 2014) / DeepSpeed 1-bit Adam (Tang et al., 2021):

1. ``scale = mean |x|`` (the scale that minimises ``||x - scale * sign(x)||``).
2. Pack ``x < 0`` eight per byte (``numpy.packbits``): ``ceil(n/8)`` bytes.
3. Payload: packed bytes + ``scale`` (fp32) -> about 32x fewer bytes than fp32.
4. Decode: one table lookup per byte gives 8 values ``±scale``.

Patterns: ``two_phase`` (default; DeepSpeed's compressed all_reduce, see
:mod:`gradwire.compress.twophase`) or ``allgather`` (``onebit:allgather``;
bytes grow with the world size).

It is biased: use it with :class:`~gradwire.compress.errorfeedback.ErrorFeedback`.

Momentum trap: do not combine gradient error feedback with an optimiser that
keeps momentum. The sign error of step t is fed back at step t+1, and the
momentum buffer integrates every injected error with gain 1/(1-beta) (10x at
0.9) while the error itself is as large as the gradient; the update lags and
oscillates (measured here: 0.49 test accuracy vs 0.95 on the digits CNN).
Compress the *update* instead: ``CompressionState(..., momentum=0.9)`` keeps a
local momentum buffer in the hook, compresses ``m`` with error feedback, and
the optimiser runs without momentum (see :mod:`gradwire.hooks.state`).

NaN/inf: the scale becomes NaN/inf, so every decoded value of that tensor (or
chunk, in two-phase) is non-finite: visible, never silently dropped.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Compressor, Ctx, Pattern
from .packing import pack_signs, unpack_signs

__all__ = ["OneBitCompressor", "decode_rows", "encode_rows"]


def encode_rows(x: Tensor, counts: Tensor) -> Tensor:
    """Encode each row of a 2-D tensor (row length a multiple of 8) as packed signs + scale.

    Args:
        x: ``[rows, length]`` floating tensor; entries past ``counts[r]`` must be zero.
        counts: ``[rows]`` number of real elements per row (the scale's divisor).

    Returns:
        uint8 ``[rows, length / 8 + 4]``: packed signs, then the fp32 scale's bytes.
    """
    scales = torch.linalg.vector_norm(x.float(), 1, dim=1) / counts.clamp(min=1)
    return torch.cat([pack_signs(x), scales.float().view(torch.uint8).view(-1, 4)], dim=1)


def decode_rows(buf: Tensor, length: int, out: Tensor | None = None) -> Tensor:
    """Inverse of :func:`encode_rows`: float32 ``[rows, length]`` (into ``out`` if given)."""
    rows = buf.shape[0]
    scales = buf[:, -4:].reshape(-1).clone().view(torch.float32).tolist()
    if out is None:
        out = torch.empty(rows, length)
    for r in range(rows):
        out[r] = unpack_signs(buf[r, :-4].contiguous(), length, scales[r])
    return out


class OneBitCompressor(Compressor):
    """Sign compression with a per-tensor (or per-chunk, two-phase) mean-|x| scale."""

    name = "onebit"

    def __init__(self, pattern: Pattern | str = Pattern.TWO_PHASE) -> None:
        pattern = Pattern(pattern)
        if pattern is Pattern.ALLREDUCE:
            raise ValueError("onebit payloads are not summable; pattern must be 'two_phase' or 'allgather'")
        self.pattern = pattern

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        scale = torch.linalg.vector_norm(flat, 1).float().div_(flat.numel())
        return [pack_signs(flat), scale.reshape(1)]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        packed, scale = payload
        return unpack_signs(packed, ctx.numel, float(scale))
