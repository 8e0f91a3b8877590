"""The compressor interface shared by every compressor (GRACE-style).

A compressor turns one tensor into a *payload* (the tensors that cross the
wire) and a *context* (what stays on this rank to undo the encoding):

1. ``compress(tensor, key) -> (payload, ctx)``: flattens the tensor, lets the
   subclass ``encode`` the flat view, and records shape/dtype in ``ctx``.
2. The payload is exchanged according to ``pattern`` (see :class:`Pattern`);
   compressors with ``rounds > 1`` (PowerSGD) compute the next payload from the
   averaged one with ``next_round``.
3. ``finish(payload, ctx)`` sees the final exchanged payload once (the same on
   every rank); stateful compressors record shared state there.
4. ``decompress(payload, ctx) -> tensor`` of the original shape and dtype;
   ``combine(payloads, ctx)`` averages the gathered payloads of all ranks.

Traps:
- Integer and empty tensors are passed through uncompressed: the payload is the
  tensor itself and ``decompress`` returns it.
- A payload may alias the input (``none``); callers must not modify the input
  before the payload has been sent.
- Payload shapes depend only on the input's numel and the parameters, never on
  its values, so every rank's payload has the same layout (all_gather needs it).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch
from torch import Tensor

__all__ = ["Compressor", "Ctx", "PayloadLayout", "Pattern", "deserialize", "payload_nbytes", "roundtrip", "serialize"]

#: where each payload tensor lies in a serialised buffer: (dtype, shape, byte offset, byte count)
PayloadLayout = list[tuple[torch.dtype, torch.Size, int, int]]


class Pattern(enum.Enum):
    """How a compressor's payload is exchanged between ranks."""

    #: payloads are linear: all_reduce (sum) of the pre-divided payload averages.
    ALLREDUCE = "allreduce"
    #: all_gather the payloads, then ``combine`` (decompress each and average).
    ALLGATHER = "allgather"
    #: all_to_all of compressed chunks, server-side averaging and
    #: re-compression, then all_gather of the compressed chunks.
    TWO_PHASE = "two_phase"


