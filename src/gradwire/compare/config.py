"""What `gradwire compare` runs: the experiment as a validated dataclass."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradwire.net import NetSpec, parse_spec
from gradwire.overlap import StrategyChoice, parse_strategy

__all__ = ["CompareConfig", "DEFAULT_NET", "DEFAULT_STRATEGIES", "COMPUTE_ONLY"]

#: The default network: slow enough that the baseline spends 30-50% of each
#: step of the default model in exposed communication on 4 workers (measured
#: by ``benchmarks/compare_default.sh``), the regime the reference articles
#: describe.
DEFAULT_NET = "bandwidth=1.5gbit,latency=100us"

#: baseline, ours, and PyTorch's own DDP hooks as peers
DEFAULT_STRATEGIES = ("sync", "onebit", "delayed", "onebit+delayed", "torch-fp16", "torch-powersgd:4")

#: the name of the run with no communication cost (``sync`` on ``loopback``)
COMPUTE_ONLY = "compute-only"


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: every strategy x every network x every seed.

    Networks and strategies may be given as strings; they are parsed once,
    here, and kept parsed (``str(strategy)`` and ``net.to_string()`` name them).
    """

    nets: tuple[NetSpec, ...] = field(default_factory=lambda: (parse_spec(DEFAULT_NET),))
    """networks (spec strings or presets accepted); several make a sweep"""
    strategies: tuple[StrategyChoice, ...] = field(
        default_factory=lambda: tuple(parse_strategy(s) for s in DEFAULT_STRATEGIES))
    """composed strategies (``compressor+strategy`` names accepted); the first is the baseline"""
    workers: int = 4
    """ranks per training run"""
    model: str = "cnn-wide"
    """a model of :data:`gradwire.train.models.MODELS`"""
    epochs: int = 10
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_size: int = 32
    """per-worker batch size"""
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

        if not self.nets:
            raise ValueError("at least one --net is needed")
        object.__setattr__(self, "nets", tuple(parse_spec(net) for net in self.nets))
        if not self.strategies:
            raise ValueError("at least one strategy is needed")
        object.__setattr__(self, "strategies", tuple(parse_strategy(s) for s in self.strategies))
        names = [str(s) for s in self.strategies]
        if len(set(names)) != len(names):
            raise ValueError(f"strategies repeat: {', '.join(names)}")
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

    @property
    def net_names(self) -> tuple[str, ...]:
        """The networks as spec strings, in order."""
        return tuple(net.to_string() for net in self.nets)

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies as composed names, in order (the first is the baseline)."""
        return tuple(str(s) for s in self.strategies)

    def as_dict(self) -> dict[str, Any]:
        """The config in plain types, for results files."""
        return {**asdict(self), "nets": list(self.net_names), "strategies": list(self.strategy_names),
                "out": str(self.out)}
