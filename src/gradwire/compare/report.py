"""Turn the runs of a comparison into rows: speed, bytes, accuracy, time to accuracy.

Definitions (per network; the first strategy is the baseline):

- time per epoch: the training loop's epoch time (evaluation excluded),
  averaged over epochs, then over seeds;
- speedup: baseline time per epoch / strategy time per epoch; the ideal
  speedup is baseline / compute-only (the same work with no network cost);
- communication volume: bytes this worker put on the wire per epoch
  (the backend's counters, protocol framing included); reduction: baseline / strategy;
- step breakdown: compute (the compute-only run's step compute), strategy
  overhead (this strategy's time outside communication waits beyond that) and
  exposed communication (the rest of the step time). The overhead is the
  strategy's own CPU work (compression, copies) and, when ranks share cores,
  compute slowed by peers that run instead of waiting: ``delayed`` compresses
  nothing, yet on 4 ranks over 2 cores its ranks never block in a collective,
  so the others' compute lands inside its step windows;
- time to accuracy: training time until the test accuracy first reaches the
  target, averaged over the seeds that reach it.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from gradwire.compare.config import COMPUTE_ONLY

__all__ = ["Row", "rows_of", "to_markdown", "print_table"]


@dataclass
class Row:
    net: str
    strategy: str
    ok: bool
    epoch_seconds: float = float("nan")
    step_ms: float = float("nan")
    speedup: float = float("nan")
    ideal_speedup: float = float("nan")
    wire_mb_per_epoch: float = float("nan")
    reduction: float = float("nan")
    accuracy_mean: float = float("nan")
    accuracy_min: float = float("nan")
    accuracy_max: float = float("nan")
    time_to_target: float | None = None
    reached: int = 0
    seeds: int = 0
    compute_ms: float = float("nan")
    overhead_ms: float = float("nan")
    exposed_ms: float = float("nan")
    exposed_share: float = float("nan")
    error: str = ""
    finished: bool = True
    """False for a run an interrupted comparison did not finish (``ok`` is False then too)"""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else float("nan")


def _per_step(seed: dict, key: str) -> float:
    return _mean(seed[key]) if seed[key] else float("nan")


def _base_row(run: dict, target: float) -> Row:
    if not run["ok"]:
        return Row(run["net"], run["strategy"], False, error=run["error"].strip().splitlines()[-1][:200],
                   finished=run.get("finished", True))
    seeds = run["seeds"]
    epochs = [_mean(s["epoch_seconds"]) for s in seeds]
    accs = [s["test_accuracy"] for s in seeds]
    reach = []
    for s in seeds:
        elapsed = 0.0
        for sec, acc in zip(s["epoch_seconds"], s["epoch_accuracy"]):
            elapsed += sec
            if acc >= target:
                reach.append(elapsed)
                break
    n_epochs = max(1, len(seeds[0]["epoch_seconds"]))
    step = _mean(_per_step(s, "step_seconds") for s in seeds)
    compute = _mean(_per_step(s, "step_compute") for s in seeds)
    return Row(
        run["net"], run["strategy"], True, epoch_seconds=_mean(epochs), step_ms=step * 1e3,
        wire_mb_per_epoch=_mean(s["wire_bytes"] for s in seeds) / n_epochs / 2**20,
        accuracy_mean=_mean(accs), accuracy_min=min(accs), accuracy_max=max(accs),
        time_to_target=_mean(reach) if reach else None, reached=len(reach), seeds=len(seeds),
        compute_ms=compute * 1e3,
    )


def rows_of(results: dict) -> list[Row]:
    """One row per run, with speedups and reductions against each network's baseline."""
    target = results["config"]["target_accuracy"]
    rows = [_base_row(run, target) for run in results["runs"]]
    ideal = next((r for r in rows if r.strategy == COMPUTE_ONLY and r.ok), None)
    strategies = results["config"]["strategies"]
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        base = next((r for r in rows if r.net == net and r.strategy == strategies[0] and r.ok), None)
        for r in rows:
            if not r.ok or (r.net != net and r.strategy != COMPUTE_ONLY):
                continue
            if base is not None:
                r.speedup = base.epoch_seconds / r.epoch_seconds
                r.reduction = base.wire_mb_per_epoch / r.wire_mb_per_epoch if r.wire_mb_per_epoch else float("inf")
                if ideal is not None:
                    r.ideal_speedup = base.epoch_seconds / ideal.epoch_seconds
            base_compute = ideal.compute_ms if ideal is not None else r.compute_ms
            r.overhead_ms = max(0.0, r.compute_ms - base_compute)
            r.exposed_ms = max(0.0, r.step_ms - base_compute - r.overhead_ms)
            r.compute_ms = base_compute
            r.exposed_share = r.exposed_ms / r.step_ms if r.step_ms else float("nan")
    return rows


COLUMNS = [
    ("strategy", "strategy"), ("time/epoch (s)", "epoch"), ("speedup", "speedup"), ("wire MiB/epoch", "wire"),
    ("reduction", "reduction"), ("accuracy (mean [min, max])", "acc"), ("time to target (s)", "ttt"),
    ("exposed comm", "exposed"),
]


def _cells(r: Row) -> list[str]:
    if not r.ok:
        return [r.strategy, "FAILED" if r.finished else "NOT FINISHED", "", "", "", r.error, "", ""]
    ttt = f"{r.time_to_target:.2f} ({r.reached}/{r.seeds})" if r.time_to_target is not None else f"not reached (0/{r.seeds})"
    return [
        r.strategy, f"{r.epoch_seconds:.3f}", f"{r.speedup:.2f}x", f"{r.wire_mb_per_epoch:.2f}",
        f"{r.reduction:.1f}x", f"{r.accuracy_mean:.4f} [{r.accuracy_min:.3f}, {r.accuracy_max:.3f}]", ttt,
        f"{r.exposed_share:.0%}",
    ]


def to_markdown(rows: list[Row], target: float) -> str:
    """Markdown tables, one per network."""
    out = []
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        out.append(f"network `{net}` (time to accuracy {target:.2f})\n")
        out.append("| " + " | ".join(c for c, _ in COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        for r in rows:
            if r.net == net or r.strategy == COMPUTE_ONLY:
                out.append("| " + " | ".join(_cells(r)) + " |")
        out.append("")
    return "\n".join(out)


def print_table(rows: list[Row], target: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        table = Table(title=f"network {net} — time to accuracy {target:.2f}")
        for c, _ in COLUMNS:
            table.add_column(c, justify="left" if c == "strategy" else "right")
        for r in rows:
            if r.net == net or r.strategy == COMPUTE_ONLY:
                table.add_row(*_cells(r))
        console.print(table)
