"""The training worker: one rank of a run with a strategy (+ compressor) on a simulated network.

``run_training(TrainConfig(...), world_size)`` spawns the ranks and returns
each rank's :class:`RunResult`; the comparison harness builds on it. Per rank:

1. ``gradwire.configure(net)``, ``init_process_group("gradwire")``.
2. Seed, build the model, ``strategy.wrap`` (rank 0's weights everywhere),
   SGD with the momentum the strategy leaves to the optimizer.
3. Reset the backend's counters (setup traffic is not training traffic),
   then train: for each step, time the window, ask the strategy for its wait
   windows (exposed), and after training price each window's collectives from
   the event log (:func:`gradwire.strategies.step_comm_seconds`) and split each
   step's waiting into network and peer/CPU (:func:`gradwire.strategies.split_exposed`).
4. ``strategy.finish`` (drain; every rank ends with the same model), test
   accuracy, counters, and a checksum of the parameters to show the ranks agree.

Evaluation is outside the step windows and the epoch times.
The result is returned (it travels to the parent before teardown, see
:mod:`gradwire.launch`).
"""
from __future__ import annotations

import datetime
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gradwire.net import NetSpec
from gradwire.exchange.chooser import live_choosers
from gradwire.strategies import StrategyChoice, parse_strategy
from gradwire.train.data import load_digits, shard_batches
from gradwire.train.models import build_model, num_parameters

#: a collective that waits longer than this fails the training (a hung peer, a deadlock)
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=300)

__all__ = ["RunResult", "TrainConfig", "evaluate", "run_in_turns", "run_training", "train_in_turns", "train_rank",
           "train_worker"]


@dataclass(frozen=True)
class TrainConfig:
    """One training run; every rank gets the same config.

    ``strategy`` and ``net`` are parsed once, here (a name or a spec string
    is accepted and replaced by its parsed form), so a bad name fails in the
    parent before any rank starts.
    """

    strategy: StrategyChoice = field(default_factory=lambda: parse_strategy("sync"))
    """composed strategy, e.g. ``"onebit+delayed"`` (see :mod:`gradwire.strategies.registry`)"""
    net: NetSpec = field(default_factory=lambda: NetSpec.of("loopback"))
    """network of the gradwire backend, e.g. ``"bandwidth=100mbit,latency=100us"``"""
    model: str = "cnn"
    """model name (:data:`gradwire.train.models.MODELS`)"""
    seed: int = 0
    """seeds the initial weights and the data order"""
    epochs: int = 5
    batch_size: int = 32
    """per-rank batch size"""
    lr: float = 0.05
    momentum: float = 0.9
    max_steps: int | None = None
    """stop after this many steps in total (tests); None: full epochs"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", parse_strategy(self.strategy))
        object.__setattr__(self, "net", NetSpec.of(self.net))
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")


    def as_dict(self) -> dict[str, Any]:
        """The config in plain types (strategy and network as their names), for results files."""
        return {**asdict(self), "strategy": str(self.strategy), "net": self.net.to_string()}


@dataclass
class RunResult:
    """What one rank measured. Times in seconds; per-step lists have one entry per step."""

    rank: int
    world: int
    config: dict[str, Any]
    num_parameters: int
    epoch_seconds: list[float] = field(default_factory=list)
    epoch_accuracy: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    step_compute: list[float] = field(default_factory=list)
    step_comm_model: list[float] = field(default_factory=list)
    step_exposed: list[float] = field(default_factory=list)
    """seconds the training thread waited on communication (network, late peer or callback CPU work)"""
    step_exposed_network: list[float] = field(default_factory=list)
    """the part of ``step_exposed`` spent waiting for the modelled network (realtime clock)"""
    collectives: int = 0
    """collectives issued inside step windows"""
    finish_seconds: float = 0.0
    """the final drain (strategy.finish), outside the step windows"""
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    """``gradwire.stats()`` of the whole training (setup excluded)"""
    test_accuracy: float = 0.0
    param_checksum: float = 0.0
    first_step_at: float | None = None
    """on the simulated clock, the instant the first step began: seconds since the group was created, the
    schedule's ``t = 0`` (what set-up took: building the model, DDP's first broadcast); None on the realtime one"""
    auto: list[dict[str, Any]] = field(default_factory=list)
    """``auto``'s decisions (:meth:`gradwire.exchange.chooser.AutoChooser.summary`), when the strategy uses it"""

    def summary(self) -> dict[str, float]:
        """Totals: compute, modelled and exposed communication, and the exposed fractions.

        ``exposed_network_fraction`` (network-exposed / modelled) is the share
        of the communication the strategy failed to hide; ``exposed_fraction``
        counts every wait, including waiting for a late peer.
        """
        comm = sum(self.step_comm_model)
        exposed = sum(self.step_exposed)
        network = sum(self.step_exposed_network)
        return {
            "steps": len(self.step_seconds), "wall": sum(self.step_seconds), "compute": sum(self.step_compute),
            "comm_model": comm, "exposed": exposed, "exposed_fraction": exposed / comm if comm > 0 else 0.0,
            "exposed_network": network, "exposed_other": exposed - network,
            "exposed_network_fraction": network / comm if comm > 0 else 0.0,
            "collectives": self.collectives, "test_accuracy": self.test_accuracy,
        }


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train(was_training)
    return acc


