"""From a strategy name to the exchanges one step makes (:class:`~gradwire.predict.simulate.Plan`).

Strategies as gradwire runs them (:mod:`gradwire.overlap.registry`):

- ``sync``: DDP, one all_reduce per bucket; ``backward()`` waits (BLOCKING).
- ``COMPRESSOR`` (``fp16``, ``onebit``, ``topk:0.01``...): DDP with
  gradwire's compression hook: buckets of fewer than
  :data:`~gradwire.hooks.state.MIN_COMPRESS_NUMEL` elements take the plain
  all_reduce, the others the compressor's pattern (:mod:`.codec`). The
  warm-up steps are left out: this is the steady state.
- ``torch-fp16`` and ``torch-powersgd:R``: PyTorch's hooks, priced as
  ``fp16`` and ``powersgd:R`` (after PyTorch's PowerSGD warm-up).
- ``delayed`` (with or without a compressor): the same exchanges, waited for
  after the next step's backward (NEXT_STEP).
- ``localsgd:H`` and ``async-average:H``: no DDP: one exchange of every
  parameter every H steps (AVERAGE), blocking or overlapped.
- ``handler`` (per-parameter all_reduce from autograd hooks) is not a
  bucket strategy and is refused.

Where the exchange's CPU cost comes from: a profile of the same strategy
(:class:`~gradwire.predict.timeline.MeasuredExchange`: the hook's time, the
gaps between collectives, the decode; the real collective's duration as a
floor only at the world size it was measured at), else a
:class:`~gradwire.predict.codec.CodecCost`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from gradwire.compress import Pattern, get_compressor
from gradwire.hooks.state import MIN_COMPRESS_NUMEL
from gradwire.overlap import STRATEGIES, StrategyChoice, Timing, parse_strategy
from gradwire.predict import codec
from gradwire.predict.codec import FREE, CodecCost
from gradwire.predict.simulate import Exchange, Kind, Phase, Plan
from gradwire.predict.timeline import MeasuredExchange, StepProfile

__all__ = ["PLANNED", "Ratio", "bucket_exchange", "check_planned", "plan_for", "same_strategy", "strategy_compressor"]

#: strategies the step model prices: those with a timing (the registry's entries say)
PLANNED = tuple(name for name, entry in STRATEGIES.items() if entry.timing is not None)
#: how each timing sits in the step model
_KINDS = {Timing.BLOCKING: Kind.BLOCKING, Timing.NEXT_STEP: Kind.NEXT_STEP,
          Timing.AVERAGE: Kind.AVERAGE, Timing.AVERAGE_OVERLAPPED: Kind.AVERAGE}


@dataclass(frozen=True)
class Ratio:
    """An ideal compressor of ratio ``r`` (fp32 bytes / bytes sent), two-phase, free to run.

    What the "ratio needed" column prices: all_to_all then all_gather of
    ``nbytes / r`` each (DeepSpeed's compressed all_reduce, the pattern of
    every compressor here past 2x), no encode or decode time.
    """

    r: float


def strategy_compressor(choice: StrategyChoice) -> str | None:
    """The compressor a strategy runs, as a compressor name (PyTorch's hooks map to gradwire's)."""
    return choice.equivalent_compressor


def check_planned(choice: StrategyChoice) -> Kind:
    """The step model's kind for ``choice``; ValueError naming the strategies predict prices otherwise."""
    timing = choice.timing
    if timing is None:
        raise ValueError(f"predict cannot price strategy {choice.spec.name!r} (not a DDP bucket strategy); valid: "
                         f"{', '.join(PLANNED)}, each with or without a compressor")
    return _KINDS[timing]


@functools.lru_cache(maxsize=256)
def _pattern(spec: str) -> Pattern:
    return get_compressor(spec).pattern


