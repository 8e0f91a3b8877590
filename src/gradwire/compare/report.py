"""Turn the runs of a comparison into rows: speed, bytes, the metric, time to accuracy.

Definitions (per network; the first strategy is the baseline). The time unit
is the epoch for the bundled models and the step for a script (whose epochs
gradwire does not know):

- time per epoch: the training loop's epoch time (evaluation excluded),
  averaged over epochs, then over seeds; time per step: the mean interval
  between the ends of the optimizer's steps (the first from the DDP's first
  forward), averaged over seeds;
- speedup: baseline time / strategy time (per epoch, or per step); the ideal
  speedup is baseline / compute-only (the same work with no network cost);
- communication volume: bytes this worker put on the wire per epoch (per
  step) during training (the backend's counters, protocol framing included);
  reduction: baseline / strategy;
- step breakdown: compute (the compute-only run's step compute), strategy
  overhead (this strategy's time outside communication waits beyond that),
  exposed communication (the training thread waiting while the modelled
  network still carried what it waits for) and other waits (waiting past
  that: a peer that reached the collective late because it was computing on
  a shared core, the real collective on this machine taking longer than the
  model, which on ``loopback`` is all of it, or work in completion
  callbacks). The four add up to the step. The overhead is the strategy's own CPU work (compression, copies)
  and, when ranks share cores, compute slowed by peers that run instead of
  waiting;
- share of ideal: compute-only time / strategy time, how much of the speed
  with a free network the strategy reaches;
- the verdict under each table: the regime (communication-bound when the
  baseline waits on the network for at least half its step, compute-bound
  at 15% or less) and the strategies that are slower than the baseline
  there, said as such;
- the metric: the bundled models' test accuracy; for a script, the last
  value of a metric it reported with ``gradwire.report`` (the comparison's
  ``metric``, else the first one reported), else ``train_loss``: the mean of
  the losses gradwire saw (the scalars ``.backward()`` was called on) over
  the last tenth of the steps (at least 1, at most 50) of the first rank.
  Mean and [min, max] over seeds;
- time to accuracy (bundled models): training time until the test accuracy
  first reaches the target, averaged over the seeds that reach it.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from typing import Iterable

from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.results import OK, TIMED_OUT, Results, Row, Run

__all__ = ["COMM_BOUND", "COMPUTE_BOUND", "Row", "metric_name", "print_table", "rows_of", "reason", "to_markdown", "verdict", "why"]

#: the metric gradwire computes itself for a script that reports none
TRAIN_LOSS = "train_loss"


def _mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(xs) if xs else float("nan")


def metric_name(results: Results) -> str:
    """The metric the table shows (module doc)."""
    if results.config.get("metric"):
        return str(results.config["metric"])
    if results.config.get("mode", "models") == "models":
        return "test_accuracy"
    for run in results.runs:
        for seed in run.seeds:
            for name in seed.metrics:
                if name != TRAIN_LOSS:
                    return name
    return TRAIN_LOSS


def reason(status: str, error: str) -> str:
    """The line a table or a progress line gives a run that is not ok: a time limit's own line, else :func:`why`."""
    if status == TIMED_OUT:
        return error.splitlines()[0] if error else "timed out"
    return why(error)


def _error_line(run: Run) -> str:
    return reason(run.status, run.error)


def why(error: str) -> str:
    """The line of an error text that says what went wrong.

    A C++ abort's ``what():`` line first; else the last ``...Error:`` or
    ``...Exception:`` line that is not the launcher's own summary (torchrun
    ends with ``ChildFailedError`` and a ruler of ``=``); else the last line
    with a word in it.
    """
    lines = [line.strip() for line in error.splitlines() if re.search(r"\w", line)]
    what = next((line for line in lines if "what():" in line), None)
    if what is not None:
        return what[:200]
    errors = [line for line in lines if re.search(r"\w(Error|Exception)\b:?", line) and "ChildFailedError" not in line]
    return ((errors or lines or [""])[-1])[:200]