def train_worker(rank: int, world: int, config: TrainConfig) -> RunResult:
    """Initialise the gradwire group on ``config.net`` and train one rank (for :func:`gradwire.launch.spawn`)."""
    import torch.distributed as dist

    import gradwire

    torch.set_num_threads(1)
    gradwire.configure(config.net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    return train_rank(config)


def train_rank(config: TrainConfig) -> RunResult:
    """Train on the already initialised default group (several runs may share one group).

    ``config.net`` is not applied here: the group was created on its network already.
    """
    import torch.distributed as dist

    import gradwire
    from gradwire.strategies import split_exposed, step_comm_seconds

    rank, world = dist.get_rank(), dist.get_world_size()
    built = time.perf_counter()
    strategy = config.strategy.build(momentum=config.momentum)
    data = load_digits()
    model = build_model(config.model, seed=config.seed)
    module = strategy.wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=strategy.optimizer_momentum)
    strategy.attach(opt)
    loss_fn = nn.CrossEntropyLoss()
    result = RunResult(rank, world, config.as_dict(), num_parameters(model))
    windows: list[tuple[float, float]] = []
    waits: list[list[tuple[float, float]]] = []
    dist.barrier()
    gradwire.reset_stats()
    net = gradwire.network()
    simulated = net is not None and net.spec.clock == "sim"
    # the simulated cluster's clock, or this host's wall clock; a straggler's slower compute is the clock's on
    # the simulated one (backend), stretched here on the realtime one
    now = gradwire.clock if simulated else time.perf_counter
    slowdown = (net.compute_factor(rank) - 1.0) if net is not None and not simulated else 0.0
    steps = 0
    for epoch in range(config.epochs):
        t_epoch = now()
        for x, y in shard_batches(data, rank, world, config.batch_size, config.seed, epoch):
            t0, c0, e0 = now(), gradwire.clock(), gradwire.backend.exposed()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(module(x), y)
            if slowdown > 0:
                # a straggler (spec ``straggler=R:compute=F``) computes F times slower: stretch
                # forward + backward (about 3x the forward) before backward starts communicating
                time.sleep(slowdown * 3 * (time.perf_counter() - t0))
            loss.backward()
            strategy.step(opt)
            wall = now() - t0
            windows.append((c0, gradwire.clock()))
            waits.append(strategy.pop_waits())
            exposed = (gradwire.backend.exposed() - e0 if simulated
                       else sum(end - start for start, end in waits[-1]))
            result.step_seconds.append(wall)
            result.step_exposed.append(exposed)
            result.step_compute.append(max(0.0, wall - exposed))
            steps += 1
            gradwire.backend.mark_step()
            if config.max_steps is not None and steps >= config.max_steps:
                break
        result.epoch_seconds.append(now() - t_epoch)
        result.epoch_accuracy.append(evaluate(model, data.x_test, data.y_test))
        if config.max_steps is not None and steps >= config.max_steps:
            break
    if simulated and windows:
        result.first_step_at = windows[0][0]
    t_finish = now()
    strategy.finish(opt)
    result.finish_seconds = now() - t_finish
    events = gradwire.events()
    result.step_comm_model, result.collectives = step_comm_seconds(events, windows)
    # on the simulated clock every jump of the rank's time is a wait for the network (a late peer's issue included)
    result.step_exposed_network = list(result.step_exposed) if simulated else split_exposed(events, waits)
    result.stats = gradwire.stats().as_dict()
    result.test_accuracy = evaluate(model, data.x_test, data.y_test)
    with torch.no_grad():
        result.param_checksum = float(sum(p.double().sum() for p in model.parameters()))
    result.auto = [c.summary() for c in live_choosers(since=built)]
    return result


