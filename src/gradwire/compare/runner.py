"""Run the comparison: every (network, strategy) trained once per seed, side by side.

Each training is a run of its own: a freshly created ``gradwire`` process group
on its network, a fresh model, optimizer and strategy, and the seed's weights
and data order (:func:`gradwire.train.loop.train_rank`). The ``compute-only``
run is ``sync`` on ``loopback``: the same work with no modelled network cost.

Interleaving (the default). The trainings of every strategy share one set of
worker processes and take turns: round ``k`` trains every strategy on seed
``k``, in an order rotated from round to round. A machine whose speed drifts over minutes
(other load, the way 4 ranks are placed on 2 cores: the compute-only run moved
by 10% between comparisons run one after another) then shifts every strategy
alike, and each speedup is a ratio of times measured side by side. The process
start-up is paid once. ``interleave=False`` gives each strategy processes of
its own and runs its seeds back to back, one strategy after another.

Faults. A rank that raises, or a set of processes that outlives its timeout,
fails the training it was in: that strategy is recorded as failed with the
rank's traceback, its remaining seeds are dropped, and the trainings not run
yet go on in fresh processes. ``results.json`` is rewritten after every
training, so nothing finished is lost; an earlier comparison in the same
folder is moved to ``previous-<time>/``, not overwritten. These books, and
Ctrl-C, are :class:`gradwire.compare.ledger.Ledger`'s, as for a script.

A run is ``"finished"`` once all its seeds trained (``"status": "ok"``) or it
failed (``"status": "failed"`` with the error). Until then it is ``"status":
"not finished"`` (``"ok": false, "finished": false``) with the seeds it has so
far, so a results.json read mid-way, or left by an interrupted comparison
(Ctrl-C), never shows a run as good that did not train. The results are
:mod:`gradwire.compare.results` dataclasses.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gradwire.compare.config import COMPUTE_ONLY, CompareConfig, ideal_of
from gradwire.compare.ledger import Ledger, rotation
from gradwire.compare.results import FAILED, TIMED_OUT, Curve, Results, SeedResult, TrainingEvent
from gradwire.strategies import parse_strategy

if TYPE_CHECKING:
    from gradwire.train.loop import TrainConfig

__all__ = ["Training", "rotation", "run_compare", "schedule"]

#: what a comparison writes into its folder
OUTPUTS = ("results.json", "table.md", "accuracy.png", "breakdown.png", "bandwidth.png")


@dataclass(frozen=True)
class Training:
    """One seed of one run: what every rank trains, and the run it belongs to."""

    index: int
    """position in the comparison's schedule; names the training's process group"""
    net: str
    """the run's network (compute-only: the first network, which it is the ideal of)"""
    strategy: str
    """the run's name: a composed strategy, or ``compute-only``"""
    config: TrainConfig

    @property
    def run(self) -> tuple[str, str]:
        return self.net, self.strategy


def _training(cfg: CompareConfig, index: int, net: str, strategy: str, seed: int) -> Training:
    from gradwire.train.loop import TrainConfig

    if strategy == COMPUTE_ONLY:
        train_strategy, train_net = parse_strategy("sync"), ideal_of(cfg.nets[0])
    else:
        train_strategy = cfg.strategies[cfg.strategy_names.index(strategy)]
        train_net = cfg.nets[cfg.net_names.index(net)]
    config = TrainConfig(strategy=train_strategy, net=train_net, model=cfg.model, seed=seed, epochs=cfg.epochs,
                         batch_size=cfg.batch_size, lr=cfg.lr)
    return Training(index, net, strategy, config)


def schedule(cfg: CompareConfig) -> list[list[Training]]:
    """The trainings, grouped by the set of processes they run in, in the order they run.

    Interleaved: one group; round ``k`` (seed ``k``) runs every strategy, the
    order rotated by ``k * runs // seeds`` so each strategy's mean position in
    the rounds is near the middle. Otherwise: one group per run, seeds in order.
    """
    runs = cfg.run_names
    if cfg.interleave:
        return [[_training(cfg, i, *job) for i, job in enumerate(rotation(runs, cfg.seeds))]]
    groups, index = [], 0
    for net, strategy in runs:
        groups.append([_training(cfg, index + j, net, strategy, seed) for j, seed in enumerate(cfg.seeds)])
        index += len(cfg.seeds)
    return groups


def _ranks(rank: int, world: int, trainings: list[Training]) -> None:
    """One rank of a set of processes: each training on a new default group, reported as it ends."""
    from gradwire.launch import report
    from gradwire.train.loop import train_in_turns

    started = [time.perf_counter()]

    def ended(i: int, result: Any) -> None:
        summary = _summarise(result)
        summary.seconds = time.perf_counter() - started[0]
        started[0] = time.perf_counter()
        report((trainings[i].index, summary))

    train_in_turns(rank, world, [t.config for t in trainings], on_result=ended)