@dataclass
class Ctx:
    """What a rank keeps locally between ``compress`` and ``decompress``."""

    shape: torch.Size
    dtype: torch.dtype
    numel: int
    key: Hashable
    passthrough: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Compressor:
    """Base class: subclasses implement ``encode`` and ``decode`` on flat tensors.

    Class attributes:
        name: registry name.
        pattern: how the payload is exchanged.
        rounds: number of all_reduce rounds (only ``Pattern.ALLREDUCE``).
        unbiased: E[decompress(compress(x))] == x.
        averages: the exchange returns the mean of the ranks' decoded payloads
            (False for a vote); the local correction of
            :class:`gradwire.exchange.CompressionState` needs it.
    """

    name: str = "base"
    pattern: Pattern = Pattern.ALLREDUCE
    rounds: int = 1
    unbiased: bool = False
    averages: bool = True
    #: steps the hooks reduce uncompressed before compressing (``name:warmup=N``; 0: the hook's default)
    warmup: int = 0
    #: buckets below this many elements are fused into one exchange (``name:fuse=N``; None: the hook's default)
    fuse: int | None = None
    #: the exchange applies each rank's own compression error at once (``name:correct=1``; replicas then differ)
    correct: bool = False
    #: percent of the dropped error that error feedback keeps for the next step (``name:ef=N``; 100: all of it)
    ef: int = 100

    # -- what subclasses implement -------------------------------------------
    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        """Encode a contiguous 1-D floating tensor; may store data in ``ctx.info``."""
        raise NotImplementedError

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """Return a 1-D tensor of ``ctx.numel`` elements (any floating dtype)."""
        raise NotImplementedError

    def slice_units(self) -> tuple[int, ...] | None:
        """Input elements per element of each payload tensor, if the encoding is local; else None.

        Local means: for ``a`` and ``b`` multiples of every unit, the payload of
        ``x[a:b]`` is the slice ``[a // u : ceil(b / u)]`` of each payload tensor
        of ``x`` (a sign per element packed 8 per byte: unit 8; a scale per block
        of 512: unit 512). The two-phase exchange then encodes a bucket once
        instead of once per chunk (see :mod:`gradwire.compress.twophase`).
        """
        return None

    # -- the public interface ------------------------------------------------
    def compress(self, tensor: Tensor, key: Hashable = 0) -> tuple[list[Tensor], Ctx]:
        """Compress ``tensor``; ``key`` names it for per-tensor state (e.g. a bucket index)."""
        ctx = Ctx(tensor.shape, tensor.dtype, tensor.numel(), key)
        if tensor.numel() == 0 or not tensor.is_floating_point():
            ctx.passthrough = True
            return [tensor], ctx
        return self.encode(tensor.reshape(-1).contiguous(), ctx), ctx

    def next_round(self, payload: list[Tensor], ctx: Ctx) -> list[Tensor]:
        """Compute the next round's payload from the averaged one (``rounds > 1``)."""
        raise NotImplementedError(f"{self.name} has a single round")

    def finish(self, payload: list[Tensor], ctx: Ctx) -> None:
        """Observe the final averaged payload; identical on every rank."""

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """Rebuild a tensor of the original shape and dtype."""
        if ctx.passthrough:
            return payload[0]
        out = self.decode(payload, ctx)
        return out.to(ctx.dtype).view(ctx.shape)

    def decompress_into(self, payload: list[Tensor], ctx: Ctx, out: Tensor) -> Tensor:
        """:meth:`decompress` written into ``out`` (``ctx.numel`` elements); returns ``out``.

        Compressors that can decode in place override it (calling :func:`check_out`); the default copies.
        """
        check_out(out, ctx)
        out.copy_(self.decompress(payload, ctx).reshape(out.shape))
        return out

    def combine(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """Average the gathered payloads of all ranks (``Pattern.ALLGATHER``)."""
        if ctx.passthrough:
            return _mean_passthrough(payloads, ctx)
        acc = self.decode(payloads[0], ctx).float()
        for p in payloads[1:]:
            acc += self.decode(p, ctx)
        acc /= len(payloads)
        return acc.to(ctx.dtype).view(ctx.shape)

    # -- state (for checkpoints) ---------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """State that must survive a checkpoint (warm starts, step counters)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def __repr__(self) -> str:
        return f"<compressor {self.name} pattern={self.pattern.value}>"


def _mean_passthrough(payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
    total = torch.stack([p[0] for p in payloads]).double().mean(0)
    return total.to(ctx.dtype).view(ctx.shape)


def roundtrip(compressor: Compressor, tensor: Tensor, key: Hashable = 0) -> Tensor:
    """Compress and decompress on one rank (world size 1), running every round."""
    payload, ctx = compressor.compress(tensor, key)
    for _ in range(compressor.rounds - 1):
        if ctx.passthrough:
            break
        payload = compressor.next_round(payload, ctx)
    compressor.finish(payload, ctx)
    return compressor.decompress(payload, ctx)


def payload_nbytes(payload: list[Tensor]) -> int:
    """Bytes the payload puts on the wire."""
    return sum(p.numel() * p.element_size() for p in payload)


def check_out(out: Tensor, ctx: Ctx) -> None:
    """Raise ValueError unless ``out`` can take the ``ctx.numel`` decoded values."""
    if out.numel() != ctx.numel:
        raise ValueError(f"decompress_into: out holds {out.numel()} elements, the payload decodes to {ctx.numel}; "
                         f"pass a tensor of {ctx.numel} elements")


def serialize(payload: list[Tensor], nbytes: int | None = None) -> tuple[Tensor, PayloadLayout]:
    """One uint8 buffer holding every payload tensor at an 8-byte aligned offset.

    ``nbytes`` pads the buffer to that size (rows of one all_gather must be equal).
    """
    layout, offset = [], 0
    for p in payload:
        size = p.numel() * p.element_size()
        layout.append((p.dtype, p.shape, offset, size))
        offset += -(-size // 8) * 8
    if nbytes is not None and nbytes < offset:
        raise ValueError(f"payload needs {offset} bytes, the buffer holds {nbytes}")
    device = payload[0].device if payload else None
    buf = torch.zeros(offset if nbytes is None else nbytes, dtype=torch.uint8, device=device)
    for p, (_, _, start, size) in zip(payload, layout):
        buf[start : start + size] = p.contiguous().view(-1).view(torch.uint8)
    return buf, layout


def deserialize(buf: Tensor, layout: PayloadLayout) -> list[Tensor]:
    """Views of the payload tensors in ``buf`` (inverse of :func:`serialize`)."""
    return [buf[start : start + size].view(dtype).view(shape) for dtype, shape, start, size in layout]