def _base_row(run: Run, unit: str, metric: str, target: float | None) -> Row:
    if not run.ok:
        return Row(run.net, run.strategy, run.status, unit, metric=metric, error=_error_line(run), applied=run.applied)
    seeds = run.seeds
    values = [s.metrics[metric] for s in seeds if metric in s.metrics]
    reach = []
    if target is not None:
        for s in seeds:
            curve = s.curves.get(metric)
            if curve is not None:
                hit = next((t for t, v in zip(curve.seconds, curve.values) if v >= target), None)
                if hit is not None:
                    reach.append(hit)
    row = Row(run.net, run.strategy, run.status, unit, step_ms=_mean(s.step_ms for s in seeds), metric=metric,
              metric_mean=_mean(values), metric_min=min(values, default=float("nan")),
              metric_max=max(values, default=float("nan")),
              time_to_target=_mean(reach) if reach else None, reached=len(reach), seeds=len(seeds),
              compute_ms=_mean(s.compute_ms for s in seeds), exposed_ms=_mean(s.network_ms for s in seeds),
              peer_wait_ms=_mean(s.peer_wait_ms for s in seeds), applied=run.applied,
              wire_mb_per_step=_mean(s.wire_bytes_per_step for s in seeds) / 2**20)
    if unit == "epoch":
        row.epoch_seconds = _mean(_mean(s.epoch_seconds) for s in seeds)
        n_epochs = max(1, len(seeds[0].epoch_seconds))
        row.wire_mb_per_epoch = _mean(s.wire_bytes for s in seeds) / n_epochs / 2**20
    return row


def rows_of(results: Results) -> list[Row]:
    """One row per run, with speedups and reductions against each network's baseline."""
    cfg = results.config
    unit = "epoch" if cfg.get("mode", "models") == "models" else "step"
    metric = metric_name(results)
    target = cfg.get("target_accuracy") if unit == "epoch" else None
    measured = [_base_row(run, unit, metric, target) for run in results.runs]
    ideal = next((r for r in measured if r.strategy == COMPUTE_ONLY and r.ok), None)
    strategies = cfg["strategies"]
    # one compute-only row per network, each measured against that network's baseline
    rows: list[Row] = []
    for net in dict.fromkeys(r.net for r in measured if r.strategy != COMPUTE_ONLY):
        rows += [replace(r, net=net) for r in measured if r.strategy == COMPUTE_ONLY]
        rows += [r for r in measured if r.net == net and r.strategy != COMPUTE_ONLY]
    for net in dict.fromkeys(r.net for r in rows):
        base = next((r for r in rows if r.net == net and r.strategy == strategies[0] and r.ok), None)
        for r in rows:
            if not r.ok or r.net != net:
                continue
            if base is not None:
                r.speedup = base.time_per_unit / r.time_per_unit
                r.reduction = base.wire_per_unit / r.wire_per_unit if r.wire_per_unit else float("inf")
                if ideal is not None:
                    r.ideal_speedup = base.time_per_unit / ideal.time_per_unit
                if ideal is not None:
                    r.of_ideal = ideal.time_per_unit / r.time_per_unit
            base_compute = ideal.compute_ms if ideal is not None else r.compute_ms
            r.overhead_ms = max(0.0, r.compute_ms - base_compute)
            if math.isnan(r.peer_wait_ms):  # no split recorded: all waiting counts as the network's
                r.exposed_ms, r.peer_wait_ms = max(0.0, r.step_ms - base_compute - r.overhead_ms), 0.0
            r.compute_ms = base_compute
            r.exposed_share = r.exposed_ms / r.step_ms if r.step_ms else float("nan")
            r.peer_wait_share = r.peer_wait_ms / r.step_ms if r.step_ms else float("nan")
    return rows


def _columns(rows: list[Row]) -> list[str]:
    unit = rows[0].unit if rows else "epoch"
    metric = next((r.metric for r in rows), "test_accuracy")
    name = "accuracy" if metric == "test_accuracy" else metric
    if unit == "epoch":
        return ["strategy", "time/epoch (s)", "speedup", "of ideal", "wire MiB/epoch", "reduction",
                f"{name} (mean [min, max])", "time to target (s)", "exposed comm", "other waits"]
    return ["strategy", "time/step (ms)", "speedup", "of ideal", "wire KiB/step", "reduction",
            f"{name} (mean [min, max])", "exposed comm", "other waits", "optimizer / note"]


