"""Measure a :class:`StepProfile` with a short real run on ``loopback``."""
from __future__ import annotations

import statistics
from typing import Any, Sequence

from gradwire.predict.model import OVERLAPPED, Collective, StepProfile

__all__ = ["measure_profiles", "pooled_median", "profile_from_result"]


def pooled_median(results: Sequence[Any], attr: str, skip: int = 3) -> float:
    """Median of one per-step series over every rank's steps after the first ``skip``.

    Pooling the ranks makes a short run's figure steadier: with more ranks than
    cores, which rank waits for which changes from step to step.
    """
    values = [v for r in results for v in getattr(r, attr)[skip:]]
    if not values:
        raise ValueError(f"no steps after the first {skip} to take the median of {attr!r}")
    return statistics.median(values)


def profile_from_result(strategy: str, result: Any, world: int, skip: int = 3) -> StepProfile:
    """A StepProfile from a run's RunResult (``gradwire.train.loop``), or a list of every rank's.

    The first ``skip`` steps are warm-up. Compute, real communication and the
    whole step are medians over every given rank's steps; the collectives are
    rank 0's (every rank issues the same ones).
    """
    from gradwire.compress import Pattern, get_compressor
    from gradwire.overlap import parse_strategy

    results = list(result) if isinstance(result, (list, tuple)) else [result]
    result = results[0]
    choice = parse_strategy(strategy)
    compressor, spec = choice.compressor, choice.spec
    steps = len(result.step_seconds)
    if steps <= skip:
        raise ValueError(f"need more than {skip} steps to profile {strategy!r}, got {steps}")
    compute = pooled_median(results, "step_compute", skip)
    real = pooled_median(results, "step_exposed", skip)
    collectives = [
        Collective(op, s["payload_bytes"] / s["calls"], s["calls"] / steps)
        for op, s in result.stats.items()
        if op != "total" and s["calls"]
    ]
    two_phase = compressor is not None and get_compressor(compressor).pattern is Pattern.TWO_PHASE
    return StepProfile(strategy, world, compute, real, collectives, spec.name in OVERLAPPED, two_phase,
                       loop_seconds=pooled_median(results, "step_seconds", skip))


def measure_profiles(strategies: list[str], model: str, world: int, steps: int = 30,
                     batch_size: int = 32, lr: float = 0.05) -> list[StepProfile]:
    """Run each strategy for ``steps`` steps on ``loopback`` with ``world`` ranks; profile every rank."""
    from gradwire.train.loop import TrainConfig, run_training

    out = []
    for s in strategies:
        cfg = TrainConfig(strategy=s, net="loopback", model=model, epochs=1000, max_steps=steps,
                          batch_size=batch_size, lr=lr)
        out.append(profile_from_result(s, run_training(cfg, world), world))
    return out
