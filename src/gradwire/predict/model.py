"""Predict step time, throughput and scaling efficiency on N ranks from a :class:`StepProfile`. Pure.

1. The profile says what one rank computes per step and when each DDP bucket
   is ready during backward (:mod:`gradwire.predict.timeline`).
2. The strategy says which collectives each bucket needs and what its
   compression costs (:mod:`gradwire.predict.plans`).
3. The step is replayed on the network model of the cluster at N ranks, the
   same :class:`~gradwire.net.NetworkModel` the backend uses: each bucket's
   collectives queue on the link while the rest of backward runs, the
   optimizer waits for the last one, ``delayed`` overlaps the next step
   (:mod:`gradwire.predict.simulate`).

Scaling efficiency is ``compute / step``: the step of one rank with no
communication (forward + backward + optimizer) over the predicted step, i.e.
throughput at N over N times the throughput of one rank. Compression time
counts against it: compression is part of the price of communicating.

The "ratio needed" (:func:`ratio_needed`): the smallest compression ratio
``r`` (fp32 bytes over bytes sent) at which DDP with an ideal compressor of
ratio ``r`` (two-phase exchange, free to run: :class:`~gradwire.predict.plans.Ratio`)
reaches a target efficiency. "none needed" when plain ``sync`` reaches it
already; "not reachable" when even ``r`` = :data:`MAX_RATIO` does not (the
latency of the collectives, or compute alone, is the bound). Efficiency
only grows with ``r`` (fewer bytes never make a collective slower), so a
bisection on ``log r`` finds it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from gradwire.net import NetSpec, NetworkModel
from gradwire.strategies import parse_strategy
from gradwire.predict.codec import FREE
from gradwire.predict.host import Host
from gradwire.predict.plans import Cost, Ratio, plan_for, strategy_compressor
from gradwire.predict.simulate import Epochs, Plan, Pricer, SimResult, simulate, spec_for_world
from gradwire.predict.timeline import StepProfile

__all__ = ["MAX_RATIO", "NONE_NEEDED", "NOT_REACHABLE", "Prediction", "Pricers", "calibrated", "check_fits",
           "default_worlds", "predict", "ratio_needed", "sweep"]

#: the largest compression ratio :func:`ratio_needed` tries (past it, latency is all that is left)
MAX_RATIO = 10_000.0
NONE_NEEDED = "none needed"
NOT_REACHABLE = "not reachable"
#: relative precision of the ratio bisection
_RATIO_PRECISION = 0.01


@dataclass(frozen=True)
class Prediction:
    """One strategy on one network at one world size."""

    strategy: str
    net: str
    world: int
    step_seconds: float
    compute_seconds: float
    """one rank's step with no communication (forward + backward + optimizer)"""
    comm_seconds: float
    """modelled network time per step (the link busy)"""
    codec_seconds: float
    """compression time per step (encode, server step, decode)"""
    wire_bytes_per_step: float
    batch_size: int | None = None
    """samples per rank per micro-step (None: unknown)"""
    accumulate: int = 1
    """micro-steps per optimizer step (gradient accumulation)"""
    #: on a network that changes: the step's seconds at the 50th and 95th percentile and the longest,
    #: over :data:`CHANGING_HORIZON` seconds of the schedule (``step_seconds`` is their mean)
    percentiles: tuple[float, float, float] | None = None
    #: every replayed step's seconds, where steps were replayed over a horizon (not written by :meth:`as_dict`)
    durations: tuple[float, ...] = field(default=(), repr=False, compare=False)

    @property
    def efficiency(self) -> float:
        """Scaling efficiency: compute / step (1.0: communication fully hidden)."""
        return self.compute_seconds / self.step_seconds if self.step_seconds > 0 else 1.0

    @property
    def steps_per_second(self) -> float:
        """Optimizer steps per second (every rank takes them together)."""
        return 1 / self.step_seconds if self.step_seconds > 0 else math.inf

    @property
    def throughput(self) -> float:
        """Samples per second over all ranks: ranks x batch x micro-steps per optimizer step, per step
        (steps per second times ranks when the batch is unknown)."""
        per_step = self.world * ((self.batch_size or 1) * self.accumulate if self.batch_size else 1)
        return per_step * self.steps_per_second

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "net": self.net, "world": self.world, "step_seconds": self.step_seconds,
                "compute_seconds": self.compute_seconds, "comm_seconds": self.comm_seconds,
                "codec_seconds": self.codec_seconds, "wire_bytes_per_step": self.wire_bytes_per_step,
                "batch_size": self.batch_size, "accumulate": self.accumulate, "efficiency": self.efficiency,
                "steps_per_second": self.steps_per_second, "throughput": self.throughput,
                **({} if self.percentiles is None else dict(zip(("p50_seconds", "p95_seconds", "max_seconds"),
                                                              self.percentiles)))}


