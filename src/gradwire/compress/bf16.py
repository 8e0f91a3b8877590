"""``bf16``: cast to bfloat16 (fp32's range, 8-bit mantissa), summable.

PyTorch refuses its own bf16 hook on CPU by the hook's name; gloo itself
reduces bf16 fine, so this compressor works on CPU process groups.
"""
from __future__ import annotations

import torch

from .fp16 import CastCompressor


class BF16Compressor(CastCompressor):
    """bfloat16 on the wire: no overflow risk, about 3 significant digits."""

    name = "bf16"
    wire_dtype = torch.bfloat16
