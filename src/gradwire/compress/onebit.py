"""``onebit``: signs with one mean-magnitude scale per block, 8 signs per byte.

1-bit SGD (Seide et al., 2014) / DeepSpeed 1-bit Adam (Tang et al., 2021):

1. ``scale_b = sqrt(mean x^2)`` over each block ``b`` of ``block`` elements
   (512 by default, see :mod:`gradwire.compress.blocks`): the decoded block
   keeps the l2 norm of the input. ``rms=0`` uses ``mean |x|`` instead, which
   minimises ``||x - scale * sign(x)||`` and keeps the l1 norm. With error
   feedback the RMS scale trains better (``benchmarks/compress_accuracy.py``
   has both): the larger scale drains the residual of the dominant
   coordinates faster, so the update lags less (see :mod:`gradwire.exchange.state`).
2. Pack ``x < 0`` eight per byte (``numpy.packbits``): ``ceil(n/8)`` bytes.
3. Payload: packed bytes + the fp32 scales: ``n/8 + 4 n/block`` bytes, about
   30x fewer than fp32 at ``block=512`` (32x with ``block=0``, one scale).
4. Decode: one table lookup per byte gives 8 signs, then one multiply per block.
5. ``combine`` (the server step of the two-phase all_reduce, and all_gather)
   decodes every rank's payload in one lookup, scales the ``[world, n]`` signs
   by block and sums over ranks: three passes instead of ``world`` decodes
   and additions.

Patterns: ``two_phase`` (default; a compressed all_reduce, see
:mod:`gradwire.compress.twophase`) or ``allgather`` (bytes grow with the world
size). Names: ``onebit``, ``onebit:allgather``, ``onebit:block=1024``,
``onebit:rms=0``.

It is biased: use it with :class:`~gradwire.compress.errorfeedback.ErrorFeedback`,
and with a momentum optimiser compress the momentum, not the gradient (why:
:mod:`gradwire.exchange.state`).

NaN/inf: the scale of that block becomes NaN/inf, so every decoded value of
that block is non-finite: visible, never silently dropped.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Compressor, Ctx, Pattern, check_out
from .blocks import block_scales, mul_blocks_
from .packing import SIGN_TABLE, decode_table, pack_signs, unpack_signs

__all__ = ["DEFAULT_BLOCK", "OneBitCompressor"]

#: elements per scale; 4 bytes of scale per 64 bytes of signs
DEFAULT_BLOCK = 512


def check_block(block: int | None) -> int:
    """Validate a block size: 0 (one scale per tensor) or a positive multiple of 8."""
    block = int(block or 0)
    if block < 0 or block % 8:
        raise ValueError(f"block must be 0 (one scale per tensor) or a positive multiple of 8, got {block}")
    return block


class OneBitCompressor(Compressor):
    """Sign compression with an RMS (or mean-|x|) scale per block of ``block`` elements."""

    name = "onebit"

    def __init__(self, pattern: Pattern | str = Pattern.TWO_PHASE, block: int | None = DEFAULT_BLOCK,
                 rms: bool | int = True) -> None:
        pattern = Pattern(pattern)
        if pattern is Pattern.ALLREDUCE:
            raise ValueError("onebit payloads are not summable; pattern must be 'two_phase' or 'allgather'")
        self.pattern = pattern
        self.block = check_block(block)
        if int(rms) not in (0, 1):
            raise ValueError(f"rms must be 1 (RMS scale) or 0 (mean |x|), got {rms}")
        self.scale = "rms" if int(rms) else "mean"

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        return [pack_signs(flat), block_scales(flat, self.block, self.scale)]

    def slice_units(self) -> tuple[int, ...] | None:
        return (8, self.block) if self.block else None  # one scale for the whole tensor is not local

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return self._decode(payload, ctx.numel)

    def _decode(self, payload: list[Tensor], n: int, out: Tensor | None = None) -> Tensor:
        """Signs times their block's scale: ``n`` float32 values (written into ``out`` when given)."""
        packed, scales = payload
        if scales.numel() == 1:
            return unpack_signs(packed, n, float(scales), out=out)
        return mul_blocks_(unpack_signs(packed, n, out=out), scales, self.block)

    def decompress_into(self, payload: list[Tensor], ctx: Ctx, out: Tensor) -> Tensor:
        if ctx.passthrough or out.dtype != torch.float32 or not out.is_contiguous() or ctx.dtype != torch.float32:
            return super().decompress_into(payload, ctx, out)  # the generic copy
        check_out(out, ctx)
        self._decode(payload, ctx.numel, out=out.view(-1))
        return out

    def combine(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        world = len(payloads)
        if ctx.passthrough or world < 2:
            return super().combine(payloads, ctx)
        n, nbytes = ctx.numel, payloads[0][0].numel()
        packed = torch.stack([p[0] for p in payloads])
        signs = decode_table(packed.reshape(-1), SIGN_TABLE, world * nbytes * 8).view(world, nbytes * 8)[:, :n]
        scales = torch.stack([p[1] for p in payloads])  # [world, blocks]
        block = self.block if self.block and n > self.block else n  # one scale: a single block
        full = n // block
        if full:
            signs[:, : full * block].view(world, full, block).mul_(scales[:, :full, None])
        if full * block < n:
            signs[:, full * block :].mul_(scales[:, full:])
        total = signs[0]  # summed in rank order, as the generic combine does: the same rounding
        for r in range(1, world):
            total.add_(signs[r])
        return total.div_(world).to(ctx.dtype).view(ctx.shape)

    def __repr__(self) -> str:
        return f"<compressor {self.name} pattern={self.pattern.value} block={self.block} scale={self.scale}>"
