"""What a compressor puts on the wire for a bucket, and what it costs the CPU (or GPU) to run it.

Bytes are exact: a compressor's payload shapes depend on the element count
alone (:mod:`gradwire.compress.base`), so the payload of ``n`` zeros has the
size of any bucket of ``n`` elements. Per pattern, as the hooks exchange it
(:mod:`gradwire.exchange.patterns`), in the nccl-tests convention of each op:

- allreduce (fp16, powersgd, randomk): one all_reduce per payload tensor per
  round, of that tensor's bytes;
- allgather (topk, qsgd, terngrad, signum): one all_gather of ``world``
  serialised rows;
- two_phase (onebit, int8): the bucket is cut into ``world`` chunks (lengths
  a multiple of the compressor's granule), each compressed and serialised
  into a row padded to the longest: all_to_all of ``world`` rows, then
  all_gather of ``world`` rows. Small buckets at large ``world`` pay for the
  granule (a 100 K-element bucket over 1024 ranks sends 512-element chunks).

A hook of someone else's (:class:`~gradwire.strategies.ExchangeModel`: PyTorch's
fp16 and PowerSGD hooks) says its collectives itself; its CPU stages are
timed at each bucket's own size and shapes (:class:`HookCost`), since
PowerSGD's work depends on the parameters' shapes, not on the element count.

CPU time (:func:`codec_cost`) is measured here, once per compressor and
device, at two sizes, and fitted as ``a + b n`` per stage: the stages and the
tensor passes :class:`~gradwire.exchange.CompressionState` runs (momentum,
error feedback, the local correction's residual copies where
it is on (``correct=1``); see
:func:`_stages`), on the device the prediction is for (``cuda`` for GPU
clusters when one is here). Trap: on a CPU that other work shares, the
figures move with the load; a profile of the same strategy measures them in
the job itself instead (:class:`~gradwire.predict.timeline.MeasuredExchange`).

A two-phase exchange cuts the bucket into one chunk per rank, and each chunk
costs its own ops (its scale, its packing, its row), while the server's work
on the chunk it serves shrinks with the chunk: at ``world`` ranks a stage
costs ``a + b n + c world + d n / world``, the four fitted from its lines at
:data:`FIT_CHUNKS` and :data:`WIDE_CHUNKS` chunks. Trap: fitted at 4 chunks
alone, a 1-bit exchange at 16 ranks on an A100 read 1.2 ms of encode, serve
and decode where it takes 3.3 ms (each chunk's ops cost 170 us there), and the
error grows with every rank predicted beyond.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from gradwire.compress import Compressor, ErrorFeedback, Pattern, StateKey, get_compressor, is_finite
from gradwire.compress import twophase
from gradwire.compress.base import serialize

if TYPE_CHECKING:
    from gradwire.strategies import ExchangeModel

__all__ = ["FIT_CHUNKS", "FREE", "WIDE_CHUNKS", "CodecCost", "HookCost", "Line", "allgather_row_bytes", "codec_cost",
           "cost_of_stages", "fitted_cost", "longest_chunk", "round_bytes", "serialized_nbytes", "stage_seconds",
           "two_phase_row_bytes"]


@dataclass(frozen=True)
class Line:
    """``fixed + per_element * n`` seconds."""

    fixed: float = 0.0
    per_element: float = 0.0

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_element * n

    @classmethod
    def fit(cls, n1: int, t1: float, n2: int, t2: float) -> "Line":
        slope = max(0.0, (t2 - t1) / (n2 - n1))
        return cls(max(0.0, t1 - slope * n1), slope)

    def scaled(self, factor: float) -> "Line":
        return Line(self.fixed * factor, self.per_element * factor)


@dataclass(frozen=True)
class CodecCost:
    """Seconds a compressed exchange spends computing, per stage (see the module doc)."""

    encode: Line = Line()
    """on the training thread, in the hook: momentum, error feedback, compression"""
    serve: Line = Line()
    """between the collectives (two-phase server step, PowerSGD's next round), callback thread"""
    decode: Line = Line()
    """after the last collective (decode, local correction), callback thread"""
    per_rank: Line = Line()
    """allgather only: decoding each further gathered payload"""
    wide: tuple[Line, ...] = ()
    """two-phase only: the encode, serve and decode lines over :data:`WIDE_CHUNKS` chunks (the others are over
    :data:`FIT_CHUNKS`); empty: the stages do not depend on the world size"""

    def scaled(self, factor: float) -> "CodecCost":
        """Every stage times ``factor`` (the machine slower or faster than when it was measured)."""
        return CodecCost(self.encode.scaled(factor), self.serve.scaled(factor), self.decode.scaled(factor),
                         self.per_rank.scaled(factor), tuple(line.scaled(factor) for line in self.wide))

    def two_phase(self, numel: int, world: int) -> tuple[float, float, float]:
        """Encode, serve and decode seconds of a two-phase exchange of ``numel`` elements over ``world`` ranks
        (module doc: ``a + b n + c world + d n / world`` through the lines at 4 and 16 chunks)."""
        narrow = (self.encode, self.serve, self.decode)
        if not self.wide:
            return (narrow[0](numel), narrow[1](numel), narrow[2](numel))
        lo, hi = FIT_CHUNKS, WIDE_CHUNKS
        out = []
        for at_lo, at_hi in zip(narrow, self.wide):
            # c and b are work that cannot be negative (a timing's noise could make them so, and a large world
            # would multiply it): clamped; d may take either sign (a chunk's padding grows with the world)
            per_chunk = max(0.0, (at_hi.fixed - at_lo.fixed) / (hi - lo))
            shrinking = (at_lo.per_element - at_hi.per_element) / (1 / lo - 1 / hi)  # the d of n / world
            flat = max(0.0, at_lo.per_element - shrinking / lo)  # the b of n
            fixed = max(0.0, at_lo.fixed + per_chunk * (world - lo))
            out.append(max(0.0, fixed + (flat + shrinking / world) * numel))
        return (out[0], out[1], out[2])


#: the chunks (ranks) a two-phase compressor's stage lines are fitted at, and the second count that gives each
#: stage's cost per further chunk (:attr:`CodecCost.wide`)
FIT_CHUNKS, WIDE_CHUNKS = 4, 16


#: a bucket as a hook's CPU stages see it: elements, its parameters' shapes (empty: unknown), world size
BucketKey = tuple[int, tuple[tuple[int, ...], ...], int]


@dataclass(frozen=True)
class HookCost:
    """The CPU stages of a hook's exchange (an :class:`~gradwire.strategies.ExchangeModel`), per bucket.

    ``measured`` holds stage seconds timed elsewhere (a calibration run in
    the job's ranks); a bucket not in it is timed here, on ``device``, once
    per process. Every figure is multiplied by ``scale``.
    """

    model: "ExchangeModel"
    device: str = "cpu"
    measured: Mapping[BucketKey, tuple[float, ...]] = field(default_factory=dict)
    scale: float = 1.0

    def stages(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int) -> tuple[float, ...]:
        """Seconds before the first collective, between each two, and after the last."""
        key = (numel, tuple(tuple(s) for s in shapes), world)
        found = self.measured.get(key)
        if found is None:
            found = stage_seconds(self.model, *key, device=self.device)
        return tuple(t * self.scale for t in found)

    def scaled(self, factor: float) -> "HookCost":
        return replace(self, scale=self.scale * factor)


#: compression that costs nothing: the best case (and the ratio column's assumption)
FREE = CodecCost()


def _probe(compressor: Compressor, numel: int) -> tuple[list[torch.Tensor], Any]:
    """The payload (and context) of ``numel`` zeros: the shapes of any input of that size.

    Not on the meta device: the first meta kernel of some ops imports
    torch._dynamo (seconds), more than the zeros cost.
    """
    return compressor.compress(torch.zeros(numel))


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def serialized_nbytes(payload: list[torch.Tensor]) -> int:
    """Bytes :func:`gradwire.compress.base.serialize` makes of ``payload``: every tensor padded to 8 bytes."""
    return sum(_padded(p.numel() * p.element_size()) for p in payload)


@functools.lru_cache(maxsize=65536)
def _serialized_bytes(spec: str, numel: int) -> int:
    """Bytes of the serialised payload of ``numel`` elements.

    A local encoding (``slice_units``: one byte per 8 signs, a scale per
    block) has ``ceil(numel / unit)`` elements per payload tensor: one probe
    of a single granule gives the element sizes, whatever ``numel``.
    """
    compressor = get_compressor(spec)
    units = compressor.slice_units()
    if units and numel:
        sizes = [p.element_size() for p in _probe(compressor, math.lcm(*units))[0]]
        return sum(_padded(-(-numel // u) * size) for u, size in zip(units, sizes))
    return serialized_nbytes(_probe(compressor, numel)[0])


def longest_chunk(numel: int, world: int, granule: int) -> int:
    """The longest of :func:`gradwire.compress.twophase.chunk_bounds`' chunks (the first), without the list."""
    return min(numel, max(granule, granule * math.ceil(numel / (granule * world))))


@functools.lru_cache(maxsize=256)
def _granule(spec: str) -> int:
    compressor = get_compressor(spec)
    return twophase.chunk_granule(compressor) if compressor.slice_units() else 8


def two_phase_row_bytes(spec: str, numel: int, world: int) -> int:
    """Bytes of one all_to_all / all_gather row of a two-phase exchange (the longest chunk, padded)."""
    return max(8, _serialized_bytes(spec, longest_chunk(numel, world, _granule(spec))))


def allgather_row_bytes(spec: str, numel: int) -> int:
    """Bytes of one rank's serialised payload in an allgather exchange."""
    return _serialized_bytes(spec, numel)


@functools.lru_cache(maxsize=65536)
def round_bytes(spec: str, numel: int) -> tuple[tuple[int, ...], ...]:
    """Allreduce pattern: bytes of each payload tensor, per round (one all_reduce each)."""
    compressor = get_compressor(spec)
    payload, ctx = _probe(compressor, numel)
    rounds = [tuple(p.numel() * p.element_size() for p in payload)]
    for _ in range(compressor.rounds - 1):
        payload = compressor.next_round(payload, ctx)
        rounds.append(tuple(p.numel() * p.element_size() for p in payload))
    return tuple(rounds)


# ------------------------------------------------------------------ timing
def _time(fn: Callable[[], object], device: str, repeats: int) -> float:
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class _Bench:
    """One bucket of ``numel`` elements and the per-bucket state the hooks keep (momentum, residuals)."""

    def __init__(self, spec: str, numel: int, device: str, world: int) -> None:
        self.compressor = compressor = get_compressor(spec)
        self.world = world
        gen = torch.Generator(device=device).manual_seed(0)
        self.x = torch.randn(numel, generator=gen, device=device)
        self.m = torch.zeros_like(self.x)
        self.key = StateKey.of("p0", numel)
        self.ef = ErrorFeedback() if not compressor.unbiased else None
        self.correcting = self.ef is not None and compressor.averages and compressor.correct  # off by default
        self.old = torch.zeros_like(self.x)

    def prepare(self) -> torch.Tensor:
        """Momentum (``m = 0.9 m + g``, the tensor becomes ``m``), error feedback's compensation."""
        t = self.x.clone()
        torch.add(t, self.m, alpha=0.9, out=self.m)
        t.copy_(self.m)
        if self.ef is not None:
            self.ef.compensate(t, self.key)
            if self.correcting:  # the local correction keeps the residual as it was
                residual = self.ef.residual(self.key)
                if residual is not None:
                    self.old = residual.clone()
        return t

    def correct(self, out: torch.Tensor) -> None:
        """The local correction: the change of the worker residual added to the average."""
        residual = self.ef.residual(self.key) if self.ef is not None else None
        if self.correcting and residual is not None:
            out.add_(residual.view(out.shape)).sub_(self.old.view(out.shape))


def _two_phase(b: _Bench) -> dict[str, Callable[[], object]]:
    c, world = b.compressor, b.world
    send, _, plan = twophase.split_encode(b.x.clone(), world, c, b.key)
    rows = send.clone()

    served = b.key.serving(*plan.bounds[0])

    def encode() -> None:
        t = b.prepare()
        lend = b.ef.workspace(b.key, t) if b.ef is not None else None
        sent, approx, _ = twophase.split_encode(t, world, c, b.key, approx=lend)
        if b.ef is not None:
            b.ef.update(b.key, t, approx, True)
        torch.empty_like(sent), torch.empty(world, plan.row_bytes, dtype=torch.uint8)  # the exchange's buffers

    def serve() -> None:  # this rank's chunk from every rank's row, averaged and compressed again
        chunk = twophase.server_combine(rows, plan, 0, c)
        ok = True
        if b.ef is not None:  # the server's own error feedback, as the exchange keeps it
            b.ef.compensate(chunk, served)
            ok = is_finite(chunk)
        _, chunk_approx = twophase.encode_row(chunk, plan, 0, c, b.key,
                                              approx=b.ef.workspace(served, chunk) if b.ef is not None else None)
        if b.ef is not None:
            b.ef.update(served, chunk, chunk_approx, ok)
        rows.unbind(0)  # the all_gather's outputs

    def decode() -> None:
        b.correct(twophase.gather_decode(rows, plan, c))

    return {"encode": encode, "serve": serve, "decode": decode}


def _allgather(b: _Bench) -> dict[str, Callable[[], object]]:
    c = b.compressor
    payload, ctx = c.compress(b.x.clone(), b.key)

    def encode() -> None:
        t = b.prepare()
        p, pctx = c.compress(t, b.key)
        if b.ef is not None:
            b.ef.update(b.key, t, c.decompress(p, pctx), True)
        serialize(p)

    def decode(n: int) -> Callable[[], object]:
        return lambda: b.correct(c.combine([payload] * n, ctx).reshape(-1))

    return {"encode": encode, "decode": decode(2), "decode4": decode(4)}


def _allreduce(b: _Bench) -> dict[str, Callable[[], object]]:
    c = b.compressor
    payload, ctx = c.compress(b.x.clone(), b.key)

    def encode() -> None:
        p, _ = c.compress(b.prepare(), b.key)
        for q in p:
            q.div_(b.world)

    def serve() -> None:  # PowerSGD's next round from the averaged first
        p = payload
        for _ in range(c.rounds - 1):
            p = c.next_round(p, ctx)

    def decode() -> None:
        out = c.decompress(payload, ctx).reshape(-1)
        if b.ef is not None:
            b.ef.update(b.key, b.x, out, True)
        b.correct(out)

    return {"encode": encode, "serve": serve, "decode": decode}


def _stages(spec: str, numel: int, device: str, world: int = FIT_CHUNKS) -> dict[str, Callable[[], object]]:
    """One bucket's exchange of ``numel`` elements as the hooks run it, cut at the collectives.

    The collectives themselves are left out (the network model prices them);
    where a collective would deliver other ranks' data, this rank's own is
    used (same sizes, same work).
    """
    bench = _Bench(spec, numel, device, world)
    pattern = bench.compressor.pattern
    if pattern is Pattern.TWO_PHASE:
        return _two_phase(bench)
    if pattern is Pattern.ALLGATHER:
        return _allgather(bench)
    return _allreduce(bench)


@functools.lru_cache(maxsize=256)
def stage_seconds(model: "ExchangeModel", numel: int, shapes: tuple[tuple[int, ...], ...], world: int,
                  device: str = "cpu", repeats: int = 5) -> tuple[float, ...]:
    """Time each of ``model``'s stages for one bucket (medians, one thread on a CPU, as :func:`codec_cost`)."""
    threads = torch.get_num_threads()
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
    try:
        return tuple(_time(stage, device, repeats) for stage in model.stages(numel, shapes, world, device))
    finally:
        torch.set_num_threads(threads)


def cost_of_stages(lines: dict[str, Line], wide: Mapping[str, Line] | None = None) -> CodecCost:
    """A codec's cost from its stages' fitted lines (``encode``, ``serve``, ``decode``; for allgather
    ``decode4`` too: the combine of 4 payloads beside that of 2, whose difference is two more ranks).

    Two-phase: ``wide`` holds the same stages' lines over :data:`WIDE_CHUNKS` chunks (:attr:`CodecCost.wide`).
    """
    if "decode4" in lines:
        two, four = lines["decode"], lines["decode4"]
        per_rank = Line(max(0.0, (four.fixed - two.fixed) / 2), max(0.0, (four.per_element - two.per_element) / 2))
        decode = Line(max(0.0, two.fixed - 2 * per_rank.fixed), max(0.0, two.per_element - 2 * per_rank.per_element))
        return CodecCost(lines["encode"], Line(), decode, per_rank)
    return CodecCost(lines["encode"], lines["serve"], lines["decode"],
                     wide=() if wide is None else (wide["encode"], wide["serve"], wide["decode"]))


def fitted_cost(spec: str, device: str, sizes: tuple[int, int], seconds: Callable[[Callable[[], object]], float]
                ) -> CodecCost:
    """``spec``'s stages (:func:`_stages`) on ``device`` at both ``sizes``, each timed or priced by ``seconds``,
    a line through each; a two-phase compressor's over :data:`WIDE_CHUNKS` chunks too."""
    small, large = sizes

    def lines(world: int) -> dict[str, Line]:
        a, b = _stages(spec, small, device, world), _stages(spec, large, device, world)
        return {name: Line.fit(small, seconds(a[name]), large, seconds(b[name])) for name in a}

    two_phase = get_compressor(spec).pattern is Pattern.TWO_PHASE
    return cost_of_stages(lines(FIT_CHUNKS), lines(WIDE_CHUNKS) if two_phase else None)


@functools.lru_cache(maxsize=64)
def codec_cost(spec: str, device: str = "cpu", sizes: tuple[int, int] = (1 << 16, 1 << 20),
               repeats: int = 5) -> CodecCost:
    """Measure ``spec``'s stages (:func:`_stages`) at two sizes on ``device``; a line through each.

    On a CPU it runs on one thread, as every training rank does (two threads
    on a shared machine made a 256 KB copy take milliseconds, waiting for the
    second thread to be scheduled). Cached per process.
    """
    threads = torch.get_num_threads()
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
    try:
        return fitted_cost(spec, device, sizes, lambda fn: _time(fn, device, repeats))
    finally:
        torch.set_num_threads(threads)
