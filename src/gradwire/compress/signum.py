"""``signum``: majority vote of signs (signSGD with majority vote).

Bernstein et al., 2018 (https://arxiv.org/abs/1810.05291):

1. Each rank sends its packed signs (``ceil(n/8)`` bytes) and ``mean |x|``
   per block (as ``onebit``).
2. After the all_gather every rank counts the votes per element: ``v = sum_i
   sign_i``.
3. The result is ``sign(v) * mean_i(scale_i)`` per block; a tie gives 0.

Used with the hook's own momentum (``CompressionState(momentum=0.9)``) this is
Signum: the sign of the momentum, voted.

Traps: ``decompress`` of a single payload is that rank's ``scale * sign``
(what error feedback subtracts); only ``combine`` votes. A NaN on any rank
makes that rank's scale NaN, hence the averaged scale and every output NaN.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .base import Ctx, Pattern
from .blocks import mul_blocks_
from .onebit import DEFAULT_BLOCK, OneBitCompressor
from .packing import unpack_signs


class SignumCompressor(OneBitCompressor):
    """Packed signs on the wire, element-wise majority vote after the all_gather."""

    name = "signum"
    averages = False  # a majority vote: EF21's g == mean g_i would not hold

    def __init__(self, block: int | None = DEFAULT_BLOCK) -> None:
        super().__init__(Pattern.ALLGATHER, block, rms=False)

    def combine(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        if ctx.passthrough:
            return super().combine(payloads, ctx)
        world = len(payloads)
        scales = torch.stack([s for _, s in payloads]).mean(0)
        if scales.device.type == "cpu":
            negatives = np.zeros(ctx.numel, dtype=np.int16)
            for packed, _ in payloads:
                negatives += np.unpackbits(packed.numpy(), count=ctx.numel)
            votes = torch.from_numpy(world - 2 * negatives).float()  # sum of ±1
        else:
            votes = torch.stack([unpack_signs(packed, ctx.numel) for packed, _ in payloads]).sum(0)
        return mul_blocks_(votes.sign_(), scales, self.block).to(ctx.dtype).view(ctx.shape)
