"""What the step model says of a comparison: each strategy's speedup at every network measured, and against bandwidth.

A comparison measures two or three networks; the prediction replays the same
trainings on :mod:`gradwire.predict`'s model (:class:`Replay`), so that a
user sees, per strategy and network, the predicted speedup beside the
measured one, and between and beyond the networks, where each strategy pays.
What it replays:

1. The step: the compute-only run's measured compute, split into forward,
   backward and optimizer by their shares in a plain step of the model; the
   model's DDP buckets on the meta device, at each strategy's own bucket
   size (:class:`~gradwire.strategies.ExchangeTraits`), ready as backward
   reaches them (backward spread by the layers' forward FLOPs).
2. Each strategy's exchange as it runs: its rounds and their bytes, the
   order of its collectives, one bucket at a time where its hook does that,
   its warm-up steps (the mean step of the whole training is what the table
   measures), and its CPU work.
3. The host, measured by :func:`gradwire.predict.calibrate.calibrate` in the
   job's ranks: each strategy's exchanges as they run on ``loopback`` (the
   hook, every real collective, the callbacks between them: what an
   exchange costs besides the network), the real collectives alone and
   each exchange's CPU stages; an op completes no sooner than its real
   collective, and on a host whose every core trains, the work of an
   exchange that overlaps compute (``delayed``'s) is taken from that
   compute. Each strategy's step is then fitted to its own loopback run
   (:func:`gradwire.predict.calibrated`: backward stretched until the
   replay takes that run's mean step), which prices the CPU work its
   exchange's figures do not show; the run stays the floor of that
   strategy (a network only adds to it). Every figure is scaled by the compute-only run's compute over
   the calibration's own reference step, so CPU work is priced at the pace
   of the runs. None of it is fitted to a measured run on the networks the
   comparison predicts: the calibration's runs have no network at all.

The crossover of a strategy is the bandwidth at which its predicted speedup
crosses 1 on the first network with its bandwidth swept (the other link
settings kept): below it the strategy pays, above it its own work costs more
than the network time it saves.

Trap: the model does not see two ranks of a job sharing a core (more ranks
than cores), nor another job's load changing between the runs and the
calibration beyond the pace the scaling catches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from gradwire.net import NetSpec

if TYPE_CHECKING:
    from gradwire.predict import Pricers
    from gradwire.predict.calibrate import Calibration
    from gradwire.predict.host import Host
    from gradwire.predict.plans import Cost
    from gradwire.predict.timeline import StepProfile

__all__ = ["BANDWIDTHS", "Replay", "SpeedupCurves", "crossover", "hook_buckets", "rate", "replay_for", "replayed",
           "speedup_curves"]

#: the swept bandwidths, bits/s: 50 Mbit/s to 400 Gbit/s, 8 points per decade
BANDWIDTHS = tuple(10 ** (7.7 + i / 8) for i in range(0, 32))


@dataclass
class SpeedupCurves:
    """Predicted speedup over the baseline per strategy, at each bandwidth."""

    baseline: str
    net: str
    """the network swept (its bandwidth replaced), as a spec string"""
    world: int
    compute_ms: float
    bandwidths: list[float] = field(default_factory=list)
    """bits/s"""
    speedups: dict[str, list[float]] = field(default_factory=dict)
    crossovers: dict[str, float | None] = field(default_factory=dict)
    """bits/s below which the strategy pays; None where its curve does not cross 1"""
    at_nets: dict[str, dict[str, float]] = field(default_factory=dict)
    """the predicted speedup at each network the comparison measured: net -> strategy -> speedup"""
    step_ms_at_nets: dict[str, dict[str, float]] = field(default_factory=dict)
    """the predicted mean step (ms) of every strategy, the baseline's too, at each network measured"""
    calibration: dict[str, Any] | None = None
    """what the host's calibration measured, and the scale it was priced at (None: not calibrated)"""

    def verdict(self) -> str:
        """One line: below which bandwidth each strategy pays (or that it pays everywhere / nowhere swept)."""
        swept = f"{rate(self.bandwidths[0])}-{rate(self.bandwidths[-1])}" if self.bandwidths else "no bandwidth"
        said = []
        for name, at in self.crossovers.items():
            if at is not None:
                said.append(f"{name} below {rate(at)}")
            else:
                said.append(f"{name} {'everywhere' if min(self.speedups[name], default=0.0) >= 1 else 'nowhere'} "
                            f"in {swept}")
        return f"predicted on the measured step, {self.world} ranks: pays " + ", ".join(said)

    def as_dict(self) -> dict[str, Any]:
        d = {"baseline": self.baseline, "net": self.net, "world": self.world, "compute_ms": self.compute_ms,
             "bandwidths": self.bandwidths, "speedups": self.speedups, "crossovers": self.crossovers,
             "at_nets": self.at_nets, "step_ms_at_nets": self.step_ms_at_nets}
        if self.calibration is not None:
            d["calibration"] = self.calibration
        return d