class Pricers:
    """One :class:`~gradwire.predict.simulate.Pricer` per (network, world size), shared by every strategy."""

    def __init__(self) -> None:
        self._by: dict[tuple[NetSpec | str, int], Pricer] = {}

    def get(self, net: NetSpec | str, world: int) -> Pricer:
        key = (net, world)
        pricer = self._by.get(key)
        if pricer is None:
            pricer = self._by[key] = Pricer(net, world)
        return pricer


def _check_world(world: int) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"world size must be an integer >= 2, got {world!r}")


#: the range of the calibration's stretch of compute (a loopback run outside it is not believed further)
_STRETCH = (0.25, 8.0)


#: seconds of a changing network's schedule a prediction replays, from t = 0
CHANGING_HORIZON = 600.0


def _replay(profile: StepProfile, plan: Plan, pricer: Pricer, stretch: float = 1.0,
            host: Host | None = None, horizon: float | None = None, epochs: Epochs | None = None,
            first: tuple[Plan, int] | None = None) -> SimResult:
    """The step of ``plan`` with ``profile``'s backward (and its ready times) multiplied by ``stretch``.

    On a network that changes, consecutive steps over :data:`CHANGING_HORIZON`
    seconds: the mean step, and every step's seconds; with ``epochs`` (and a
    ``horizon``), the run's epochs replayed over that horizon on any network.
    On a ``host`` whose every core trains, background work takes compute's time.
    """
    replayed = pricer.changes or (epochs is not None and horizon is not None)
    # micro-steps of gradient accumulation: compute before the synchronising forward, nothing sent
    return simulate(profile.accumulation_seconds + profile.forward, profile.backward * stretch, profile.optimizer,
                    [b.ready * stretch for b in profile.buckets], plan, pricer,
                    horizon=(horizon or CHANGING_HORIZON) if replayed else None,
                    busy_cores=host is not None and host.busy_cores,
                    finalize=profile.finalize if profile.on_sim_clock else 0.0, epochs=epochs, first=first)


def _percentiles(durations: Sequence[float]) -> tuple[float, float, float] | None:
    if not durations:
        return None
    ordered = sorted(durations)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return at(0.5), at(0.95), ordered[-1]


