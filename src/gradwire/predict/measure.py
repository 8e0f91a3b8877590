"""Measure a :class:`StepProfile` with a short real run on ``loopback``."""
from __future__ import annotations

import statistics

from gradwire.predict.model import OVERLAPPED, Collective, StepProfile

__all__ = ["measure_profiles", "profile_from_result"]


def profile_from_result(strategy: str, result: object, world: int, skip: int = 3) -> StepProfile:
    """A StepProfile from one rank's RunResult (``gradwire.train.loop``); the first ``skip`` steps are warm-up."""
    from gradwire.compress import Pattern, get_compressor
    from gradwire.overlap import parse_strategy

    compressor, spec = parse_strategy(strategy)
    steps = len(result.step_seconds)  # type: ignore[attr-defined]
    if steps <= skip:
        raise ValueError(f"need more than {skip} steps to profile {strategy!r}, got {steps}")
    compute = statistics.median(result.step_compute[skip:])  # type: ignore[attr-defined]
    real = statistics.median(result.step_exposed[skip:])  # type: ignore[attr-defined]
    collectives = [
        Collective(op, s["payload_bytes"] / s["calls"], s["calls"] / steps)
        for op, s in result.stats.items()  # type: ignore[attr-defined]
        if op != "total" and s["calls"]
    ]
    two_phase = compressor is not None and get_compressor(compressor).pattern is Pattern.TWO_PHASE
    return StepProfile(strategy, world, compute, real, collectives, spec.name in OVERLAPPED, two_phase)


def measure_profiles(strategies: list[str], model: str, world: int, steps: int = 30,
                     batch_size: int = 32, lr: float = 0.05) -> list[StepProfile]:
    """Run each strategy for ``steps`` steps on ``loopback`` with ``world`` ranks; profile rank 0."""
    from gradwire.train.loop import TrainConfig, run_training

    out = []
    for s in strategies:
        cfg = TrainConfig(strategy=s, net="loopback", model=model, epochs=1000, max_steps=steps,
                          batch_size=batch_size, lr=lr)
        result = run_training(cfg, world)[0]
        out.append(profile_from_result(s, result, world))
    return out