def rate(bits_per_s: float) -> str:
    """A bandwidth to three significant digits: ``6.61 Gbit/s``, ``480 Mbit/s``."""
    if bits_per_s >= 1e9:
        return f"{bits_per_s / 1e9:.3g} Gbit/s"
    return f"{bits_per_s / 1e6:.3g} Mbit/s"


def crossover(bandwidths: Sequence[float], speedups: Sequence[float]) -> float | None:
    """The bandwidth where ``speedups`` falls through 1 (log-linear between the two points around it).

    The last such crossing when there are several: below it the strategy pays.
    """
    found = None
    for (b0, s0), (b1, s1) in zip(zip(bandwidths, speedups), zip(bandwidths[1:], speedups[1:])):
        if s0 > 1.0 >= s1:
            t = (s0 - 1.0) / (s0 - s1)
            found = math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0)))
    return found


@dataclass(frozen=True)
class Replay:
    """A comparison's trainings as the step model replays them (module doc): per strategy its step and cost."""

    profiles: Mapping[str, "StepProfile"]
    """each strategy's step (its own bucket layout)"""
    costs: Mapping[str, "Cost"]
    """each strategy's exchange CPU cost"""
    world: int
    compute_ms: float
    host: "Host | None" = None
    """the host's real collectives and cores (None: a network of its own, nothing else)"""
    steps: int | None = None
    """the training's steps, whose mean is predicted (warm-up included); None: the steady state"""

    def step(self, strategy: str, net: NetSpec | str, pricers: "Pricers | None" = None) -> float:
        """Predicted mean seconds per step of ``strategy`` on ``net`` (``auto``: its fastest candidate there)."""
        from gradwire.predict import predict

        return min(predict(self.profiles[c], c, net, self.world, self.costs[c], pricers, self.host,
                           self.steps).step_seconds for c in replayed(strategy))

    def steps_on(self, strategies: Sequence[str], net: NetSpec | str,
                 pricers: "Pricers | None" = None) -> dict[str, float]:
        """Predicted mean seconds per step of each of ``strategies`` on ``net``."""
        from gradwire.predict import Pricers

        pricers = pricers or Pricers()
        return {s: self.step(s, net, pricers) for s in strategies}

    def speedups(self, strategies: Sequence[str], net: NetSpec | str,
                 pricers: "Pricers | None" = None) -> dict[str, float]:
        """Predicted speedup of each of ``strategies[1:]`` over ``strategies[0]`` on ``net``."""
        steps = self.steps_on(strategies, net, pricers)
        return {s: steps[strategies[0]] / steps[s] for s in strategies[1:]}


def replayed(strategy: str) -> list[str]:
    """What ``strategy`` is replayed as: itself, or for ``auto`` its candidates, of which the fastest at each
    point (the choice its chooser makes when it prices every exchange alike)."""
    from gradwire.strategies import parse_strategy

    choice = parse_strategy(strategy)
    return [str(c) for c in choice.auto_candidates() or [choice]]


def _layout(model: str, strategy: str, backward_ms: float, forward_ms: float = 0.0, optimizer_ms: float = 0.0,
            batch_size: int | None = None) -> "StepProfile":
    """``model``'s step with ``strategy``'s DDP buckets, backward spread by the layers' FLOPs."""
    from gradwire.strategies import parse_strategy
    from gradwire.predict.describe import describe_model
    from gradwire.train.data import IMAGE_SHAPE
    from gradwire.train.models import MODELS

    cap = parse_strategy(strategy).exchange.bucket_cap_mb
    shape = IMAGE_SHAPE if model in MODELS else None
    ratio = forward_ms / backward_ms if backward_ms > 0 else 0.0
    return describe_model(model, backward_ms, cap, ratio, optimizer_ms, shape, batch_size)


