"""What `gradwire compare` runs: the experiment as a validated dataclass."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
    """One comparison: every strategy x every network x every seed."""

    nets: tuple[str, ...] = (DEFAULT_NET,)
    """network specs or presets; several make a sweep"""
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    """composed strategy names (``compressor+strategy``); the first is the baseline"""
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
        from gradwire.net import parse_spec
        from gradwire.overlap import parse_strategy
        from gradwire.train.models import MODELS

        if not self.nets:
            raise ValueError("at least one --net is needed")
        for net in self.nets:
            parse_spec(net)
        if not self.strategies:
            raise ValueError("at least one strategy is needed")
        for s in self.strategies:
            parse_strategy(s)
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"strategies repeat: {', '.join(self.strategies)}")
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
