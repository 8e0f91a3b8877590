"""What `gradwire compare` runs: the experiment as a validated dataclass."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradwire.net import NetSpec, parse_spec
from gradwire.strategies import StrategyChoice, parse_strategy

__all__ = ["COMPUTE_ONLY", "IDEAL_NET", "IDEAL_NOTE", "CompareConfig", "DEFAULT_NET", "DEFAULT_NETS", "DEFAULT_STRATEGIES", "FAST_NET",
           "Named", "default_workers", "usable_cores"]

#: The communication-bound default network: slow enough that the baseline
#: waits on the network for more than half of each step of the default model
#: (the regime of the reference articles), fast enough that the compressed
#: strategies' CPU work is not the whole story. Also the default of a
#: comparison of a script and of ``gradwire predict``.
DEFAULT_NET = "bandwidth=500mbit,latency=100us"
#: The compute-bound default network: the baseline waits on it for 15% of a
#: step or less, where compression does not pay for its CPU work.
FAST_NET = "bandwidth=10gbit,latency=20us"
#: ``gradwire compare``'s default networks: both regimes, one table each.
DEFAULT_NETS = (DEFAULT_NET, FAST_NET)

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

    def _parse_named(self) -> None:
        """Parse the networks and strategies given as strings, in place (a frozen dataclass's ``__post_init__``)."""
        if not self.nets:
            raise ValueError("at least one --net is needed")
        object.__setattr__(self, "nets", tuple(parse_spec(net) for net in self.nets))
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
        """(net, strategy) of every run, in table order: compute-only first, on the first network (its ideal)."""
        nets = self.net_names
        return [(nets[0], COMPUTE_ONLY)] + [(net, s) for net in nets for s in self.strategy_names]

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

    nets: tuple[NetSpec, ...] = field(default_factory=lambda: tuple(parse_spec(n) for n in DEFAULT_NETS))
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