def bucket_exchange(numel: int, element_size: int, compressor: str | Ratio | None, world: int,
                    cost: CodecCost = FREE) -> Exchange:
    """The exchange of one bucket of ``numel`` elements (module doc; :mod:`.codec` for the bytes)."""
    nbytes = numel * element_size
    if isinstance(compressor, Ratio):
        wire = max(1, round(nbytes / compressor.r))
        return Exchange(0.0, (Phase("all_to_all", wire), Phase("all_gather", wire)))
    if compressor is None or numel < MIN_COMPRESS_NUMEL:
        return Exchange(0.0, (Phase("all_reduce", nbytes),))
    pattern = _pattern(compressor)
    encode, serve, decode = cost.encode(numel), cost.serve(numel), cost.decode(numel)
    if pattern is Pattern.TWO_PHASE:
        row = codec.two_phase_row_bytes(compressor, numel, world)
        return Exchange(encode, (Phase("all_to_all", world * row), Phase("all_gather", world * row, before=serve)),
                        decode)
    if pattern is Pattern.ALLGATHER:
        row = codec.allgather_row_bytes(compressor, numel)
        return Exchange(encode, (Phase("all_gather", world * row),), decode + cost.per_rank(numel) * world)
    phases = []
    for k, sizes in enumerate(codec.round_bytes(compressor, numel)):
        for j, size in enumerate(sizes):
            phases.append(Phase("all_reduce", size, before=serve if k and not j else 0.0))
    return Exchange(encode, tuple(phases), decode)


def _measured(ex: Exchange, m: MeasuredExchange, world: int, measured_world: int) -> Exchange:
    """``ex`` with the profile's own CPU times (and, at the measured world size, its floors)."""
    floors = m.inner if world == measured_world else (0.0,) * len(m.ops)
    phases = tuple(Phase(p.op, p.nbytes, before=m.gaps[j - 1] if j else 0.0, floor=floors[j])
                   for j, p in enumerate(ex.phases))
    decode = ex.decode if m.tail is None else m.tail
    return Exchange(m.hook, phases, decode)


def same_strategy(label: str | None, choice: StrategyChoice) -> bool:
    """Whether a profile's strategy label names ``choice`` (a hook predict does not know names nothing)."""
    if label is None:
        return False
    try:
        return str(parse_strategy(label)) == str(choice)
    except ValueError:
        return False


def plan_for(strategy: str | StrategyChoice, profile: StepProfile, world: int,
             cost: CodecCost | None = None, ratio: Ratio | None = None) -> Plan:
    """The exchanges of one step of ``strategy`` on ``world`` ranks for ``profile``'s buckets.

    ``cost``: the compressor's CPU cost (default free). ``ratio``: price the
    ideal compressor instead of the strategy's own (sync's timing).
    When ``profile`` measured this very strategy and its exchanges issued the
    collectives the plan expects, their measured times replace ``cost``.
    """
    choice = parse_strategy(strategy)
    kind = check_planned(choice)
    compressor: str | Ratio | None = ratio if ratio is not None else strategy_compressor(choice)
    cost = cost or FREE
    measured = profile.exchanges is not None and ratio is None and same_strategy(profile.strategy, choice)
    if kind is Kind.AVERAGE:
        period, fragments, overlapped = choice.average_schedule()
        total = -(-sum(b.numel for b in profile.buckets) // fragments)  # each exchange moves one fragment
        ex = bucket_exchange(total, profile.buckets[0].element_size, compressor, world, cost)
        return Plan(kind, (ex,), period=period, overlapped=overlapped)
    exchanges = [bucket_exchange(b.numel, b.element_size, compressor, world, cost) for b in profile.buckets]
    if measured and profile.exchanges is not None:
        mine = [tuple(p.op for p in ex.phases) for ex in exchanges]
        if all(m.ops == ops for m, ops in zip(profile.exchanges, mine)):
            exchanges = [_measured(ex, m, world, profile.world) for ex, m in zip(exchanges, profile.exchanges)]
    return Plan(kind, tuple(exchanges))
