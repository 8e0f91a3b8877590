"""Per-block scales: one fp32 scale per ``block`` consecutive elements.

A single scale for a whole DDP bucket mixes layers whose gradients differ by
orders of magnitude (a conv bias and a wide linear weight): every element of a
small-gradient layer is then sent as ``±scale`` of the large ones, and error
feedback has to cancel that noise step after step. One scale per block (512
elements by default: 4 bytes per 64 bytes of packed signs) keeps the scale
local at a cost of ``32 / block`` bits per element.

The last block may be shorter than ``block``; its scale divides by its own
length. ``block=None`` (or 0) means one block for the whole tensor.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["block_scales", "mul_blocks_", "num_blocks"]


def num_blocks(numel: int, block: int | None) -> int:
    """How many scales a tensor of ``numel`` elements carries (at least 1)."""
    if not block or numel <= block:
        return 1
    return math.ceil(numel / block)


def _split(x: Tensor, block: int | None) -> tuple[Tensor | None, Tensor | None]:
    """(full blocks as ``[k, block]``, tail) of a 1-D tensor; either may be None."""
    n = x.numel()
    if not block or n <= block:
        return None, x
    full = n // block
    head = x[: full * block].view(full, block)
    tail = x[full * block:] if full * block < n else None
    return head, tail


def block_scales(x: Tensor, block: int | None, kind: str = "mean") -> Tensor:
    """fp32 scales of the blocks of 1-D ``x``: ``mean |x|``, ``sqrt(mean x^2)`` or ``max |x|`` per block.

    NaN/inf make that block's scale NaN/inf (visible), and only that block's.
    """
    if kind not in ("mean", "rms", "max"):
        raise ValueError(f"scale kind must be 'mean', 'rms' or 'max', got {kind!r}")
    head, tail = _split(x, block)
    parts = []
    for part in (head, tail):
        if part is None or part.numel() == 0:
            continue
        if kind == "rms":
            s = torch.linalg.vector_norm(part.float(), 2, dim=-1) / part.shape[-1] ** 0.5
        elif kind == "mean":
            s = torch.linalg.vector_norm(part.float(), 1, dim=-1) / part.shape[-1]
        else:
            s = torch.linalg.vector_norm(part.float(), float("inf"), dim=-1)
        parts.append(s.reshape(-1))
    if not parts:
        return torch.zeros(1, device=x.device)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def mul_blocks_(y: Tensor, scales: Tensor, block: int | None) -> Tensor:
    """Multiply each block of 1-D ``y`` by its scale, in place; returns ``y``."""
    head, tail = _split(y, block)
    k = 0
    if head is not None:
        k = head.shape[0]
        head.mul_(scales[:k, None])
    if tail is not None and tail.numel():
        tail.mul_(scales[k])
    return y
