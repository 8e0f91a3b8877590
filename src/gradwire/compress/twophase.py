"""Two-phase compressed all_reduce: the tensor-only steps, for any single-round compressor.

DeepSpeed's compressed all_reduce (1-bit Adam, Tang et al., 2021,
https://arxiv.org/abs/2102.02888), generalised to any compressor whose
payload shape depends only on the element count (``onebit``, ``int8``). The
collectives live in :mod:`gradwire.exchange.patterns`; this module is pure
tensor code:

1. ``split_encode``: cut the (error-compensated) tensor into ``world`` chunks
   (lengths a multiple of 8, the last one shorter); compress each chunk and
   serialise it into one uint8 row per destination rank, every row padded to
   the same byte count. Also returns this rank's local approximation (for the
   worker's error feedback) and the :class:`ChunkPlan` (chunk bounds, layouts).
2. all_to_all: rank ``j`` receives chunk ``j`` from every rank.
3. ``server_combine``: decompress and average the ``world`` rows of this
   rank's chunk; the caller adds the server residual, and ``encode_row``
   re-compresses the chunk as one row (``server_reduce`` does both, without
   error feedback).
4. all_gather of the rows; ``gather_decode`` rebuilds the full tensor.

Bytes per rank: ``2 (world-1)/world * payload(n)`` versus ``2 (world-1)/world
* 4n`` for an fp32 ring all_reduce, whatever the world size: about 30x less
for ``onebit`` (block 512), 4x for ``int8``.

A compressor whose encoding is local (:meth:`Compressor.slice_units`: a
sign per element, a scale per block) is encoded once for the whole tensor and
its payload sliced into the chunks, whose bounds are then multiples of the
block; the gathered chunks join back into one payload, decoded in one pass.
Same bytes, less CPU time (one pass instead of ``world`` small ones;
``benchmarks/onebit_delayed_step.py`` times the whole step).

Traps: chunks are compressed at their real length (no zero padding enters a
scale); only the serialised rows are padded. A rank whose chunk is empty
(``numel < granule * world``) sends and receives empty payloads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

import torch
from torch import Tensor

from .base import Compressor, Ctx, PayloadLayout, deserialize, serialize

__all__ = ["ChunkPlan", "chunk_bounds", "chunk_granule", "encode_row", "gather_decode", "server_combine", "server_reduce",
           "slice_payload", "split_encode"]


@dataclass
class ChunkPlan:
    """How one tensor is cut and serialised; identical on every rank (it depends on numel only)."""

    numel: int
    bounds: list[tuple[int, int]]
    """(start, count) of each rank's chunk"""
    layouts: list[PayloadLayout]
    ctxs: list[Ctx]
    row_bytes: int
    whole: Ctx | None = None
    """the context of the whole tensor when the compressor's encoding is local (sliced chunks)"""


def chunk_bounds(numel: int, world: int, granule: int = 8) -> list[tuple[int, int]]:
    """(start, count) of each of ``world`` chunks; lengths a multiple of ``granule`` but the last."""
    length = max(granule, granule * math.ceil(numel / (granule * world)))
    return [(min(r * length, numel), max(0, min(length, numel - r * length))) for r in range(world)]


def chunk_granule(compressor: Compressor) -> int:
    """Chunk lengths (but the last) are multiples of this: 8, or the blocks of a local encoding."""
    units = compressor.slice_units()
    return math.lcm(8, *units) if units else 8