def calibrated(profile: StepProfile, cost: Cost | None = None, host: Host | None = None) -> StepProfile:
    """``profile`` fitted to its own run: what the model should replay for it on every network.

    A measured profile knows what its run took per step (``loop_seconds``,
    on ``profile.net`` at ``profile.world`` ranks, with ``profile.strategy``).

    Ranks with a core each (``shared == 1``): the model replays that run on
    its own network; when the run took longer than the replay (CPU the model
    does not see, above all the real collectives' threads competing with
    backward, which is when they run; a busy machine's scheduling; the
    median of a sum exceeding the sum of the medians), the backward time and
    its buckets' ready times are multiplied by the factor that makes the
    replay take the run's median step; a faster run shrinks them. Stretching
    backward rather than adding time after it: compute that a slow network
    hides stays hidden, as it did in the run. A micro-step of gradient
    accumulation that does not synchronise runs beside no collective and is
    not stretched (``micro`` keeps the forward + backward as recorded when
    the run had none: :meth:`StepProfile.accumulating`). The factor (found by
    bisection: the replay only grows with it) is a property of the job as
    it ran and applies to every strategy and world size predicted from the
    profile.

    Ranks that shared cores (``shared > 1``: a CPU job with more ranks than
    cores): on loopback no rank ever sleeps, so each computed on
    ``1 / shared`` of a core, and the replay cannot be fitted to that run (a
    slow network lets ranks take turns: in the runs it predicts they compute
    at nearly a core's speed while others wait for the link). Every
    CPU time of the step (forward, backward, ready times, optimizer, the
    hooks' and callbacks' times) is divided by ``shared`` instead: the step
    of a rank with a core of its own, which is what larger clusters give each
    rank. The run itself stays a floor: :func:`predict` never prices the
    same strategy at the same world size below ``loop_seconds`` when the run
    was on loopback (the network only adds to that job).

    Described profiles, profiles whose run or network is unknown, and
    profiles whose strategy predict does not know, are returned as they are.
    """
    from gradwire.predict.plans import plan_for

    if profile.loop_seconds is None or profile.source == "described" or profile.strategy is None:
        return profile
    if profile.shared > 1 and not profile.on_sim_clock:  # the simulated clock prices ops, not the host's cores
        return _own_cores(profile)
    if profile.net is None:
        return replace(profile, notes=(*profile.notes, "not calibrated: the network its run used is unknown"))
    try:
        plan = plan_for(profile.strategy, profile, profile.world, cost, host=host)
    except ValueError:  # a hook predict does not know: nothing to replay
        return profile
    try:
        pricer = Pricer(profile.net, profile.world)
    except ValueError as exc:  # topology=auto: the layout of the run is not in the spec
        return replace(profile, notes=(*profile.notes, f"not calibrated: {exc}"))
    lo, hi = _STRETCH
    if _replay(profile, plan, pricer, lo, host).step_seconds >= profile.loop_seconds:
        stretch = lo
    elif _replay(profile, plan, pricer, hi, host).step_seconds <= profile.loop_seconds:
        stretch = hi
    else:
        while hi - lo > 1e-4:
            mid = (lo + hi) / 2
            if _replay(profile, plan, pricer, mid, host).step_seconds < profile.loop_seconds:
                lo = mid
            else:
                hi = mid
        stretch = (lo + hi) / 2
    # a micro-step that does not synchronise runs beside no collective: its compute is not stretched
    return replace(profile, backward=profile.backward * stretch, micro=profile.micro_seconds,
                   buckets=tuple(replace(b, ready=b.ready * stretch) for b in profile.buckets),
                   stretch=profile.stretch * stretch,
                   notes=(*profile.notes, f"backward x{stretch:.2f}: the replay of its own run takes that "
                                          f"run's median step ({profile.loop_seconds * 1e3:.1f} ms)"))


def _own_cores(profile: StepProfile) -> StepProfile:
    """``profile``'s CPU times divided by its ``shared`` (:func:`calibrated`, ranks that shared cores)."""
    c = profile.shared
    exchanges = None if profile.exchanges is None else tuple(
        replace(e, hook=e.hook / c, gaps=tuple(g / c for g in e.gaps), tail=None if e.tail is None else e.tail / c,
                lead=e.lead / c)
        for e in profile.exchanges)
    floor = f"; its own step ({profile.loop_seconds or 0:.4g} s) stays the floor at {profile.world} ranks"
    return replace(profile, forward=profile.forward / c, backward=profile.backward / c,
                   optimizer=profile.optimizer / c, exchanges=exchanges, finalize=profile.finalize / c,
                   micro=None if profile.micro is None else profile.micro / c,
                   buckets=tuple(replace(b, ready=b.ready / c) for b in profile.buckets),
                   stretch=profile.stretch / c,
                   notes=(*profile.notes, f"compute / {c:.3g}: a core per rank{floor if _on_loopback(profile) else ''}"))


