"""Turn the runs of a comparison into rows: speed, bytes, the metric, time to accuracy.

Definitions (per network; the first strategy is the baseline). The time unit
is the epoch for the bundled models and the step for a script (whose epochs
gradwire does not know):

- time per epoch: the training loop's epoch time (evaluation excluded),
  averaged over epochs, then over seeds; time per step: the mean interval
  between the ends of the optimizer's steps (the first from the DDP's first
  forward), averaged over seeds;
- speedup: baseline time / strategy time (per epoch, or per step); the ideal
  speedup is baseline / compute-only (the same work with no communication
  at all: every collective answered on the rank, ``IDEAL_NET``), a bound;
- communication volume: bytes this worker put on the wire per epoch (per
  step) during training (the backend's counters, protocol framing included);
  reduction: baseline / strategy;
- step breakdown: compute (the compute-only run's step compute), strategy
  overhead (this strategy's time outside communication waits beyond that),
  exposed communication (the training thread waiting while the modelled
  network still carried what it waits for) and other waits (waiting past
  that: a peer that reached the collective late because it was computing on
  a shared core, the real collective on this machine taking longer than the
  model, or work in completion callbacks). The four add up to the step. The overhead is the strategy's own CPU work (compression, copies)
  and, when ranks share cores, compute slowed by peers that run instead of
  waiting;
- share of ideal: compute-only time / strategy time, how much of the speed
  with a free network the strategy reaches;
- predicted (bundled models): the step model's speedup for the same
  training on the same network (:mod:`gradwire.compare.crossover`), and in
  brackets how far it is from the measured speedup (predicted / measured - 1);
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
- time to target: training time until the metric first reaches the target
  (bundled models: the test accuracy, ``--target``; a script: the table's
  metric, with ``--target``, reached from above for a lower-is-better
  one), averaged over the seeds that reach it;
- sound: a strategy's row is ``ok`` only if its final metric is not clearly
  worse than the baseline's on that network. The metric's name says which
  way is better and on which scale it is judged (:func:`direction`,
  :func:`scale`): a loss (``loss``, ``perplexity``, ``mse``, ...: lower is
  better) relative to the baseline's mean; a share (``acc``, ``f1``,
  ``auc``, ... higher is better; ``error``, ``wer``, ... lower) in absolute
  points, a point being 0.01 of a metric in [0, 1] and 1 of one in percent
  (a baseline above 1). A metric of neither kind is not judged.
  *Clearly worse*: the strategy's mean over its seeds lies past the
  baseline's worst seed by more than a margin. The margin is the
  tolerance (:class:`~gradwire.compare.config.Tolerance`, ``--tolerance``,
  by default ``loss=2%,accuracy=1pt``: a loss up to 2% above the
  baseline's mean, an accuracy up to 1 point below), or, with at least
  :data:`SPREAD_SEEDS` baseline seeds, their spread (max - min) where it is
  wider: the run-to-run noise they show is not called unsound. With fewer
  seeds there is no spread to judge by, and the row says its soundness
  rests on the tolerance alone (``sound_by``, and a line under the table).
  With one seed of sync at a loss of 0.914, 0.932 is the bound: 0.977
  (6.8% worse) is unsound, and so is a loss 2.5% worse; an accuracy 0.5
  points below sync's is not.
  Such a row keeps its figures, is marked ``unsound`` (its ``error`` says
  by how much), and is never named fastest: the verdict names the fastest
  sound strategy, and a faster unsound one as unsound. With a target (time
  to accuracy), the fastest is the one that reached it soonest on every
  seed.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from typing import Any, Iterable

from gradwire.compare.config import COMPUTE_ONLY, DEFAULT_TOLERANCE, IDEAL_NOTE, Tolerance
from gradwire.compare.results import TIMED_OUT, UNSOUND, Results, Row, Run, SeedResult, network_of

__all__ = ["COMM_BOUND", "COMPUTE_BOUND", "SPREAD_SEEDS", "Row", "direction", "judge", "metric_name",
           "prediction_line", "print_table", "relative_target", "rows_of", "reason", "scale", "sound_bound",
           "soundness_line", "to_markdown", "unsound_reason", "verdict", "why"]

#: the metric gradwire computes itself for a script that reports none
TRAIN_LOSS = "train_loss"


#: baseline seeds from which their spread (max - min) counts as the run-to-run noise; fewer say too little of it
SPREAD_SEEDS = 3

#: words of a metric's name that say which way is better (the name split at ``_``, ``/``, ``-``, ``.``) and its
#: scale: a loss is judged relative to the baseline's, a share (higher or lower is better) in points
_HIGHER = frozenset({"acc", "accuracy", "f1", "auc", "auroc", "precision", "recall", "bleu", "rouge", "iou", "map",
                     "top1", "top5", "r2", "correct", "dice", "mcc"})
_LOWER_SHARE = frozenset({"error", "err", "wer", "cer"})
_LOSS = frozenset({"loss", "perplexity", "ppl", "mse", "mae", "rmse", "nll", "bpb", "bpc"})


def _words(metric: str) -> set[str]:
    words = {w for w in re.split(r"[^a-z0-9]+", re.sub(r"(?<=[a-z])(?=[A-Z])", "_", metric).lower()) if w}
    return words | {w.rstrip("0123456789") for w in words}  # acc5, loss2


def direction(metric: str) -> int | None:
    """+1 when higher is better (an accuracy), -1 when lower is (a loss), None when the name does not say."""
    words = _words(metric)
    if words & (_LOSS | _LOWER_SHARE):
        return -1
    if words & _HIGHER:
        return 1
    return None


def scale(metric: str) -> str | None:
    """The tolerance ``metric`` is judged by: ``loss`` (relative), ``accuracy`` (points), None when not judged."""
    words = _words(metric)
    if words & _LOSS:
        return "loss"
    return "accuracy" if words & (_HIGHER | _LOWER_SHARE) else None


def _finite(xs: Iterable[float]) -> list[float]:
    return [x for x in xs if not math.isnan(x)]


def sound_bound(metric: str, baseline: list[float], tolerance: Tolerance = DEFAULT_TOLERANCE
                ) -> tuple[float, str, float] | None:
    """(bound, what it rests on, margin) for a final ``metric`` against the baseline's seeds (module doc).

    The bound is the baseline's worst seed moved by the margin in the worse
    direction; a strategy whose mean is past it is unsound. What it rests on:
    ``tolerance alone`` (fewer than :data:`SPREAD_SEEDS` baseline seeds), else
    ``tolerance`` or ``spread``, whichever is wider. None when not judged
    (a metric of neither kind, or no baseline value).
    """
    sign, kind, baseline = direction(metric), scale(metric), _finite(baseline)
    if sign is None or kind is None or not baseline:
        return None
    lo, hi = min(baseline), max(baseline)
    if kind == "loss":
        margin = tolerance.loss * abs(statistics.fmean(baseline))
    else:  # a point: a hundredth of [0, 1], or 1 of a percentage
        margin = tolerance.accuracy * (0.01 if max(abs(v) for v in baseline) <= 1 else 1.0)
    by = "tolerance alone" if len(baseline) < SPREAD_SEEDS else "spread" if hi - lo > margin else "tolerance"
    margin = hi - lo if by == "spread" else margin
    return (lo - margin if sign > 0 else hi + margin), by, margin


def unsound_reason(metric: str, values: list[float], baseline: list[float], baseline_name: str,
                   tolerance: Tolerance = DEFAULT_TOLERANCE) -> str:
    """Why a strategy's final metric is clearly worse than the baseline's (module doc), or '' when it is not.

    Args:
        metric: its name, which gives its direction and scale (:func:`direction`, :func:`scale`).
        values: the strategy's final value, one per seed.
        baseline: the baseline's, one per seed.
        baseline_name: the baseline strategy, for the sentence.
        tolerance: the margin where the baseline's seeds do not show a wider spread.
    """
    judged, values = sound_bound(metric, baseline, tolerance), _finite(values)
    if judged is None or not values:
        return ""
    bound, by, margin = judged
    mean, higher = statistics.fmean(values), direction(metric) == 1
    if not (mean < bound if higher else mean > bound):
        return ""
    baseline = _finite(baseline)
    lo, hi, n = min(baseline), max(baseline), len(baseline)
    spread = f"{lo:.4g}" if lo == hi else f"[{lo:.4g}, {hi:.4g}]"
    kind = scale(metric) or "loss"
    allowed = tolerance.spelled(kind) + (" of its mean" if kind == "loss" else "")
    seeds = f"{n} seed{'s' * (n > 1)}"
    margin_is = {"tolerance alone": f"{allowed}, the tolerance alone as {baseline_name} ran {seeds}",
                 "tolerance": f"{allowed}, wider than its {seeds}' spread {hi - lo:.3g}",
                 "spread": f"its {seeds}' spread {margin:.3g}, wider than {allowed}"}[by]
    return (f"{metric} {mean:.4g} is clearly worse than {baseline_name}'s {spread} ({'higher' if higher else 'lower'} "
            f"is better; unsound {'below' if higher else 'above'} {bound:.4g}: {baseline_name}'s worst seed "
            f"{'less' if higher else 'plus'} {margin_is})")


def judge(rows: list[Row], values: dict[tuple[str, str], list[float]], baseline: str,
          tolerance: Tolerance = DEFAULT_TOLERANCE) -> None:
    """Mark ``unsound`` each ok row whose final metric is clearly worse than ``baseline``'s on its network.

    ``values``: (net, strategy) -> the final metric of each seed. Every judged
    row gets its ``sound_bound`` and ``sound_by`` (what the bound rests on).
    compute-only is not judged: nothing is exchanged, so its ranks train
    apart and its metric is rank 0's alone (a bound on time, not a training
    to compare).
    """
    for r in rows:
        base = values.get((r.net, baseline))
        if not r.ok or r.strategy in (baseline, COMPUTE_ONLY) or base is None:
            continue
        judged = sound_bound(r.metric, base, tolerance)
        if judged is None:
            continue
        r.sound_bound, r.sound_by, _ = judged
        said = unsound_reason(r.metric, values.get((r.net, r.strategy), []), base, baseline, tolerance)
        if said:
            r.status, r.error = UNSOUND, said


def soundness_line(rows: list[Row], net: str) -> str:
    """The line under a network's table when its rows' soundness rests on the tolerance alone ('' otherwise)."""
    mine = [r for r in rows if r.net == net]
    alone = next((r for r in mine if r.sound_by == "tolerance alone"), None)
    if alone is None:
        return ""
    base = next(r for r in mine if r.strategy == rows_baseline(mine))
    worse = "below" if direction(alone.metric) == 1 else "above"
    return (f"Soundness rests on the tolerance alone here: {base.strategy} ran {base.seeds} seed"
            f"{'s' * (base.seeds > 1)} ({SPREAD_SEEDS} or more add their spread); a {alone.metric} {worse} "
            f"{alone.sound_bound:.4g} is unsound.")


def _mean(xs: Iterable[float]) -> float:
    xs = _finite(xs)
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


def _reach(seed: SeedResult, metric: str, target: float) -> tuple[float, float] | None:
    """(seconds, bytes) at the first point of the seed's ``metric`` curve at or past ``target``, or None.

    A loss reaches its target from above. The bytes are those of the steps up
    to that point's step (NaN when the curve or the seed has no steps).
    """
    curve = seed.curves.get(metric)
    if curve is None:
        return None
    lower = direction(metric) == -1
    for i, (t, v) in enumerate(zip(curve.seconds, curve.values)):
        if v <= target if lower else v >= target:
            step = curve.steps[i] if i < len(curve.steps) else None
            return t, (seed.bytes_until(step) if step is not None else float("nan"))
    return None


def _set_target(row: Row, seeds: list[SeedResult], target: float | None) -> None:
    """The row's time (and bytes) to ``target``: the mean over the seeds that reach it."""
    row.target = target
    if target is None:
        return
    reach = [hit for hit in (_reach(s, row.metric, target) for s in seeds) if hit is not None]
    row.time_to_target = _mean(t for t, _ in reach) if reach else None
    row.bytes_to_target = _mean(b for _, b in reach)
    row.reached = len(reach)


