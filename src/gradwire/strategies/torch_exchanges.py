"""PyTorch's own DDP comm hooks as ``gradwire predict`` replays them (:class:`~gradwire.strategies.base.ExchangeModel`).

Each model says what the hook issues for one bucket and mirrors the tensor
work it does around its collectives, stage by stage, with the hook's own
helpers where PyTorch has them, so that predict can time that work on the
machine without a process group. The stages follow torch 2.13's
``torch/distributed/algorithms/ddp_comm_hooks`` (``tests/predict`` checks
the collectives against the real hooks):

``fp16_compress_hook`` (:class:`TorchFP16Exchange`)
    1. the bucket cast to fp16 and divided by the world size (training thread);
    2. one all_reduce of the fp16 tensor;
    3. the result copied back into the fp32 bucket (callback).

``powerSGD_hook`` at rank ``R``, after its warm-up (:class:`TorchPowerSGDExchange`)
    Every parameter of the bucket is viewed as a matrix ``n x m`` (its first
    dimension by the rest) and compressed when ``(n + m) r`` with
    ``r = min(n, m, R)``, times ``min_compression_rate`` (2), is below
    ``n m``; vectors (biases) and small matrices are not.

    1. error feedback added to the bucket and the bucket cloned; the
       uncompressed tensors concatenated; every warm-started ``Q``
       orthogonalised (QR for ``r > 2``, Gram-Schmidt below); ``P = M Q``
       per matrix (training thread);
    2. all_reduce of the uncompressed tensors;
    3. they are divided and copied back into the bucket (callback);
    4. all_reduce of every ``P``, as one tensor;
    5. every ``P`` orthogonalised, ``Q = M^T P`` per matrix (callback);
    6. all_reduce of every ``Q``;
    7. ``M = P Q^T`` per matrix into the bucket, the new error (callback).

    Three collectives, one after another. The callback of the first issues
    the second and waits for it with ``.wait()`` on its future, and so does
    the next callback for the third: only the first is chained on (``.then``).

Trap: without the parameters' shapes (a profile that recorded only bucket
sizes) the PowerSGD model views the bucket as one near-square matrix, as
gradwire's ``powersgd`` does; the real hook compresses per parameter, so
its bytes and its work then differ from the model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = ["TorchFP16Exchange", "TorchPowerSGDExchange"]

#: PowerSGDState's default ``min_compression_rate``
_MIN_COMPRESSION_RATE = 2.0


def _bucket(numel: int, shapes: Sequence[tuple[int, ...]], device: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A random bucket of ``numel`` elements and its parameters' views, in bucket order."""
    gen = torch.Generator(device=device).manual_seed(0)
    flat = torch.randn(numel, generator=gen, device=device)
    views, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        views.append(flat[offset:offset + n].view(shape))
        offset += n
    return flat, views


@dataclass(frozen=True)
class TorchFP16Exchange:
    """``default_hooks.fp16_compress_hook`` (module doc)."""

    @property
    def name(self) -> str:
        return "torch-fp16"

    def collectives(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int) -> list[tuple[str, int]]:
        return [("all_reduce", 2 * numel)]

    def stages(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int,
               device: str) -> list[Callable[[], object]]:
        flat, _ = _bucket(numel, (), device)
        half = flat.to(torch.float16)
        return [lambda: flat.to(torch.float16).div_(world), lambda: flat.copy_(half)]


def _matrices(numel: int, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """Each parameter as the hook views it, ``(n, m)``; one near-square matrix when the shapes are unknown."""
    if not shapes:
        rows = max(1, math.isqrt(numel))
        return [(rows, -(-numel // rows))]
    return [(s[0], math.prod(s) // s[0]) if s and s[0] else (1, math.prod(s)) for s in shapes]


def _compressed(n: int, m: int, rank: int) -> bool:
    """``powerSGD_hook._should_compress`` with the state's default rate."""
    r = min(n, m, rank)
    return (n + m) * r * _MIN_COMPRESSION_RATE < n * m


@dataclass(frozen=True)
class TorchPowerSGDExchange:
    """``powerSGD_hook.powerSGD_hook`` at matrix approximation rank ``rank`` (module doc)."""

    rank: int

    @property
    def name(self) -> str:
        return f"torch-powersgd:{self.rank}"

    def collectives(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int) -> list[tuple[str, int]]:
        plain = ps = qs = 0
        for n, m in _matrices(numel, shapes):
            r = min(n, m, self.rank)
            if _compressed(n, m, self.rank):
                ps, qs = ps + n * r, qs + m * r
            else:
                plain += n * m
        return [("all_reduce", 4 * plain), ("all_reduce", 4 * ps), ("all_reduce", 4 * qs)]

    def stages(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int,
               device: str) -> list[Callable[[], object]]:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

        flat, views = _bucket(numel, shapes, device)
        if not shapes:  # one near-square matrix, zero padded
            (n, m), = _matrices(numel, ())
            views = [torch.zeros(n * m, device=device).view(n, m)]
        matrices: list[torch.Tensor] = []
        plain: list[torch.Tensor] = []
        for v in views:
            matrix = v.view(v.shape[0], -1) if v.dim() else v.view(1, 1)
            n, m = matrix.shape
            (matrices if _compressed(n, m, self.rank) else plain).append(matrix)
        ranks = [min(*x.shape, self.rank) for x in matrices]
        batched = [x.unsqueeze(0) for x in matrices]
        p_memory = torch.randn(sum(x.shape[0] * r for x, r in zip(matrices, ranks)), device=device)
        q_memory = torch.randn(sum(x.shape[1] * r for x, r in zip(matrices, ranks)), device=device)
        ps, qs, p_at, q_at = [], [], 0, 0
        for x, r in zip(matrices, ranks):
            n, m = x.shape
            ps.append(p_memory[p_at:p_at + n * r].view(1, n, r))
            qs.append(q_memory[q_at:q_at + m * r].view(1, m, r))
            p_at, q_at = p_at + n * r, q_at + m * r
        state = {"plain": torch.empty(0, device=device), "copy": flat, "error": torch.zeros_like(flat)}

        def encode() -> None:
            flat.add_(state["error"])
            state["copy"] = flat.detach().clone()
            state["plain"] = torch.cat([t.reshape(-1) for t in plain]) if plain else torch.empty(0, device=device)
            for q in qs:
                _orthogonalize(q, 0)
            for x, q, p in zip(batched, qs, ps):
                torch.bmm(x, q, out=p)

        def unpack() -> None:
            memory = state["plain"].div_(world)
            at = 0
            for t in plain:
                t.copy_(memory[at:at + t.numel()].view_as(t))
                at += t.numel()

        def compute_qs() -> None:
            for p in ps:
                _orthogonalize(p, 0)
            for x, p, q in zip(batched, ps, qs):
                torch.bmm(x.transpose(1, 2), p, out=q)

        def decompress() -> None:
            q_memory.div_(world)
            for p, q, x in zip(ps, qs, batched):
                torch.bmm(p, q.transpose(1, 2), out=x)
            state["error"] = state["copy"] - flat

        return [encode, unpack, compute_qs, decompress]