def _on_loopback(profile: StepProfile) -> bool:
    """Whether ``profile``'s run ran where the network adds nothing (its step is then a floor)."""
    return profile.net is not None and _zero_net(profile.net)


@functools.lru_cache(maxsize=64)
def _zero_net(net: str) -> bool:
    try:
        return NetworkModel(net, 2).is_zero
    except ValueError:
        return False


def _floor(profile: StepProfile, choice: str, world: int) -> float:
    """The measured run's own step when predicting that very run on another network (:func:`calibrated`)."""
    from gradwire.predict.plans import same_strategy

    if (profile.loop_seconds is None or profile.source == "described" or world != profile.world
            or not same_strategy(profile.strategy, parse_strategy(choice)) or not _on_loopback(profile)):
        return 0.0
    return profile.loop_seconds


def predict(profile: StepProfile, strategy: str, net: NetSpec | str, world: int,
            cost: Cost | None = None, pricers: Pricers | None = None, host: Host | None = None,
            steps: int | None = None, horizon: float | None = None, epochs: Epochs | None = None) -> Prediction:
    """Step time of ``strategy`` on ``world`` ranks of ``net`` for ``profile``'s step (module doc).

    ``cost``: the exchange's CPU cost (:func:`gradwire.predict.plans.exchange_cost`);
    default free. ``pricers``: share the network prices between calls.
    ``host``: the machine's real collectives, memory passes and cores
    (:class:`~gradwire.predict.host.Host`; None: a described cluster).
    ``steps``: the mean step of a training of that many steps, its warm-up
    included (the first steps of a compressing strategy take the plain
    all_reduce: :class:`~gradwire.strategies.ExchangeTraits`' ``warmup_steps``);
    None: the steady state. ``horizon``: on a network that changes, the mean step over the first that many
    seconds of its schedule (default :data:`CHANGING_HORIZON`: a long run's mean). ``epochs`` (with a
    ``horizon``): replay the run's epochs, partial batches and evaluations (:class:`Epochs`) over that
    horizon, on any network, its warm-up steps first (on the plain all_reduce, as the run took them);
    ``durations`` then holds every replayed step. A measured profile is best :func:`calibrated` first.
    """
    _check_world(world)
    pricer = (pricers or Pricers()).get(net, world)
    warmup = parse_strategy(strategy).exchange.warmup_steps
    # the warm-up steps on the plain all_reduce: a run's replay takes those not yet behind it first, a mean of
    # ``steps`` counts them
    replayed = epochs is not None and horizon is not None
    warm = max(0, warmup - epochs.offset) if epochs is not None and replayed else min(steps or 0, warmup)
    warm_plan = plan_for(strategy, profile, world, cost, host=host, warmup=True) if warm else None
    sim = _replay(profile, plan_for(strategy, profile, world, cost, host=host), pricer, host=host, horizon=horizon,
                  epochs=epochs, first=(warm_plan, warm) if replayed and warm_plan is not None else None)
    if not replayed and warm_plan is not None:
        start = _replay(profile, warm_plan, pricer, host=host, horizon=horizon, epochs=epochs)
        sim = _mixed(start, warm, sim, (steps or warm) - warm)
    step = max(sim.step_seconds, _floor(profile, strategy, world))
    return Prediction(str(parse_strategy(strategy)), pricer.spec.to_string(), world, step,
                      profile.compute_seconds, sim.comm_seconds, sim.codec_seconds, sim.wire_bytes,
                      profile.batch_size, profile.accumulate, _percentiles(sim.durations), sim.durations)


