"""The lifecycle of one comparison, shared by the bundled models and a user's script.

Both kinds (:mod:`gradwire.compare.runner`, :mod:`gradwire.compare.script`)
train every (network, strategy) run once per seed and keep books the same
way; a :class:`Ledger` is those books:

1. It opens the output folder: an earlier comparison's files (and its
   ``runs/`` folder) move to ``previous-<time>/``, never overwritten; every
   run starts ``not finished`` and ``results.json`` is written at once.
2. :func:`rotation` gives the order: round ``k`` trains every run on seed
   ``k``, rotated by ``k * runs // seeds``, so a machine that drifts over
   minutes shifts every run alike.
3. Each training that ends is booked (:meth:`Ledger.ok`,
   :meth:`Ledger.not_ok`), ``results.json`` rewritten and ``on_training``
   told, so nothing finished is lost. A run that is not ok keeps its status
   and error and drops its remaining seeds (:meth:`Ledger.pending` says
   no); the other runs go on.
4. :meth:`Ledger.running` is the block the trainings run in: SIGTERM and
   SIGHUP stop it as Ctrl-C does (:class:`~gradwire.compare.processes.ComparisonStopped`);
   on the way out every unfinished run says after how many seeds it was
   interrupted, ``"interrupted": true`` is saved, and the interrupt goes on
   to the caller. :meth:`Ledger.stop` ends a comparison early for a reason
   of its own, saved as ``"stopped"``.
"""
from __future__ import annotations

import contextlib
import datetime
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from gradwire._files import keep_previous
from gradwire.compare.processes import signals_stop
from gradwire.compare.results import NOT_FINISHED, OK, Results, Run, SeedResult, TrainingEvent

__all__ = ["Ledger", "rotation"]


def rotation(runs: list[tuple[str, str]], seeds: tuple[int, ...]) -> list[tuple[str, str, int]]:
    """(net, strategy, seed) in turns: round ``k`` (seed ``k``) runs every run, the order rotated by ``k * runs // seeds``."""
    order: list[tuple[str, str, int]] = []
    for k, seed in enumerate(seeds):
        shift = k * len(runs) // len(seeds)
        order += [(net, strategy, seed) for net, strategy in runs[shift:] + runs[:shift]]
    return order


class Ledger:
    """The books of one comparison (module doc): its runs, its results.json, and what each training ended as.

    Args:
        out: the output folder (created if missing).
        outputs: the files an earlier comparison left there that move to ``previous-<time>/``.
        config: the comparison's configuration in plain types (results.json's ``config``).
        runs: (net, strategy) of every run, in table order.
        seeds: every run's seeds.
        on_training: told of each training as it is booked.
        ranks_agree: what a run's ``ranks_agree`` starts as (None where it is not checked).
    """

    def __init__(self, out: Path, outputs: tuple[str, ...], config: dict[str, Any], runs: list[tuple[str, str]],
                 seeds: tuple[int, ...], on_training: Callable[[TrainingEvent], None] | None = None,
                 ranks_agree: bool | None = True) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        kept = keep_previous(self.out, outputs)
        if kept is not None and (self.out / "runs").is_dir():
            shutil.move(str(self.out / "runs"), str(kept / "runs"))
        self.path = self.out / "results.json"
        self.seeds = seeds
        self.runs = {(net, s): Run(s, net, NOT_FINISHED, "not run yet", ranks_agree=ranks_agree) for net, s in runs}
        self.results = Results(config, datetime.datetime.now().isoformat(timespec="seconds"), list(self.runs.values()))
        self.on_training = on_training
        self.results.save(self.path)

    def order(self) -> list[tuple[str, str, int]]:
        """Every training, (net, strategy, seed), in the order they run (:func:`rotation`)."""
        return rotation(list(self.runs), self.seeds)

    def pending(self, net: str, strategy: str) -> bool:
        """Whether the run still trains: not refused, failed, ... on an earlier seed, nor stopped."""
        return not self.runs[(net, strategy)].finished and not self.results.stopped

    def save(self) -> None:
        self.results.save(self.path)

    def ok(self, net: str, strategy: str, result: SeedResult, seconds: float, note: str = "") -> None:
        """Book a seed that trained: the run is ``ok`` once every seed has."""
        run = self.runs[(net, strategy)]
        run.seeds.append(result)
        run.seconds += seconds
        if len(run.seeds) == len(self.seeds):
            run.status, run.error = OK, ""
        else:
            run.error = f"not finished: {len(run.seeds)} of {len(self.seeds)} seeds so far"
        self._tell(TrainingEvent(strategy, net, result.seed, OK, seconds, note=note))

    def not_ok(self, net: str, strategy: str, seed: int, status: str, error: str, seconds: float = 0.0,
               note: str = "") -> None:
        """Book a training that ended as ``status`` (failed, timed out, refused, ...): its run's other seeds drop."""
        run = self.runs[(net, strategy)]
        dropped = len(self.seeds) - len(run.seeds) - 1
        run.status, run.error = status, error
        self._tell(TrainingEvent(strategy, net, seed, status, seconds, error, dropped, note))

    def stop(self, reason: str, after: str) -> None:
        """End the comparison after the training ``after`` for ``reason``: the runs not finished say so."""
        self.results.stopped = reason
        for run in self.runs.values():
            if not run.finished:
                run.error = f"not run: the comparison stopped after {after} (see \"stopped\")"
        self.save()

    def _tell(self, event: TrainingEvent) -> None:
        self.save()
        if self.on_training is not None:
            self.on_training(event)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The block the trainings run in (module doc, item 4)."""
        with signals_stop():
            try:
                yield
            except KeyboardInterrupt:
                for run in self.runs.values():
                    if not run.finished:
                        run.error = f"interrupted after {len(run.seeds)} of {len(self.seeds)} seeds"
                self.results.interrupted = True
                self.save()
                raise
