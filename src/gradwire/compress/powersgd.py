"""``powersgd:r``: rank-``r`` approximation by one power iteration, two all_reduces.

PowerSGD (Vogels et al., 2019, https://arxiv.org/abs/1905.13727):

1. View the tensor as a matrix ``M`` (``n x m``): its first dim by the rest, or,
   for a flat bucket, a near-square matrix (zero padded).
2. Round 1: ``P = M Q`` with the warm-started ``Q`` (``m x r``, identical on
   every rank: random from a shared seed, then last step's averaged ``Q``);
   ``P`` is all_reduced (averaged).
3. ``P`` is orthogonalised (Gram-Schmidt); round 2: ``Q = M^T P``, all_reduced.
4. Decode: ``P Q^T``. ``finish`` keeps the averaged ``Q`` as the next warm start.

Payload bytes: ``r (n + m)`` floats instead of ``n m``.

Error feedback: the local approximation (what ``decompress`` of this rank's
own round-2 payload gives, ``P Q_local^T``) sums over ranks to ``world`` times
the averaged one, so the generic residual ``M - P Q_local^T`` is exact.

Traps: a NaN makes ``P`` and everything after it NaN (visible); Gram-Schmidt
with an epsilon never divides by zero, unlike a QR that may raise.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ._rng import label, stable_hash
from .base import Compressor, Ctx, Pattern


def orthogonalize(p: Tensor, eps: float = 1e-8) -> Tensor:
    """Gram-Schmidt on the columns of ``p`` in place; returns ``p``."""
    for i in range(p.shape[1]):
        col = p[:, i : i + 1]
        col.div_(torch.linalg.vector_norm(col) + eps)
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1 :]
            rest.sub_(col @ (col.T @ rest))
    return p


def matrix_shape(shape: torch.Size, numel: int) -> tuple[int, int]:
    """The (rows, cols) PowerSGD views a tensor of ``shape`` as."""
    if len(shape) >= 2 and shape[0] > 1 and numel // shape[0] > 1:
        return shape[0], numel // shape[0]
    rows = max(1, math.isqrt(numel))
    return rows, math.ceil(numel / rows)


class PowerSGDCompressor(Compressor):
    """Low-rank compression with warm start; two summable rounds."""

    name = "powersgd"
    pattern = Pattern.ALLREDUCE
    rounds = 2

    def __init__(self, rank: int = 4, seed: int = 0) -> None:
        if int(rank) < 1:
            raise ValueError(f"powersgd rank must be an integer >= 1, got {rank}")
        self.rank = int(rank)
        self.seed = int(seed)
        self._q: dict[str, Tensor] = {}

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        rows, cols = matrix_shape(ctx.shape, ctx.numel)
        x = flat.float()
        if rows * cols != ctx.numel:
            x = torch.cat([x, x.new_zeros(rows * cols - ctx.numel)])
        m = x.view(rows, cols)
        r = min(self.rank, rows, cols)
        q = self._q.get(label(ctx.key))
        if q is None or q.shape != (cols, r):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + stable_hash(ctx.key))
            q = torch.randn(cols, r, generator=g).to(m.device)  # drawn on the CPU: the same on every rank
        ctx.info["m"] = m
        return [m @ q]

    def next_round(self, payload: list[Tensor], ctx: Ctx) -> list[Tensor]:
        p = orthogonalize(payload[0].clone())
        ctx.info["p"] = p
        return [ctx.info["m"].T @ p]

    def finish(self, payload: list[Tensor], ctx: Ctx) -> None:
        if not ctx.passthrough:
            self._q[label(ctx.key)] = payload[0].clone()

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        approx = ctx.info["p"] @ payload[0].T
        return approx.view(-1)[: ctx.numel]

    def state_dict(self) -> dict[str, Any]:
        # sorted: finish() runs in completion callbacks, whose order across buckets may vary
        return {"q": {k: v.clone() for k, v in sorted(self._q.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._q = {k: v.clone() for k, v in state["q"].items()}