def _summarise(r: Any) -> SeedResult:
    """What the report needs from one rank's RunResult (small enough to pickle quickly)."""
    total = r.stats.get("total", {})
    elapsed, seconds = 0.0, []
    for sec in r.epoch_seconds:
        elapsed += sec
        seconds.append(elapsed)
    return SeedResult(
        seed=r.config["seed"], train_seconds=sum(r.epoch_seconds), steps=len(r.step_seconds),
        step_seconds=r.step_seconds, step_compute=r.step_compute, exposed_seconds=sum(r.step_exposed),
        exposed_network_seconds=sum(r.step_exposed_network),
        epoch_seconds=r.epoch_seconds, epoch_accuracy=r.epoch_accuracy,
        wire_bytes=total.get("wire_bytes", 0), payload_bytes=total.get("payload_bytes", 0),
        metrics={"test_accuracy": r.test_accuracy},
        curves={"test_accuracy": Curve(seconds, list(r.epoch_accuracy), [])},
        detail={"step_exposed": r.step_exposed, "step_comm_model": r.step_comm_model, "collectives": r.collectives,
                "stats": r.stats, "param_checksum": r.param_checksum, "num_parameters": r.num_parameters,
                "auto": r.auto, "first_step_at": r.first_step_at},
    )


def _agree(ranks: list[SeedResult]) -> bool:
    """Every rank ended the training with the same parameters (to rounding)."""
    ref = ranks[0].detail["param_checksum"]
    return all(abs(r.detail["param_checksum"] - ref) <= 1e-6 * max(1.0, abs(ref)) for r in ranks)


def _run_set(cfg: CompareConfig, trainings: list[Training],
             on_done: Callable[[Training, list[SeedResult]], None]) -> tuple[str, str] | None:
    """Run ``trainings`` in one set of fresh processes; ``on_done`` each as all its ranks report.

    Returns None, or (status, error) of what stopped the set: ``failed`` with
    a rank's traceback, or ``timed out``.
    """
    from gradwire.launch import RankError, spawn
    from gradwire.train.loop import CPU_ONLY

    by_index = {t.index: t for t in trainings}
    parts: dict[int, dict[int, SeedResult]] = {}

    def arrived(rank: int, value: tuple[int, SeedResult]) -> None:
        index, summary = value
        parts.setdefault(index, {})[rank] = summary
        if len(parts[index]) == cfg.workers:
            on_done(by_index[index], [parts[index][r] for r in range(cfg.workers)])

    runs = len({t.run for t in trainings})
    limit = cfg.timeout * runs
    try:
        spawn(_ranks, cfg.workers, (trainings,), timeout=limit, on_report=arrived, env=CPU_ONLY)
    except RankError as exc:
        return FAILED, str(exc)
    except TimeoutError as exc:
        return TIMED_OUT, f"timed out after {limit:.0f} s ({runs} runs x --timeout {cfg.timeout:.0f} s): {exc}"
    return None


def run_compare(cfg: CompareConfig, on_training: Callable[[TrainingEvent], None] | None = None) -> Results:
    """Train every (net, strategy) plus compute-only on every seed; save results.json as trainings end.

    Args:
        cfg: the comparison.
        on_training: called after each training; a failure carries its error
            and how many of that strategy's seeds will not run (``dropped``).

    Returns:
        The :class:`~gradwire.compare.results.Results`: one run per (net,
        strategy), each seed's rank-0 summary in seed order.

    Raises:
        KeyboardInterrupt: after saving results.json with the finished trainings,
            the unfinished runs marked ``"finished": false`` and ``"interrupted": true``.
    """
    ledger = Ledger(Path(cfg.out), OUTPUTS, {**cfg.as_dict(), "mode": "models"}, cfg.run_names, cfg.seeds, on_training)
    with ledger.running():  # SIGTERM and SIGHUP as Ctrl-C: spawn stops its ranks on the way out
        for trainings in schedule(cfg):
            pending = trainings
            while pending:
                finished: set[int] = set()

                def done(t: Training, ranks: list[SeedResult]) -> None:
                    finished.add(t.index)
                    run = ledger.runs[t.run]
                    # compute-only's ranks train apart (nothing is exchanged): they need not agree
                    run.ranks_agree = bool(run.ranks_agree) and (t.strategy == COMPUTE_ONLY or _agree(ranks))
                    ledger.ok(t.net, t.strategy, ranks[0], ranks[0].seconds)

                stopped = _run_set(cfg, pending, done)
                if stopped is None or len(finished) == len(pending):
                    break
                failed = next(t for t in pending if t.index not in finished)
                pending = [t for t in pending if t.index not in finished and t.run != failed.run]
                ledger.not_ok(failed.net, failed.strategy, failed.config.seed, *stopped)
    return ledger.results
