"""Where each strategy pays: the predicted speedup over the baseline against bandwidth.

A comparison measures two or three networks; between and beyond them the
answer comes from :mod:`gradwire.predict`, on the step the comparison
measured: the model's DDP buckets on the meta device, the compute-only run's
step compute (forward + backward + optimizer) spread as forward = half of
backward, and each compressor's CPU cost timed on this machine
(:func:`gradwire.predict.codec.codec_cost`). Every strategy is replayed on the
first network with its bandwidth swept, the other link settings kept.

The crossover of a strategy is the bandwidth at which its predicted speedup
crosses 1: below it the strategy pays, above it its own work costs more than
the network time it saves. A strategy with no CPU work of its own
(``delayed``) never loses in the model and has no crossover; a compressor that
costs more than it saves on every network has none either. The measured
speedups are drawn on the same axes, so the plot shows how far the model
is from the runs.

Trap: the prediction prices the network, the overlap and the compressors' CPU
work; it does not see two ranks sharing a core, nor the real collective's own
CPU cost on the training machine. On a 2-core machine, a fast network's
measured speedups sit below the curve for strategies whose background work
competes with the compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from gradwire.net import NetSpec

__all__ = ["BANDWIDTHS", "SpeedupCurves", "crossover", "rate", "speedup_curves"]

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
        return {"baseline": self.baseline, "net": self.net, "world": self.world, "compute_ms": self.compute_ms,
                "bandwidths": self.bandwidths, "speedups": self.speedups, "crossovers": self.crossovers}


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


def speedup_curves(model: str, compute_ms: float, strategies: Sequence[str], net: NetSpec, world: int,
                   batch_size: int | None = None,
                   bandwidths: Sequence[float] = BANDWIDTHS) -> SpeedupCurves:
    """Predicted speedups of ``strategies[1:]`` over ``strategies[0]`` as ``net``'s bandwidth sweeps (module doc)."""
    from gradwire.predict import Pricers, predict
    from gradwire.predict.codec import codec_cost
    from gradwire.predict.describe import describe_model
    from gradwire.overlap import parse_strategy
    from gradwire.predict.model import uses_compressor

    if not compute_ms > 0:
        raise ValueError(f"compute_ms must be > 0, got {compute_ms}")
    profile = describe_model(model, compute_ms / 1.5, batch_size=batch_size)
    # ``auto`` is replayed as its candidates: at each bandwidth the fastest of them (``none``: the strategy
    # uncompressed), the choice its chooser makes when it prices every exchange alike
    replayed = {s: [str(c) for c in parse_strategy(s).auto_candidates() or [parse_strategy(s)]] for s in strategies}
    costs = {}
    for s in (c for cands in replayed.values() for c in cands):
        name = uses_compressor(s)
        if name is not None and name not in costs:
            costs[name] = codec_cost(name)
    baseline = strategies[0]
    out = SpeedupCurves(baseline, net.to_string(), world, compute_ms, list(bandwidths))
    steps: dict[str, list[float]] = {s: [] for s in strategies}
    pricers = Pricers()
    for bw in bandwidths:
        spec = replace(net, bandwidth=bw, name="custom")
        for s in strategies:
            steps[s].append(min(predict(profile, c, spec, world, costs.get(name) if (name := uses_compressor(c))
                                        else None, pricers).step_seconds for c in replayed[s]))
    for s in strategies[1:]:
        out.speedups[s] = [b / t for b, t in zip(steps[baseline], steps[s])]
        out.crossovers[s] = crossover(out.bandwidths, out.speedups[s])
    return out