#: the environment of CPU training ranks: GPUs hidden, so that no library takes the CUDA path
#: for CPU tensors (PyTorch's powerSGD_hook synchronizes "the bucket's CUDA device" whenever
#: CUDA is available, and fails on a CPU bucket)
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def run_training(config: TrainConfig, world_size: int, timeout: float = 600.0) -> list[RunResult]:
    """Spawn ``world_size`` ranks of :func:`train_worker`; return their results by rank."""
    from gradwire.launch import spawn

    return spawn(train_worker, world_size, (config,), timeout=timeout, env=CPU_ONLY)


def train_in_turns(rank: int, world: int, configs: list[TrainConfig],
                   on_result: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Train every config in turn in this set of processes, each on a new default group of its network.

    One TCP store (hosted by rank 0 at ``MASTER_ADDR:MASTER_PORT``) serves every
    training; each group keeps its keys under a prefix of its own, so groups
    never meet. ``on_result(i, result)`` is called as training ``i`` ends
    (the comparison harness reports it to the parent there). A collective
    that waits longer than ``COLLECTIVE_TIMEOUT`` raises, so a hung peer fails
    the training instead of the whole set hanging.
    """
    import os

    import torch.distributed as dist

    import gradwire

    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"train_in_turns needs {' and '.join(missing)} in the environment (rank 0 hosts the "
                           "store there); start it through gradwire.launch.spawn, run_in_turns or torchrun")
    torch.set_num_threads(1)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=COLLECTIVE_TIMEOUT)
    results = []
    for i, config in enumerate(configs):
        gradwire.configure(config.net)
        dist.init_process_group("gradwire", store=dist.PrefixStore(f"training{i}/", store), rank=rank,
                                world_size=world, timeout=COLLECTIVE_TIMEOUT)
        result = train_rank(config)
        dist.destroy_process_group()
        if on_result is not None:
            on_result(i, result)
        results.append(result)
    return results


def run_in_turns(configs: list[TrainConfig], world_size: int, timeout: float = 1800.0) -> list[list[RunResult]]:
    """Train ``configs`` one after another in one set of ``world_size`` processes; results[i][rank].

    Trainings measured side by side (e.g. a loopback profile and the run it
    predicts) see the same machine: alternate them to cancel slow drift.
    """
    from gradwire.launch import spawn

    if not configs or not all(isinstance(c, TrainConfig) for c in configs):
        raise ValueError(f"run_in_turns needs a non-empty list of TrainConfig, got {configs!r:.200}")
    by_rank = spawn(train_in_turns, world_size, (configs,), timeout=timeout, env=CPU_ONLY)
    return [[by_rank[r][i] for r in range(world_size)] for i in range(len(configs))]
