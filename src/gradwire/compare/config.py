"""What `gradwire compare` runs: the experiment as a validated dataclass."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradwire.net import NetSpec
from gradwire.strategies import StrategyChoice, parse_strategy

__all__ = ["COMPUTE_ONLY", "DEFAULT_CLOCK", "DEFAULT_DEVICE", "ideal_of", "on_clock", "DEFAULT_TOLERANCE", "IDEAL_NET", "IDEAL_NOTE", "CompareConfig", "DEFAULT_NET", "DEFAULT_NETS",
           "DEFAULT_STRATEGIES", "FAST_NET", "Named", "Tolerance", "default_workers", "usable_cores"]

#: The communication-bound default network: slow enough that the baseline
#: waits on the network for more than half of each step of the default model
#: (the regime of the reference articles), fast enough that the compressed
#: strategies' CPU work is not the whole story. Also the default of a
#: comparison of a script and of ``gradwire predict``.
DEFAULT_NET = "bandwidth=500mbit,latency=100us"
#: The compute-bound default network: the baseline waits on it for 15% of a
#: step or less, where compression does not pay for its CPU work.
FAST_NET = "bandwidth=10gbit,latency=20us"
#: The communication-bound network of the bundled models' default comparison. On the simulated clock's
#: default device (cpu-core) the bundled CNN computes a step in about 57 ms, and its 2.4 MB of gradients take
#: about 0.1 s at 200 Mbit/s (the baseline waits for most of its step); at 500 Mbit/s it would wait for
#: about 40%, between the two regimes.
SLOW_NET = "bandwidth=200mbit,latency=100us"
#: ``gradwire compare``'s default networks: both regimes, one table each.
DEFAULT_NETS = (SLOW_NET, FAST_NET)

#: The device a default comparison's ranks compute on, on the simulated cluster clock: a roofline device,
#: so that every time figure is the same on any host, busy or not (gradwire.device.catalog)
DEFAULT_DEVICE = "cpu-core"
#: the clock of a default comparison of the bundled models: the simulated cluster's
DEFAULT_CLOCK = "sim"

#: baseline, ours, and PyTorch's own DDP hooks as peers
DEFAULT_STRATEGIES = ("sync", "onebit", "delayed", "onebit+delayed", "torch-fp16", "torch-powersgd:4")

#: the name of the run with no communication at all: ``sync`` on the ``local`` network
COMPUTE_ONLY = "compute-only"
#: where compute-only runs: every reduction answered from the rank's own data (no network, no real
#: collective), the rare other ops at 0 s, so its time is a bound on what any strategy can reach
IDEAL_NET = "local"
#: how the tables say it
IDEAL_NOTE = ("compute-only: the baseline with every gradient all_reduce answered on the rank itself (no network, no "
              "real collective; other ops at 0 s): a bound on every strategy's time. Its ranks train apart, so its "
              "accuracy is rank 0's own.")


def on_clock(net: NetSpec, clock: str, device: str | None) -> NetSpec:
    """``net`` on ``clock`` (``sim``: compute priced on ``device``; ``realtime``: this host's wall clock)."""
    from dataclasses import replace

    if clock == "realtime":
        return replace(net, clock="realtime", device=None)
    return replace(net, clock="sim", device=device or net.device or DEFAULT_DEVICE)


def ideal_of(net: NetSpec) -> NetSpec:
    """The network compute-only runs on for ``net``'s table: no communication, on ``net``'s clock and device."""
    from dataclasses import replace

    return replace(NetSpec.of(IDEAL_NET), clock=net.clock, device=net.device)


def clock_words(net: NetSpec) -> str:
    """What a table's times are: ``simulated cluster clock, cpu-core (...)`` or ``this host's wall clock``."""
    if net.clock != "sim":
        return "this host's wall clock (realtime)"
    from gradwire.device import parse_device

    return f"simulated cluster clock; device {parse_device(net.device or 'host').describe()}"


@dataclass(frozen=True)
class Tolerance:
    """How much worse than the baseline's a final metric may end and still be sound (:mod:`gradwire.compare.report`).

    A loss is judged relative to the baseline's, a share (an accuracy) in
    points, each on its own scale. Spelled as ``--tolerance`` takes it:
    ``loss=2%,accuracy=1pt`` (:meth:`parse`, ``str()``).
    """

    loss: float = 0.02
    """a loss-like metric (loss, perplexity, MSE, ...): a share of the baseline's mean (0.02: up to 2% higher)"""
    accuracy: float = 1.0
    """a share-like metric (accuracy, F1, AUC, error rate, ...): percentage points (1: 0.91 may end at 0.90;
    a metric reported in percent, 91.0 at 90.0)"""

    def __post_init__(self) -> None:
        if not 0 <= self.loss <= 1:
            raise ValueError(f"a loss tolerance is a share from 0 to 1 of the baseline's loss (0.02: 2%), got {self.loss}")
        if not 0 <= self.accuracy <= 100:
            raise ValueError(f"an accuracy tolerance is from 0 to 100 points (1: 0.91 may end at 0.90), got "
                             f"{self.accuracy}")

    def spelled(self, kind: str) -> str:
        """One part as ``--tolerance`` spells it: ``loss=2%`` or ``accuracy=1pt``."""
        return f"loss={self.loss * 100:.4g}%" if kind == "loss" else f"accuracy={self.accuracy:.4g}pt"

    def __str__(self) -> str:
        return f"{self.spelled('loss')},{self.spelled('accuracy')}"

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``loss=2%,accuracy=1pt``; either part alone, the other keeping its default.

        A loss takes a share (``2%`` or ``0.02``), an accuracy points (``1pt``):
        a bare number or a percent of an accuracy would be ambiguous (relative,
        or absolute?), so it is refused.
        """
        example = "e.g. --tolerance loss=2%,accuracy=1pt, or one of the two"
        given: dict[str, float] = {}
        for part in text.split(","):
            name, eq, value = (x.strip() for x in part.partition("="))
            if not eq or name not in ("loss", "accuracy"):
                raise ValueError(f"expected loss=SHARE and/or accuracy=POINTS, got {part.strip()!r} ({example})")
            if name in given:
                raise ValueError(f"{name} is given twice ({example})")
            given[name] = _loss_share(value) if name == "loss" else _points(value)
        return cls(**given)


def _loss_share(text: str) -> float:
    """``2%`` or ``0.02`` as 0.02, from 0 to 1."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise ValueError(f"loss={text}: expected a share of the baseline's loss from 0% to 100%, such as 2% or 0.02 "
                         "(a loss is judged relative to the baseline's)")
    return value


