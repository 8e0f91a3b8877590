"""Measure step profiles with short real runs of a bundled model, recorded as ``gradwire profile`` records.

:func:`measure_runs` trains several :class:`MeasureConfig` one after another
in one set of ranks (a fresh process group per run, on that run's network),
each inside a :class:`~gradwire.profile.ProfileSession`, so that every run
is recorded step by step exactly as ``gradwire profile`` records a user's
script (:mod:`gradwire.profile.steps`). ``gradwire predict --model NAME``
measures each strategy once on ``loopback``; ``benchmarks/predict_validate.py``
alternates loopback profiles and the realtime runs they predict.

The training step is the harness's (:mod:`gradwire.train.loop`): the
strategy wraps the model, SGD with the momentum the strategy leaves to it,
``strategy.step`` after backward. Batches are drawn at random from the digits
training set, every batch full, so that every step computes the same.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

from gradwire.predict.recorded import profile_from_steps
from gradwire.predict.timeline import StepProfile

__all__ = ["MeasureConfig", "measure_profiles", "measure_runs", "profile_of", "run_recorded"]

_TIMEOUT = datetime.timedelta(seconds=300)


@dataclass(frozen=True)
class MeasureConfig:
    """One recorded training run."""

    strategy: str
    net: str = "loopback"
    model: str = "cnn-wide"
    steps: int = 60
    batch_size: int = 32
    bucket_cap_mb: float | None = None
    """DDP bucket size of the strategy (None: the strategy's own default)"""
    lr: float = 0.05
    seed: int = 0


def run_recorded(rank: int, world: int, config: MeasureConfig) -> dict[str, Any]:
    """Train ``config`` on the default group (already on its network), recorded step by step (module doc)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import gradwire
    from gradwire.strategies import build_strategy
    from gradwire.profile import ProfileSession
    from gradwire.train.data import load_digits
    from gradwire.train.models import build_model

    strategy = build_strategy(config.strategy, momentum=0.9)
    if config.bucket_cap_mb is not None:
        if not hasattr(strategy, "bucket_cap_mb"):
            raise ValueError(f"strategy {config.strategy!r} has no DDP buckets to size")
        strategy.bucket_cap_mb = config.bucket_cap_mb
    data = load_digits()
    model = build_model(config.model, seed=config.seed)
    gen = torch.Generator().manual_seed(config.seed * 7919 + rank)
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    gradwire.reset_stats()
    times = []
    net = gradwire.network()
    # a step's time on the run's clock: the simulated cluster's (compute priced on its device) or this host's
    now = gradwire.clock if net is not None and net.spec.clock == "sim" else time.perf_counter
    with ProfileSession() as session:  # before wrap: the comm hook registered by wrap is recorded
        module = strategy.wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=strategy.optimizer_momentum)
        strategy.attach(opt)
        for _ in range(config.steps):
            idx = torch.randint(0, len(data.y_train), (config.batch_size,), generator=gen)
            t0 = now()
            opt.zero_grad(set_to_none=True)
            loss_fn(module(data.x_train[idx]), data.y_train[idx]).backward()
            strategy.step(opt)
            times.append(now() - t0)
        strategy.finish(opt)
    assert session.result is not None
    return {"steps": session.result.steps, "hooks": session.result.hooks, "step_seconds": times,
            "host": session.result.host}


def _in_turns(rank: int, world: int, configs: list[MeasureConfig]) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import gradwire

    torch.set_num_threads(1)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=_TIMEOUT)
    out = []
    for i, config in enumerate(configs):
        gradwire.configure(config.net)
        dist.init_process_group("gradwire", store=dist.PrefixStore(f"measure{i}/", store), rank=rank,
                                world_size=world, timeout=_TIMEOUT)
        out.append(run_recorded(rank, world, config))
        dist.destroy_process_group()
    return out


def measure_runs(configs: list[MeasureConfig], world: int, timeout: float = 3600.0) -> list[list[dict[str, Any]]]:
    """Run ``configs`` in turn on ``world`` ranks; ``result[i][rank]`` holds run i's steps and step times."""
    from gradwire.launch import spawn
    from gradwire.train.loop import CPU_ONLY

    if not configs:
        raise ValueError("measure_runs needs at least one config")
    by_rank = spawn(_in_turns, world, (configs,), timeout=timeout, env=CPU_ONLY)
    return [[by_rank[r][i] for r in range(world)] for i in range(len(configs))]


def profile_of(config: MeasureConfig, ranks: list[dict[str, Any]], skip: int = 3) -> StepProfile:
    """The step profile of one measured run (every rank's steps pooled).

    Each bucket's collectives are cut as the strategy's plan says it issues
    them (:func:`gradwire.predict.recorded.exchanges_of`: PyTorch's PowerSGD
    sends three all_reduces per bucket), read off a first pass for the layout.
    """
    from gradwire.predict.plans import plan_for

    label = ranks[0]["hooks"][0] if ranks[0]["hooks"] else config.strategy

    def read(per_bucket: Sequence[Sequence[str]] | None = None) -> StepProfile:
        return profile_from_steps([r["steps"] for r in ranks], config.model, label, skip, config.batch_size,
                                  source="measured", hosts=[r.get("host") for r in ranks], net=config.net,
                                  per_bucket=per_bucket)

    layout = read()
    try:
        plan = plan_for(config.strategy, layout, layout.world)
    except ValueError:  # a strategy predict does not plan: the plain cut
        return layout
    return read([tuple(ph.op for ph in ex.phases) for ex in plan.exchanges])


def measure_profiles(strategies: list[str], model: str, world: int, steps: int = 60,
                     batch_size: int = 32, bucket_cap_mb: float | None = None) -> dict[str, StepProfile]:
    """One short loopback run per strategy on ``world`` ranks; its profile, by strategy name."""
    configs = [MeasureConfig(s, "loopback", model, steps, batch_size, bucket_cap_mb) for s in strategies]
    runs = measure_runs(configs, world)
    return {s: profile_of(c, r) for s, c, r in zip(strategies, configs, runs)}