def slice_payload(payload: list[Tensor], units: tuple[int, ...], start: int, count: int) -> list[Tensor]:
    """The payload of ``x[start : start + count]`` cut from the payload of ``x`` (see ``slice_units``)."""
    return [p[start // u : -(-(start + count) // u)] for p, u in zip(payload, units)]


def _check(compressor: Compressor) -> None:
    if compressor.rounds != 1:
        raise ValueError(f"{compressor.name} needs {compressor.rounds} rounds; two-phase takes one-round compressors")


def split_encode(flat: Tensor, world: int, compressor: Compressor, key: Hashable = 0,
                 approx: Tensor | None = None) -> tuple[Tensor, Tensor, ChunkPlan]:
    """Phase 1 input: uint8 ``[world, row_bytes]`` rows, the local approximation (numel) and the plan.

    ``approx``: a buffer of ``flat``'s size and dtype to write the approximation into
    (error feedback passes its residual buffer: see :meth:`ErrorFeedback.workspace`).
    """
    _check(compressor)
    units = compressor.slice_units() if flat.is_floating_point() else None
    whole = None
    if units:
        bounds = chunk_bounds(flat.numel(), world, chunk_granule(compressor))
        payload, whole = compressor.compress(flat, key)
        if approx is None:
            approx = compressor.decompress(payload, whole).reshape(-1)
        else:
            compressor.decompress_into(payload, whole, approx)
        payloads, ctxs = [], []
        for r, (start, count) in enumerate(bounds):
            if count:
                payloads.append(slice_payload(payload, units, start, count))
                ctxs.append(Ctx(torch.Size([count]), flat.dtype, count, (key, r)))
            else:  # an empty chunk passes through, as compress() would have it
                p, ctx = compressor.compress(flat[start:start], (key, r))
                payloads.append(p)
                ctxs.append(ctx)
    else:
        bounds = chunk_bounds(flat.numel(), world)
        payloads, ctxs = [], []
        if approx is None:
            approx = torch.empty_like(flat)
        for r, (start, count) in enumerate(bounds):
            payload, ctx = compressor.compress(flat[start : start + count], (key, r))
            approx[start : start + count] = compressor.decompress(payload, ctx)
            payloads.append(payload)
            ctxs.append(ctx)
    bufs = [serialize(p) for p in payloads]
    row_bytes = max(8, max(b.numel() for b, _ in bufs))
    send = torch.zeros(world, row_bytes, dtype=torch.uint8, device=flat.device)
    for r, (b, _) in enumerate(bufs):
        send[r, : b.numel()] = b
    return send, approx, ChunkPlan(flat.numel(), bounds, [lay for _, lay in bufs], ctxs, row_bytes, whole)


def server_combine(received: Tensor, plan: ChunkPlan, rank: int, compressor: Compressor) -> Tensor:
    """Phase 1 output on the server: the average of this rank's chunk over every rank's row (flat)."""
    layout, ctx = plan.layouts[rank], plan.ctxs[rank]
    return compressor.combine([deserialize(row, layout) for row in received.unbind(0)], ctx).reshape(-1)


def encode_row(chunk: Tensor, plan: ChunkPlan, rank: int, compressor: Compressor, key: Hashable = 0,
               approx: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Phase 2 input: the (compensated) chunk compressed into one uint8 ``[row_bytes]`` row, and its approximation.

    ``approx``: a buffer of the chunk's size to decode the approximation into
    (the server's error feedback lends its residual buffer).
    """
    payload, ctx = compressor.compress(chunk, (key, "server", rank))
    if approx is None:
        approx = compressor.decompress(payload, ctx).reshape(-1)
    else:
        compressor.decompress_into(payload, ctx, approx)
    row, _ = serialize(payload, plan.row_bytes)
    return row, approx


def server_reduce(received: Tensor, plan: ChunkPlan, rank: int, compressor: Compressor, key: Hashable = 0) -> Tensor:
    """The server step without error feedback: combine this rank's chunk and re-compress it as one row."""
    row, _ = encode_row(server_combine(received, plan, rank, compressor), plan, rank, compressor, key)
    return row


def gather_decode(rows: Tensor, plan: ChunkPlan, compressor: Compressor, out: Tensor | None = None) -> Tensor:
    """Phase 2 output: decompress the gathered ``[world, row_bytes]`` rows into ``plan.numel`` values."""
    if out is None:
        out = torch.empty(plan.numel, device=rows.device)
    flat = out.view(-1)
    if plan.whole is not None:  # local encoding: join the chunks' payloads, decode once
        parts = [deserialize(rows[r], plan.layouts[r]) for r, (_, count) in enumerate(plan.bounds) if count]
        if parts:
            joined = [torch.cat(tensors) for tensors in zip(*parts)]
            compressor.decompress_into(joined, plan.whole, flat)
        return out
    for r, (start, count) in enumerate(plan.bounds):
        if count:
            compressor.decompress_into(deserialize(rows[r], plan.layouts[r]), plan.ctxs[r], flat[start : start + count])
    return out