def _with_shapes(ran: "StepProfile", described: "StepProfile") -> tuple[Any, ...]:
    """``ran``'s buckets, each with the described one's parameter shapes where their bytes agree (a
    recorded bucket knows only its size; PyTorch's PowerSGD prices its parameters' matrices)."""
    if [b.nbytes for b in ran.buckets] != [b.nbytes for b in described.buckets]:
        return ran.buckets
    return tuple(replace(r, shapes=d.shapes) for r, d in zip(ran.buckets, described.buckets))


def hook_buckets(model: str, strategies: Sequence[str], world: int) -> dict[Any, list[tuple[Any, ...]]]:
    """The buckets each hook of PyTorch's among ``strategies`` exchanges (what a calibration times)."""
    from gradwire.strategies import parse_strategy

    out: dict[Any, list[tuple[Any, ...]]] = {}
    for s in (c for name in strategies for c in replayed(name)):
        codec = parse_strategy(s).exchange.codec
        if codec is not None and not isinstance(codec, str):
            keys = out.setdefault(codec, [])
            keys += [(b.numel, b.shapes, world) for b in _layout(model, s, 1.0).buckets]
    return out


def replay_for(model: str, compute_ms: float, strategies: Sequence[str], world: int,
               batch_size: int | None = None, calibration: "Calibration | None" = None,
               steps: int | None = None) -> Replay:
    """The :class:`Replay` of ``strategies`` training ``model`` with ``compute_ms`` per step (module doc).

    Without a ``calibration``, forward is taken as half of backward and the
    exchanges' CPU is timed here (no host: the network alone prices the rest).
    """
    from gradwire.strategies import parse_strategy
    from gradwire.predict import calibrated
    from gradwire.predict.plans import exchange_cost

    if not compute_ms > 0:
        raise ValueError(f"compute_ms must be > 0, got {compute_ms}")
    fwd, bwd, opt = calibration.shares if calibration is not None else (1 / 3, 2 / 3, 0.0)
    strategies = list(dict.fromkeys(c for s in strategies for c in replayed(s)))
    profiles = {s: _layout(model, s, compute_ms * bwd, compute_ms * fwd, compute_ms * opt, batch_size)
                for s in strategies}
    costs = {s: (calibration.cost_for(parse_strategy(s).exchange.codec) if calibration is not None
                 else exchange_cost(s)) for s in strategies}
    if calibration is not None:  # each strategy's step as it ran on this host, at the runs' pace
        for s, described in profiles.items():
            ran = calibration.profile(s, compute_ms / 1e3)
            if ran is not None:
                ran = replace(ran, name=described.name, batch_size=batch_size, buckets=_with_shapes(ran, described))
                profiles[s] = calibrated(ran, costs[s], calibration.host)
    return Replay(profiles, costs, world, compute_ms, calibration.host if calibration is not None else None, steps)


def speedup_curves(model: str | Replay, compute_ms: float, strategies: Sequence[str], net: NetSpec, world: int,
                   batch_size: int | None = None, bandwidths: Sequence[float] = BANDWIDTHS) -> SpeedupCurves:
    """Predicted speedups of ``strategies[1:]`` over ``strategies[0]`` as ``net``'s bandwidth sweeps (module doc).

    ``model``: a model name (replayed without a host, :func:`replay_for`), or a :class:`Replay`.
    """
    from gradwire.predict import Pricers

    replay = model if isinstance(model, Replay) else replay_for(model, compute_ms, strategies, world, batch_size)
    out = SpeedupCurves(strategies[0], net.to_string(), replay.world, replay.compute_ms, list(bandwidths))
    steps: dict[str, list[float]] = {s: [] for s in strategies}
    pricers = Pricers()
    for bw in bandwidths:
        # a static link of each bandwidth: a changing network's schedule is priced at the measured nets only
        # (replaying its horizon at every point of the sweep takes minutes), its curve is the steady link's
        spec = replace(net, bandwidth=bw, name="custom", events=())
        for s in strategies:
            steps[s].append(replay.step(s, spec, pricers))
    for s in strategies[1:]:
        out.speedups[s] = [b / t for b, t in zip(steps[strategies[0]], steps[s])]
        out.crossovers[s] = crossover(out.bandwidths, out.speedups[s])
    return out