def _points(text: str) -> float:
    """``1pt`` as 1.0, from 0 to 100 points."""
    try:
        value = float(text[:-2]) if text.endswith("pt") else math.nan
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:
        raise ValueError(f"accuracy={text}: expected points from 0pt to 100pt, such as 1pt or 0.5pt (an accuracy is "
                         "judged in absolute points: 1pt lets 0.91 end at 0.90)")
    return value


#: the tolerance of ``gradwire compare`` unless ``--tolerance`` says otherwise
DEFAULT_TOLERANCE = Tolerance()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_workers() -> int:
    """One rank per core, at least 2 (a collective needs two) and at most 16.

    More ranks than cores would make compute contention look like
    communication: a rank waiting in a collective for a peer that is not
    running is indistinguishable, to that rank, from a slow network.
    """
    return max(2, min(16, usable_cores()))


class Named:
    """The names of a comparison's parsed networks and strategies (for configs that hold both)."""

    nets: tuple[NetSpec, ...]
    strategies: tuple[StrategyChoice, ...]
    ideal: bool

    def _parse_named(self) -> None:
        """Parse the networks and strategies given as strings, in place (a frozen dataclass's ``__post_init__``)."""
        if not self.nets:
            raise ValueError("at least one --net is needed")
        object.__setattr__(self, "nets", tuple(NetSpec.of(net) for net in self.nets))
        if not self.strategies:
            raise ValueError("at least one strategy is needed")
        object.__setattr__(self, "strategies", tuple(parse_strategy(s) for s in self.strategies))
        names = [str(s) for s in self.strategies]
        if len(set(names)) != len(names):
            raise ValueError(f"strategies repeat: {', '.join(names)}")

    @property
    def net_names(self) -> tuple[str, ...]:
        """The networks as spec strings, in order."""
        return tuple(net.to_string() for net in self.nets)

    @property
    def run_names(self) -> list[tuple[str, str]]:
        """(net, strategy) of every run, in table order: compute-only first, on the first network (its ideal),
        unless ``ideal`` is off."""
        nets = self.net_names
        ideal = [(nets[0], COMPUTE_ONLY)] if self.ideal else []
        return ideal + [(net, s) for net in nets for s in self.strategy_names]

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies as composed names, in order (the first is the baseline)."""
        return tuple(str(s) for s in self.strategies)


@dataclass(frozen=True)
class CompareConfig(Named):
    """One comparison: every strategy x every network x every seed.

    Networks and strategies may be given as strings; they are parsed once,
    here, and kept parsed (``str(strategy)`` and ``net.to_string()`` name them).
    """

    nets: tuple[NetSpec, ...] = field(
        default_factory=lambda: tuple(on_clock(NetSpec.of(n), DEFAULT_CLOCK, DEFAULT_DEVICE) for n in DEFAULT_NETS))
    """networks (spec strings or presets accepted); several make a sweep"""
    strategies: tuple[StrategyChoice, ...] = field(
        default_factory=lambda: tuple(parse_strategy(s) for s in DEFAULT_STRATEGIES))
    """composed strategies (``compressor+strategy`` names accepted); the first is the baseline"""
    workers: int = field(default_factory=default_workers)
    """ranks per training run (default: :func:`default_workers`)"""
    model: str = "cnn-wide"
    """a model of :data:`gradwire.train.models.MODELS`"""
    epochs: int = 10
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_size: int = 64
    """per-worker batch size. 64 on 2 workers is the global batch of 128 the digits models train well
    with in 10 epochs; per-step costs of a strategy (compression, copies) weigh half as much as at 32"""
    lr: float = 0.05
    target_accuracy: float = 0.9
    """time-to-accuracy is measured to this test accuracy"""
    out: Path = field(default_factory=lambda: Path("gradwire-compare"))
    """folder for results.json and the plots"""
    timeout: float = 900.0
    """seconds one run (a strategy, all its seeds) may take"""
    interleave: bool = True
    """run the strategies' trainings in turns in one set of processes (see :mod:`gradwire.compare.runner`)"""
    ideal: bool = True
    """train compute-only too (:data:`IDEAL_NOTE`): the table's ideal bound, the share of it and the predicted
    column need it; off, a comparison takes one training fewer per seed"""

    def __post_init__(self) -> None:
        from gradwire.train.models import MODELS

        self._parse_named()
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; valid models: {', '.join(sorted(MODELS))}")
        if not 2 <= self.workers <= 16:
            raise ValueError(f"--workers must be between 2 and 16, got {self.workers}")
        if self.epochs < 1 or self.batch_size < 1 or not self.seeds:
            raise ValueError("--epochs and --batch-size must be >= 1 and at least one seed is needed")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not 0 < self.target_accuracy <= 1:
            raise ValueError(f"--target must be in (0, 1], got {self.target_accuracy}")

    def as_dict(self) -> dict[str, Any]:
        """The config in plain types, for results files."""
        return {**asdict(self), "nets": list(self.net_names), "strategies": list(self.strategy_names),
                "out": str(self.out)}
