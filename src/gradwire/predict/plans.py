"""From a strategy name to the exchanges one step makes (:class:`~gradwire.predict.simulate.Plan`).

What each exchange does comes from the strategy itself
(:class:`~gradwire.strategies.ExchangeTraits`, the registry entry's answer), as
gradwire runs it (:mod:`gradwire.strategies.registry`):

- the codec of each bucket: DDP's plain all_reduce (``sync``), a gradwire
  compressor through its compression hook (buckets of fewer than
  :data:`~gradwire.exchange.state.MIN_COMPRESS_NUMEL` elements take the plain
  all_reduce, the others the compressor's pattern, :mod:`.codec`), or a
  hook of PyTorch's (``torch-fp16``, ``torch-powersgd:R``), which names its
  collectives and their bytes itself (:class:`~gradwire.strategies.ExchangeModel`);
- the timing: ``backward()`` waits (BLOCKING), the exchanges are waited for
  after the next step's backward (NEXT_STEP: ``delayed``), or one exchange
  of every parameter every H steps (AVERAGE: ``localsgd:H``,
  ``async-average:H``);
- the warm-up: the first steps of a training exchange their buckets with
  the plain all_reduce (``warmup=True`` plans them; the steady state is the
  default), PyTorch's PowerSGD the first ``start`` (10);
- one bucket at a time (PyTorch's PowerSGD), and the strategy's own passes
  over each bucket (``delayed``'s copies and update), priced by the host;
- on the simulated cluster clock (a profile recorded on it), the clock's
  rules for such a chained hook (``Plan.chained``, :mod:`.simulate`): its
  work runs off the training thread (measured as ``MeasuredExchange.lead``,
  the hook itself reading about 0).

``handler`` (per-parameter all_reduce from autograd hooks) is not a bucket
strategy and is refused.

Where the exchange's CPU cost comes from: a profile of the same strategy
(:class:`~gradwire.predict.timeline.MeasuredExchange`: the hook's time, the
gaps between collectives, the decode; the real collective's duration as a
floor only at the world size it was measured at), else a
:class:`~gradwire.predict.codec.CodecCost` (a compressor) or
:class:`~gradwire.predict.codec.HookCost` (a hook of PyTorch's), and, with a
:class:`~gradwire.predict.host.Host`, the real collectives' floors and the
strategy's passes over the buckets.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from typing import Sequence, Union

from gradwire.compress import Pattern, get_compressor
from gradwire.exchange.state import MIN_COMPRESS_NUMEL
from gradwire.strategies import STRATEGIES, ExchangeModel, StrategyChoice, Timing, parse_strategy
from gradwire.predict import codec
from gradwire.predict.codec import FREE, CodecCost, HookCost, codec_cost
from gradwire.predict.host import Host
from gradwire.predict.simulate import Exchange, Kind, Phase, Plan
from gradwire.predict.timeline import MeasuredExchange, StepProfile

__all__ = ["PLANNED", "Cost", "Ratio", "bucket_exchange", "check_planned", "codec_of", "exchange_cost", "plan_for",
           "same_strategy", "strategy_compressor"]

#: a strategy's CPU cost of its exchange: a compressor's lines, or a hook's stages per bucket
Cost = Union[CodecCost, HookCost]

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


def codec_of(choice: StrategyChoice) -> str | ExchangeModel | None:
    """What each bucket's exchange is (:class:`~gradwire.strategies.ExchangeTraits`' ``codec``)."""
    return choice.exchange.codec


def strategy_compressor(choice: StrategyChoice) -> str | None:
    """The gradwire compressor a strategy runs, by name (None: none, or a hook of PyTorch's)."""
    c = codec_of(choice)
    return c if isinstance(c, str) else None


def exchange_cost(strategy: str | StrategyChoice, device: str = "cpu") -> Cost:
    """The CPU cost of ``strategy``'s exchange, timed here on ``device`` (free without a codec)."""
    c = codec_of(parse_strategy(strategy))
    if c is None:
        return FREE
    return codec_cost(c, device) if isinstance(c, str) else HookCost(c, device)


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


def bucket_exchange(numel: int, element_size: int, compressor: str | ExchangeModel | Ratio | None, world: int,
                    cost: Cost = FREE, shapes: Sequence[tuple[int, ...]] = (), host: Host | None = None) -> Exchange:
    """The exchange of one bucket of ``numel`` elements (module doc; :mod:`.codec` for the bytes).

    ``compressor``: the codec (a compressor's name, a hook's model, an ideal
    ratio, or None for the plain all_reduce). ``shapes``: the bucket's
    parameters' (a hook's model may need them). ``host``: each collective
    takes at least its real time there (``Phase.floor``).
    """
    nbytes = numel * element_size
    ex = _exchange(numel, nbytes, compressor, world, cost, shapes)
    if host is None:
        return ex
    return Exchange(ex.encode, tuple(replace(p, floor=max(p.floor, host.floors(p.op, p.nbytes)),
                                             held=host.work(p.op, p.nbytes) if host.work.points else None)
                                     for p in ex.phases), ex.decode)


def _exchange(numel: int, nbytes: int, compressor: str | ExchangeModel | Ratio | None, world: int, cost: Cost,
              shapes: Sequence[tuple[int, ...]]) -> Exchange:
    if isinstance(compressor, Ratio):
        wire = max(1, round(nbytes / compressor.r))
        return Exchange(0.0, (Phase("all_to_all", wire), Phase("all_gather", wire)))
    if compressor is None:
        return Exchange(0.0, (Phase("all_reduce", nbytes),))
    if not isinstance(compressor, str):  # a hook that says its collectives itself
        ops = compressor.collectives(numel, shapes, world)
        stages = cost.stages(numel, shapes, world) if isinstance(cost, HookCost) else (0.0,) * (len(ops) + 1)
        return Exchange(stages[0], tuple(Phase(op, size, before=stages[j] if j else 0.0)
                                         for j, (op, size) in enumerate(ops)), stages[-1])
    if numel < MIN_COMPRESS_NUMEL:
        return Exchange(0.0, (Phase("all_reduce", nbytes),))
    lines = cost if isinstance(cost, CodecCost) else FREE
    pattern = _pattern(compressor)
    if pattern is Pattern.TWO_PHASE:
        encode, serve, decode = lines.two_phase(numel, world)  # a chunk per rank, each its own ops
        row = codec.two_phase_row_bytes(compressor, numel, world)
        return Exchange(encode, (Phase("all_to_all", world * row), Phase("all_gather", world * row, before=serve)),
                        decode)
    encode, serve, decode = lines.encode(numel), lines.serve(numel), lines.decode(numel)
    if pattern is Pattern.ALLGATHER:
        row = codec.allgather_row_bytes(compressor, numel)
        return Exchange(encode, (Phase("all_gather", world * row),), decode + lines.per_rank(numel) * world)
    phases = []
    for k, sizes in enumerate(codec.round_bytes(compressor, numel)):
        for j, size in enumerate(sizes):
            phases.append(Phase("all_reduce", size, before=serve if k and not j else 0.0))
    return Exchange(encode, tuple(phases), decode)


def _measured(ex: Exchange, m: MeasuredExchange, world: int, measured_world: int, hook_only: bool = False,
              chained: bool = False, at_run: Exchange | None = None) -> Exchange:
    """``ex`` with the profile's own CPU times (and, at the measured world size, its floors).

    ``at_run``: the same bucket's exchange priced at ``measured_world``. At another world size each measured
    time moves by what the cost model says changes between the two (a two-phase codec's chunk per rank, an
    allgather's decode per gathered payload, a hook's stages at that world): the run's own figures, moved.

    ``hook_only``: keep only the hook's time. An exchange that overlapped
    compute on busy cores was measured slowed by that compute (its real
    collectives and callbacks took turns with it); the replay charges their
    own work (``ex``: the host's floors, the codec's stages) to the compute
    instead, so the measured durations would count the contention twice.
    ``chained``: the hook ran off the training thread (``Plan.chained``): its
    work is the measured ``lead`` too (the hook itself reads about 0 there).
    """
    run = at_run if at_run is not None else ex
    encode = max(0.0, m.hook + (m.lead if chained else 0.0) + ex.encode - run.encode)
    if hook_only:
        return Exchange(encode, ex.phases, ex.decode)
    floors = m.inner if world == measured_world else (0.0,) * len(m.ops)
    phases = tuple(replace(p, before=max(0.0, m.gaps[j - 1] + p.before - r.before) if j else 0.0, floor=floors[j])
                   for j, (p, r) in enumerate(zip(ex.phases, run.phases)))
    decode = ex.decode if m.tail is None else max(0.0, m.tail + ex.decode - run.decode)
    return Exchange(encode, phases, decode)


def same_strategy(label: str | None, choice: StrategyChoice) -> bool:
    """Whether a profile's strategy label names ``choice`` (a hook predict does not know names nothing)."""
    if label is None:
        return False
    try:
        return str(parse_strategy(label)) == str(choice)
    except ValueError:
        return False


def plan_for(strategy: str | StrategyChoice, profile: StepProfile, world: int,
             cost: Cost | None = None, ratio: Ratio | None = None, host: Host | None = None,
             warmup: bool = False) -> Plan:
    """The exchanges of one step of ``strategy`` on ``world`` ranks for ``profile``'s buckets.

    ``cost``: the exchange's CPU cost (default free). ``ratio``: price the
    ideal compressor instead of the strategy's own (sync's timing).
    ``host``: the machine's real collectives and passes over memory
    (:class:`~gradwire.predict.host.Host`; None: a described cluster, neither
    is priced). ``warmup``: a step of the training's start, whose buckets
    take the plain all_reduce. When ``profile`` measured this very strategy
    and its exchanges issued the collectives the plan expects, their
    measured times replace ``cost``.
    """
    choice = parse_strategy(strategy)
    kind = check_planned(choice)
    traits = choice.exchange
    compressor: str | ExchangeModel | Ratio | None = ratio if ratio is not None else (
        None if warmup else traits.codec)
    cost = cost or FREE
    measured = (profile.exchanges is not None and ratio is None and not warmup
                and same_strategy(profile.strategy, choice))
    if kind is Kind.AVERAGE:
        period, fragments, overlapped = choice.average_schedule()
        total = -(-sum(b.numel for b in profile.buckets) // fragments)  # each exchange moves one fragment
        ex = bucket_exchange(total, profile.buckets[0].element_size, compressor, world, cost, host=host)
        return Plan(kind, (ex,), period=period, overlapped=overlapped)
    exchanges = [bucket_exchange(b.numel, b.element_size, compressor, world, cost, b.shapes, host)
                 for b in profile.buckets]
    serial = traits.one_bucket_at_a_time and ratio is None
    # the simulated clock runs a chained hook off the training thread
    chained = serial and profile.on_sim_clock
    if measured and profile.exchanges is not None:
        mine = [tuple(p.op for p in ex.phases) for ex in exchanges]
        if all(m.ops == ops for m, ops in zip(profile.exchanges, mine)):
            hook_only = kind is Kind.NEXT_STEP and host is not None and host.busy_cores
            at_run = [bucket_exchange(b.numel, b.element_size, compressor, profile.world, cost, b.shapes)
                      for b in profile.buckets] if world != profile.world else exchanges
            exchanges = [_measured(ex, m, world, profile.world, hook_only, chained, run)
                         for ex, m, run in zip(exchanges, profile.exchanges, at_run)]
    if host is not None and traits.copies and ratio is None:
        exchanges = [Exchange(ex.encode + traits.copies * host.copy(b.numel), ex.phases, ex.decode)
                     for ex, b in zip(exchanges, profile.buckets)]
    return Plan(kind, tuple(exchanges), serial=serial, chained=chained)