def _mixed(a: SimResult, n: int, b: SimResult, m: int) -> SimResult:
    """The mean of ``n`` steps like ``a`` and ``m`` like ``b`` (a training's warm-up, then its steady state)."""
    def mean(x: float, y: float) -> float:
        return (n * x + m * y) / (n + m)

    return SimResult(mean(a.step_seconds, b.step_seconds), mean(a.comm_seconds, b.comm_seconds),
                     mean(a.wire_bytes, b.wire_bytes), mean(a.codec_seconds, b.codec_seconds),
                     a.durations + b.durations)


def _efficiency_at(profile: StepProfile, r: float, pricer: Pricer) -> float:
    plan = plan_for("sync", profile, pricer.world, ratio=Ratio(r))
    sim = _replay(profile, plan, pricer)
    return profile.compute_seconds / sim.step_seconds


def ratio_needed(profile: StepProfile, net: NetSpec | str, world: int, target: float = 0.9,
                 pricers: Pricers | None = None) -> float | str:
    """The smallest compression ratio reaching ``target`` efficiency, or NONE_NEEDED / NOT_REACHABLE (module doc)."""
    if not 0 < target <= 1:
        raise ValueError(f"target efficiency must be in (0, 1], got {target!r}")
    _check_world(world)
    pricer = (pricers or Pricers()).get(net, world)
    if predict(profile, "sync", net, world, pricers=pricers).efficiency >= target:
        return NONE_NEEDED
    if _efficiency_at(profile, MAX_RATIO, pricer) < target:
        return NOT_REACHABLE
    lo, hi = 1.0, MAX_RATIO  # efficiency(lo) < target <= efficiency(hi)
    while hi / lo > 1 + _RATIO_PRECISION:
        mid = math.sqrt(lo * hi)
        if _efficiency_at(profile, mid, pricer) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def default_worlds(net: NetSpec | str, largest: int = 1024) -> list[int]:
    """2, 4, ... ``largest``; for ``topology=NxM`` the multiples M, 2M, 4M, ... that fit nodes of M."""
    spec = NetSpec.of(net)
    step = spec.topology[1] if isinstance(spec.topology, tuple) else 1
    worlds, n = [], max(2, step)
    while n <= largest:
        worlds.append(n)
        n *= 2
    return worlds


def check_fits(net: NetSpec | str, worlds: Iterable[int]) -> None:
    """Raise ValueError for a world size the network's topology cannot hold."""
    for n in worlds:
        _check_world(n)
        spec_for_world(net, n)


def uses_compressor(strategy: str) -> str | None:
    return strategy_compressor(parse_strategy(strategy))


def sweep(profile_for: Callable[[str], StepProfile], strategies: Sequence[str], nets: Sequence[NetSpec | str],
          worlds_for: Callable[[str], Sequence[int]], cost_for: Callable[[str], Cost] = lambda s: FREE,
          target: float | None = 0.9) -> tuple[dict[tuple[str, int, str], Prediction],
                                               dict[tuple[str, int], float | str]]:
    """Every strategy on every network at every world size, and the ratio needed per (network, world).

    Returns ``{(net, world, strategy): Prediction}`` and ``{(net, world): ratio}``, keyed by
    the ``nets`` as spec strings (``worlds_for`` is asked with that string too).
    """
    preds: dict[tuple[str, int, str], Prediction] = {}
    ratios: dict[tuple[str, int], float | str] = {}
    for spec in nets:
        net = spec if isinstance(spec, str) else spec.to_string()
        pricers = Pricers()
        for n in worlds_for(net):
            for s in strategies:
                # auto: the fastest of its candidates at this point (what its chooser takes, pricing alike)
                candidates = [str(c) for c in parse_strategy(s).auto_candidates() or [parse_strategy(s)]]
                preds[(net, n, s)] = min((predict(profile_for(c), c, spec, n, cost_for(c), pricers)
                                          for c in candidates),
                                         key=lambda p: p.step_seconds)
            if target is not None:
                ratios[(net, n)] = ratio_needed(profile_for("sync"), spec, n, target, pricers)
    return preds, ratios
