"""``auto``: a choice among compressors, and the price of each one's exchange on a link (pure).

:class:`AutoCompressor` names the candidates (``auto`` = ``none``, ``fp16``,
``int8``, ``onebit``; ``auto:fp16/onebit`` a subset, ``none`` always in it)
and how often to probe the link (``every=K`` steps at first). It compresses nothing itself:
:class:`gradwire.exchange.CompressionState` asks its chooser which candidate
each exchange uses (:mod:`gradwire.exchange.chooser`).

The price of one exchange of ``n`` elements with compressor ``c`` on a link
of per-collective cost ``alpha`` and ``beta`` seconds per bus byte
(nccl-tests' bus bandwidth convention, so one fit serves every op)::

    T_c(n) = cpu_c(n) + sum over c's collectives (alpha + beta * busbytes)

with the collectives of c's pattern as the hooks issue them
(:mod:`gradwire.exchange.patterns`): all_reduce of each payload tensor per round
(busbytes ``2 (w-1)/w`` of its size), two-phase all_to_all then all_gather
of ``w`` rows of the longest chunk's payload (``(w-1)/w`` of the ``w``
rows each), all_gather of the serialised payloads (``(w-1)/w`` of ``w``
rows). Payload sizes are exact: a compressor's payload shapes depend on the
element count alone, so the payload of ``n`` zeros is measured once.

Traps: the price is of the exchange alone, as if nothing overlapped it
(backward's compute does, for DDP's first buckets; ``delayed`` hides all of
it); a choice near the crossover can be either, and the chooser keeps its
current choice unless another is clearly cheaper.
"""
from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass

import torch

from .base import Compressor, Ctx, Pattern
from .twophase import chunk_bounds, chunk_granule

__all__ = ["AUTO_CANDIDATES", "AlphaBeta", "AutoCompressor", "exchange_busbytes", "payload_bits", "price"]

#: what ``auto`` chooses from by default (``none`` is always a candidate)
AUTO_CANDIDATES = ("fp16", "int8", "onebit")
#: steps between two decisions by default
AUTO_EVERY = 10


class AutoCompressor(Compressor):
    """The candidates of an ``auto`` exchange (see the module doc); never compresses by itself.

    Args:
        candidates: compressors to choose from besides ``none`` (each must
            average: a vote such as ``signum`` cannot be mixed with averages).
        every: steps between two probes of the link (>= 1); they move apart, up to 8 times that, while
            the link and the choices stay put (:mod:`gradwire.exchange.chooser`).
    """

    name = "auto"
    pattern = Pattern.TWO_PHASE

    def __init__(self, candidates: list[Compressor], every: int = AUTO_EVERY) -> None:
        if every < 1:
            raise ValueError(f"auto: every must be >= 1 step, got {every}")
        names = [c.name for c in candidates]
        for c in candidates:
            if not c.averages:
                raise ValueError(f"auto: {c.name} is a vote, not an average; auto mixes averages only "
                                 f"(candidates: none, fp16, bf16, int8, onebit, qsgd, topk, powersgd, ...)")
            if isinstance(c, AutoCompressor):
                raise ValueError("auto cannot choose among autos")
        if len(set(names)) != len(names):
            raise ValueError(f"auto: a candidate appears twice in {'/'.join(names)}")
        self.candidates = list(candidates)
        self.every = int(every)

    def encode(self, flat: torch.Tensor, ctx: Ctx) -> list[torch.Tensor]:
        raise RuntimeError("auto compresses nothing itself: CompressionState chooses a candidate per exchange "
                           "(use it through CompressionState, the DDP hook or a strategy)")

    def decode(self, payload: list[torch.Tensor], ctx: Ctx) -> torch.Tensor:
        raise RuntimeError("auto decodes nothing itself (see encode)")

    def __repr__(self) -> str:
        return f"<compressor auto of none/{'/'.join(c.name for c in self.candidates)} every={self.every}>"


@dataclass(frozen=True)
class AlphaBeta:
    """A collective's cost as measured: ``alpha`` seconds per collective plus ``beta`` seconds per bus byte.

    What the ``auto`` chooser fits from its probes; the network model's own link is
    :class:`gradwire.net.link.Link`.
    """

    alpha: float
    beta: float

    def seconds(self, busbytes: float) -> float:
        return self.alpha + self.beta * busbytes

    @property
    def bus_bandwidth(self) -> float:
        """Bytes per second (inf for a link with no per-byte cost)."""
        return math.inf if self.beta <= 0 else 1.0 / self.beta


@functools.lru_cache(maxsize=4096)
def _payload(compressor: Compressor, numel: int) -> tuple[tuple[int, ...], ...]:
    """Bytes of each payload tensor per round for ``numel`` zeros (cached per compressor object and size)."""
    twin = copy.deepcopy(compressor)  # its random streams and warm starts stay the real one's
    payload, ctx = twin.compress(torch.zeros(numel))
    rounds = [tuple(p.numel() * p.element_size() for p in payload)]
    for _ in range(compressor.rounds - 1):
        payload = twin.next_round(payload, ctx)
        rounds.append(tuple(p.numel() * p.element_size() for p in payload))
    return tuple(rounds)


def payload_bits(compressor: Compressor, numel: int = 1 << 16) -> float:
    """Bits per element of the first round's payload of ``numel`` elements (32 for ``none`` on fp32)."""
    return 8 * sum(_payload(compressor, numel)[0]) / numel


def exchange_busbytes(compressor: Compressor, numel: int, world: int, element_size: int = 4) -> list[float]:
    """The bus bytes of each collective ``compressor``'s exchange of ``numel`` elements issues (module doc).

    ``none`` (and any compressor that keeps the tensor) is one all_reduce of
    ``numel * element_size`` bytes. A world of one sends nothing.
    """
    if world <= 1 or numel == 0:
        return []
    share = (world - 1) / world
    if compressor.name == "none":
        return [2 * share * numel * element_size]
    if compressor.pattern is Pattern.ALLREDUCE:
        return [2 * share * b for rnd in _payload(compressor, numel) for b in rnd]
    if compressor.pattern is Pattern.TWO_PHASE:
        longest = max(count for _, count in chunk_bounds(numel, world, chunk_granule(compressor)))
        row = _padded(sum(_payload(compressor, longest)[0]))
        return [share * world * row, share * world * row]
    row = _padded(sum(_payload(compressor, numel)[0]))
    return [share * world * row]


def _padded(nbytes: int) -> int:
    """Serialised rows pad each payload tensor to 8 bytes (gradwire.compress.base.serialize); at least 8."""
    return max(8, -(-nbytes // 8) * 8)


def price(compressor: Compressor, numel: int, world: int, link: AlphaBeta, cpu_seconds: float = 0.0,
          element_size: int = 4) -> float:
    """Seconds of one exchange (module doc): its collectives on ``link`` plus ``cpu_seconds`` of coding."""
    return cpu_seconds + sum(link.seconds(b) for b in exchange_busbytes(compressor, numel, world, element_size))