def relative_target(metric: str, baseline_mean: float, within: float) -> float | None:
    """The baseline's final ``metric`` widened by ``within`` (a share) in the worse direction; None if undirected.

    ``--target-within 0.02`` on a loss of 0.50: 0.51; on an accuracy of 0.90: 0.882.
    """
    sign = direction(metric)
    if sign is None or math.isnan(baseline_mean):
        return None
    return baseline_mean * (1 - within) if sign > 0 else baseline_mean * (1 + within)


def _auto_of(seed: SeedResult) -> list[dict[str, Any]]:
    """``auto``'s summaries of one seed: a model run keeps them, a script's rank 0 injection reports them."""
    if seed.detail.get("auto"):
        return list(seed.detail["auto"])
    ranks = seed.detail.get("injection") or [{}]
    return list(ranks[0].get("auto") or [])


def _base_row(run: Run, unit: str, metric: str, target: float | None) -> Row:
    if not run.ok:
        return Row(run.net, run.strategy, run.status, unit, metric=metric, error=_error_line(run), applied=run.applied)
    seeds = run.seeds
    values = [s.metrics[metric] for s in seeds if metric in s.metrics]
    row = Row(run.net, run.strategy, run.status, unit, step_ms=_mean(s.step_ms for s in seeds), metric=metric,
              metric_mean=_mean(values), metric_min=min(values, default=float("nan")),
              metric_max=max(values, default=float("nan")), seeds=len(seeds),
              compute_ms=_mean(s.compute_ms for s in seeds), exposed_ms=_mean(s.network_ms for s in seeds),
              peer_wait_ms=_mean(s.peer_wait_ms for s in seeds), applied=run.applied,
              wire_mb_per_step=_mean(s.wire_bytes_per_step for s in seeds) / 2**20,
              peak_kib_per_step=max((s.peak_step_bytes for s in seeds), default=float("nan")) / 1024)
    row.auto = [a for s in seeds for a in _auto_of(s)]
    _set_target(row, seeds, target)
    steps = sorted(x for s in seeds for x in s.step_seconds)
    if steps:
        row.step_p50_ms, row.step_p95_ms, row.step_max_ms = (1e3 * _quantile(steps, q) for q in (0.5, 0.95, 1.0))
    if unit == "epoch":
        row.epoch_seconds = _mean(_mean(s.epoch_seconds) for s in seeds)
        n_epochs = max(1, len(seeds[0].epoch_seconds))
        row.wire_mb_per_epoch = _mean(s.wire_bytes for s in seeds) / n_epochs / 2**20
    return row


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of ``ordered`` (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _changing(rows: list[Row]) -> bool:
    """Whether a network of the table changes over time (then the steps' spread is a column)."""
    return any((spec := network_of(net)) is not None and bool(spec.events) for net in {r.net for r in rows} if net)


def rows_of(results: Results, tolerance: Tolerance | None = None) -> list[Row]:
    """One row per run, with speedups and reductions against each network's baseline, judged sound or not.

    ``tolerance``: how much worse than the baseline a final metric may be
    (module doc); None: the one ``results`` records, else the default.
    """
    cfg = results.config
    unit = "epoch" if cfg.get("mode", "models") == "models" else "step"
    metric = metric_name(results)
    target = cfg.get("target_accuracy") if unit == "epoch" else cfg.get("target")
    within = cfg.get("target_within") if unit == "step" else None
    measured = [_base_row(run, unit, metric, target) for run in results.runs]
    ideal = next((r for r in measured if r.strategy == COMPUTE_ONLY and r.ok), None)
    strategies = cfg["strategies"]
    runs = {(run.net, run.strategy): run for run in results.runs if run.ok}
    ideal_run = next((run for run in results.runs if run.ok and run.strategy == COMPUTE_ONLY), None)
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
        if within is not None and base is not None:  # the target is this network's baseline's final, widened
            net_target = relative_target(metric, base.metric_mean, within)
            for r in rows:
                run = ideal_run if r.strategy == COMPUTE_ONLY else runs.get((r.net, r.strategy))
                if r.ok and r.net == net and run is not None:
                    _set_target(r, run.seeds, net_target)
        if base is not None:
            _against_baseline(base, [r for r in rows if r.ok and r.net == net])
    finals = {(run.net, run.strategy): [s.metrics.get(metric, float("nan")) for s in run.seeds]
              for run in results.runs if run.ok}
    if tolerance is None:
        tolerance = Tolerance.parse(results.tolerance) if results.tolerance else DEFAULT_TOLERANCE
    judge(rows, finals, strategies[0], tolerance)
    return rows


def _predicts(rows: list[Row]) -> bool:
    """Whether the rows carry the step model's speedups (then they are a column beside the measured ones)."""
    return any(not math.isnan(r.predicted_speedup) for r in rows)


def _against_baseline(base: Row, rows: list[Row]) -> None:
    """Each row's final metric, time and bytes to target relative to ``base``'s (the same network's baseline)."""
    for r in rows:
        if base.metric_mean:
            r.vs_baseline = r.metric_mean / base.metric_mean - 1
        if _reached(base) and _reached(r) and r.time_to_target:
            r.sooner = (base.time_to_target or math.nan) / r.time_to_target
            if r.bytes_to_target > 0:
                r.fewer_bytes_to_target = base.bytes_to_target / r.bytes_to_target


def _with_target(rows: list[Row], target: float | None) -> bool:
    """Whether the table has a time to target: one given, or one a row carries (``--target-within``)."""
    return target is not None or any(r.target is not None for r in rows)


def _net_target(rows: list[Row], net: str, target: float | None) -> float | None:
    return next((r.target for r in rows if r.net == net and r.target is not None), target)


def _columns(rows: list[Row], target: float | None = None) -> list[str]:
    """The table's columns: per epoch (bundled models) or per step (a script; time to target when one is set)."""
    unit = rows[0].unit if rows else "epoch"
    metric = next((r.metric for r in rows), "test_accuracy")
    name = "accuracy" if metric == "test_accuracy" else metric
    spread = ["step p50 / p95 / max (ms)"] if _changing(rows) else []
    if unit == "epoch":
        predicted = ["predicted (vs measured)"] if _predicts(rows) else []
        return ["strategy", "time/epoch (s)", *spread, "speedup", *predicted, "of ideal", "wire MiB/epoch",
                "reduction", f"{name} (mean [min, max])", "time to target (s)", "exposed comm", "other waits"]
    peak = ["peak KiB/step"] if _peaks(rows) else []
    aimed = ["time to target (s)"] if target is not None else []
    if target is not None and _peaks(rows):  # against the baseline to the same target
        aimed = [f"vs {rows_baseline(rows)}", "time to target (s)", "sooner", "KiB to target", "fewer bytes"]
    return ["strategy", "time/step (ms)", *spread, "speedup", "of ideal", "wire KiB/step", *peak, "reduction",
            f"{name} (mean [min, max])"] + aimed + ["exposed comm", "other waits", "optimizer / note"]


def rows_baseline(rows: list[Row]) -> str:
    """The baseline's name: the first row that is not compute-only."""
    return next((r.strategy for r in rows if r.strategy != COMPUTE_ONLY), "baseline")


def _peaks(rows: list[Row]) -> bool:
    """Whether the rows carry per-step bytes (a script's run that recorded them)."""
    return any(not math.isnan(r.peak_kib_per_step) for r in rows if r.unit == "step")


def _ttt(r: Row) -> str:
    return (f"{r.time_to_target:.2f} ({r.reached}/{r.seeds})" if r.time_to_target is not None
            else f"not reached (0/{r.seeds})")


def _cells(r: Row, target: float | None = None, spread: bool = False, peaks: bool = False,
           predicted: bool = False) -> list[str]:
    """One row's cells; ``spread``: with the steps' p50 / p95 / max after the time (a changing network);
    ``predicted``: with the step model's speedup after the measured one (bundled models)."""
    cells = _plain_cells(r, target, peaks)
    if predicted and r.unit == "epoch":
        cells.insert(3, _predicted_cell(r))
    if spread:
        shown = "" if math.isnan(r.step_p50_ms) else f"{r.step_p50_ms:.1f} / {r.step_p95_ms:.1f} / {r.step_max_ms:.1f}"
        cells.insert(2, shown if r.ok or r.status == UNSOUND else "")
    return cells


def _predicted_cell(r: Row) -> str:
    """``1.85x (-1%)``: the predicted speedup and its distance from the measured one."""
    if math.isnan(r.predicted_speedup) or not (r.ok or r.status == UNSOUND):
        return "—"
    return f"{r.predicted_speedup:.2f}x ({r.predicted_speedup / r.speedup - 1:+.0%})"


def _plain_cells(r: Row, target: float | None = None, peaks: bool = False) -> list[str]:
    width = 10 + (r.unit == "step" and target is not None) + (r.unit == "step" and peaks) * (
        1 + 4 * (target is not None))
    if not r.ok and r.status != UNSOUND:
        status = {"failed": "FAILED", "not finished": "NOT FINISHED"}.get(r.status, r.status.upper())
        if r.unit == "step":  # the reason goes in the wide last column
            return [r.strategy, status] + [""] * (width - 3) + [r.error]
        return [r.strategy, status, "", "", "", "", r.error, "", "", ""]
    metric = f"{r.metric_mean:.4f} [{r.metric_min:.3f}, {r.metric_max:.3f}]" if not math.isnan(r.metric_mean) else "—"
    note = r.applied
    if r.status == UNSOUND:  # its figures stand; its metric says why it is not ok
        metric = f"UNSOUND {metric}"
        note = f"UNSOUND: {r.error}" + (f" ({r.applied})" if r.applied else "")
    if r.unit == "epoch":
        return [r.strategy, f"{r.epoch_seconds:.3f}", f"{r.speedup:.2f}x", _share(r.of_ideal),
                f"{r.wire_mb_per_epoch:.2f}", _reduction(r), metric, _ttt(r), _share(r.exposed_share),
                _share(r.peer_wait_share)]
    peak = [_num(r.peak_kib_per_step, ".1f")] if peaks else []
    aimed = [_ttt(r)] if target is not None else []
    if target is not None and peaks:
        aimed = [_signed(r.vs_baseline), _ttt(r), _times(r.sooner), _num(r.bytes_to_target / 1024, ".0f"),
                 _times(r.fewer_bytes_to_target)]
    return [r.strategy, f"{r.step_ms:.1f}", f"{r.speedup:.2f}x", _share(r.of_ideal), f"{r.wire_mb_per_step * 1024:.1f}",
            *peak, _reduction(r), metric] + aimed + [_share(r.exposed_share), _share(r.peer_wait_share), note]


def _num(x: float, fmt: str) -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def _times(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.1f}x"


def _signed(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:+.1%}"


def _reduction(r: Row) -> str:
    """The bytes' reduction; none for compute-only, whose gradients never go on the wire."""
    return "—" if r.strategy == COMPUTE_ONLY or math.isnan(r.reduction) else f"{r.reduction:.1f}x"


def _share(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.0%}"


#: the baseline's network share of the step at or above which a network is communication-bound
COMM_BOUND = 0.5
#: at or below which it is compute-bound
COMPUTE_BOUND = 0.15
#: a speedup below this is "slower"; between it and 1, a tie at the noise of repeated runs
TIE = 0.97


def _reached(r: Row) -> bool:
    return r.time_to_target is not None and r.reached == r.seeds > 0


def _fastest(base: Row, candidates: list[Row], target: float | None) -> tuple[Row | None, str]:
    """The fastest of ``candidates`` if faster than ``base``, and how it is said: by time to the target
    (reached on every seed) where one is set and reached, else by speedup."""
    reached = [r for r in candidates if _reached(r)] if target is not None else []
    if reached:
        soonest = min(reached, key=lambda r: r.time_to_target or math.inf)
        base_time = base.time_to_target if _reached(base) else None
        if base_time is not None and not (soonest.time_to_target or math.inf) < base_time:
            return None, ""
        than = f"{base.strategy} {base_time:.2f} s" if base_time is not None else f"{base.strategy} did not"
        return soonest, f"{soonest.strategy} reached {target:.2f} in {soonest.time_to_target:.2f} s ({than})"
    best = max(candidates, key=lambda r: r.speedup, default=None)
    if best is None or not best.speedup >= 1.0:
        return None, ""
    ideal = f" ({best.of_ideal:.0%} of ideal)" if not math.isnan(best.of_ideal) else ""
    return best, f"{best.strategy} {best.speedup:.2f}x{ideal}"


def verdict(rows: list[Row], net: str, target: float | None = None) -> str:
    """A few sentences under a network's table: the regime, the strategies that do not pay, the fastest sound one.

    Fastest: with a ``target``, the sound strategy that reached it soonest on
    every seed (by time per unit when none did); else the highest speedup,
    if at least 1. An unsound strategy (module doc) is never named fastest:
    one faster than the named one is said to be unsound, with why.
    """
    mine = [r for r in rows if r.net == net and r.strategy != COMPUTE_ONLY and r.ok]
    unsound = [r for r in rows if r.net == net and r.strategy != COMPUTE_ONLY and r.status == UNSOUND]
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
    if slower:
        out += (" Slower than " + base.strategy + " here (their CPU work costs more than the network time they "
                "save): " + ", ".join(f"{r.strategy} {r.speedup:.2f}x" for r in slower) + ".")
    best, how = _fastest(base, mine[1:], target)
    if best is not None:
        out += f" Fastest: {how}."
    bar = best.speedup if best is not None else 1.0
    faster = [r for r in unsound if r.speedup > bar]
    if faster:
        out += " Faster but UNSOUND (not counted): " + "; ".join(
            f"{r.strategy} {r.speedup:.2f}x, {r.error}" for r in faster) + "."
    elif unsound:
        out += " UNSOUND: " + "; ".join(f"{r.strategy}, {r.error}" for r in unsound) + "."
    for r in mine:
        if r.auto:
            out += f" {r.strategy} (first seed): {r.auto[0]['describe'].removeprefix('auto: ')}."
    return out


def prediction_line(rows: list[Row]) -> str:
    """How far the predicted speedups are from the measured ones, over every row that has both ('' if none)."""
    both = [r for r in rows if (r.ok or r.status == UNSOUND) and not math.isnan(r.predicted_speedup)
            and r.speedup > 0]
    if not both:
        return ""
    worst = max(both, key=lambda r: abs(r.predicted_speedup / r.speedup - 1))
    error = worst.predicted_speedup / worst.speedup - 1
    return (f"predicted against measured speedups: within {abs(error):.0%} on every network (the furthest: "
            f"{worst.strategy} on {worst.net}, {worst.predicted_speedup:.2f}x predicted, {worst.speedup:.2f}x measured)")


def _title(net: str, rows: list[Row], target: float | None) -> str:
    clock = _clock_of(net)
    return _metric_title(net, rows, target) + (f"; {clock}" if clock else "")


def _clock_of(net: str) -> str:
    """The clock and device a table's times are in, in words."""
    from gradwire.compare.config import clock_words

    spec = network_of(net.strip("`"))
    return "" if spec is None else clock_words(spec)  # a name that is no spec (a saved file's label): nothing to say


def _metric_title(net: str, rows: list[Row], target: float | None) -> str:
    if rows and rows[0].unit == "step":
        metric = rows[0].metric
        how = ("the loss gradwire saw (scalars .backward() was called on), last tenth of the steps"
               if metric == TRAIN_LOSS else f"the script's last gradwire.report({metric}=...)")
        return f"network {net} — metric: {how}" + (f"; time to {target:g}" if target is not None else "")
    return f"network {net} — time to accuracy {target:.2f}" if target is not None else f"network {net}"


def to_markdown(rows: list[Row], target: float | None) -> str:
    """Markdown tables, one per network (the target of each: ``target``, or the one its rows carry)."""
    out = []
    shown = _net_target(rows, next((r.net for r in rows if r.target is not None), ""), target)
    columns = _columns(rows, shown)
    spread, peaks, predicted = _changing(rows), _peaks(rows), _predicts(rows)
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        aim = _net_target(rows, net, target) if shown is not None else None
        title = _title(f"`{net}`", rows, aim)
        out.append(title.replace(" — ", " (", 1) + ")\n" if " — " in title else title + "\n")
        out.append("| " + " | ".join(columns) + " |")
        out.append("|" + "---|" * len(columns))
        for r in rows:
            if r.net == net:
                out.append("| " + " | ".join(_cells(r, shown, spread, peaks, predicted)) + " |")
        out.append("")
        said = " ".join(line for line in (verdict(rows, net, aim), soundness_line(rows, net)) if line)
        if said:
            out += [said, ""]
    if any(r.strategy == COMPUTE_ONLY for r in rows):
        out += [IDEAL_NOTE, ""]
    return "\n".join(out)


def print_table(rows: list[Row], target: float | None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(Console().width, 150), emoji=False)
    shown = _net_target(rows, next((r.net for r in rows if r.target is not None), ""), target)
    columns = _columns(rows, shown)
    spread, peaks, predicted = _changing(rows), _peaks(rows), _predicts(rows)
    for net in dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY):
        aim = _net_target(rows, net, target) if shown is not None else None
        table = Table(title=escape(_title(net, rows, aim)))
        for c in columns:
            table.add_column(escape(c), justify="left" if c in ("strategy", "optimizer / note") else "right")
        for r in rows:
            if r.net == net:
                table.add_row(*(escape(c) for c in _cells(r, shown, spread, peaks, predicted)))
        console.print(table)
        said = " ".join(line for line in (verdict(rows, net, aim), soundness_line(rows, net)) if line)
        if said:
            console.print(escape(said))
    if any(r.strategy == COMPUTE_ONLY for r in rows):
        console.print(escape(IDEAL_NOTE), style="dim")