def _cells(r: Row) -> list[str]:
    if not r.ok:
        status = {"failed": "FAILED", "not finished": "NOT FINISHED"}.get(r.status, r.status.upper())
        if r.unit == "step":  # the reason goes in the wide last column
            return [r.strategy, status, "", "", "", "", "", "", "", r.error]
        return [r.strategy, status, "", "", "", "", r.error, "", "", ""]
    metric = f"{r.metric_mean:.4f} [{r.metric_min:.3f}, {r.metric_max:.3f}]" if not math.isnan(r.metric_mean) else "—"
    if r.unit == "epoch":
        ttt = (f"{r.time_to_target:.2f} ({r.reached}/{r.seeds})" if r.time_to_target is not None
               else f"not reached (0/{r.seeds})")
        return [r.strategy, f"{r.epoch_seconds:.3f}", f"{r.speedup:.2f}x", _share(r.of_ideal),
                f"{r.wire_mb_per_epoch:.2f}", f"{r.reduction:.1f}x", metric, ttt, _share(r.exposed_share),
                _share(r.peer_wait_share)]
    return [r.strategy, f"{r.step_ms:.1f}", f"{r.speedup:.2f}x", _share(r.of_ideal), f"{r.wire_mb_per_step * 1024:.1f}",
            f"{r.reduction:.1f}x", metric, _share(r.exposed_share), _share(r.peer_wait_share), r.applied]


def _share(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.0%}"


#: the baseline's network share of the step at or above which a network is communication-bound
COMM_BOUND = 0.5
#: at or below which it is compute-bound
COMPUTE_BOUND = 0.15
#: a speedup below this is "slower"; between it and 1, a tie at the noise of repeated runs
TIE = 0.97


def verdict(rows: list[Row], net: str) -> str:
    """One or two sentences under a network's table: the regime, and the strategies that do not pay there."""
    mine = [r for r in rows if r.net == net and r.strategy != COMPUTE_ONLY and r.ok]
    if not mine:
        return ""
    base = mine[0]
    share = base.exposed_share
    if math.isnan(share):
        return ""
    regime = ("communication-bound" if share >= COMM_BOUND else "compute-bound" if share <= COMPUTE_BOUND
              else "between the two regimes")
    out = f"{base.strategy} waits on the network for {share:.0%} of its step: {regime}."
    slower = [r for r in mine[1:] if r.speedup < TIE]
    best = max(mine[1:], key=lambda r: r.speedup, default=None)
    if slower:
        out += (" Slower than " + base.strategy + " here (their CPU work costs more than the network time they "
                "save): " + ", ".join(f"{r.strategy} {r.speedup:.2f}x" for r in slower) + ".")
    if best is not None and best.speedup >= 1.0:
        out += f" Fastest: {best.strategy} {best.speedup:.2f}x"
        out += f" ({best.of_ideal:.0%} of ideal)." if not math.isnan(best.of_ideal) else "."
    return out


def _title(net: str, rows: list[Row], target: float | None) -> str:
    if rows and rows[0].unit == "step":
        metric = rows[0].metric
        how = ("the loss gradwire saw (scalars .backward() was called on), last tenth of the steps"
               if metric == TRAIN_LOSS else f"the script's last gradwire.report({metric}=...)")
        return f"network {net} — metric: {how}"
    return f"network {net} — time to accuracy {target:.2f}" if target is not None else f"network {net}"


def to_markdown(rows: list[Row], target: float | None) -> str:
    """Markdown tables, one per network."""
    out = []
    columns = _columns(rows)
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        title = _title(f"`{net}`", rows, target)
        out.append(title.replace(" — ", " (", 1) + ")\n" if " — " in title else title + "\n")
        out.append("| " + " | ".join(columns) + " |")
        out.append("|" + "---|" * len(columns))
        for r in rows:
            if r.net == net:
                out.append("| " + " | ".join(_cells(r)) + " |")
        out.append("")
        said = verdict(rows, net)
        if said:
            out += [said, ""]
    return "\n".join(out)


def print_table(rows: list[Row], target: float | None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    columns = _columns(rows)
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        table = Table(title=escape(_title(net, rows, target)))
        for c in columns:
            table.add_column(escape(c), justify="left" if c in ("strategy", "optimizer / note") else "right")
        for r in rows:
            if r.net == net:
                table.add_row(*(escape(c) for c in _cells(r)))
        console.print(table)
        said = verdict(rows, net)
        if said:
            console.print(escape(said))

