"""What a comparison produces, as dataclasses: one :class:`SeedResult` per training, one :class:`Run` per
(network, strategy), a :class:`Row` of the table per run, the :class:`Results` of the whole comparison.

Both kinds of comparison fill the same classes: the bundled digits models
(:mod:`gradwire.compare.runner`) and a user's own script
(:mod:`gradwire.compare.script`). ``results.json`` is :meth:`Results.to_json`:
plain JSON with the same names as the fields below, readable without
gradwire, and :meth:`Results.from_json` reads it back.

A run's ``status``:

- ``ok``: every seed trained;
- ``failed``: a training raised or the command failed (``error`` holds its
  own error text);
- ``timed out``: a training ran past its time limit and was stopped
  (``error`` says after how many seconds, and the rule that set them);
- ``refused``: the strategy cannot be applied to this script (``error`` says
  why); nothing was trained under it;
- ``not applied``: the script never built a DDP model, so the strategy had
  nothing to apply to (its trainings are not counted);
- ``not finished``: seeds are missing (a comparison read mid-way, or
  interrupted).
"""
from __future__ import annotations

import functools
import math

import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gradwire.net.spec import NetSpec

__all__ = ["FAILED", "NOT_APPLIED", "NOT_FINISHED", "OK", "REFUSED", "TIMED_OUT", "UNSOUND", "Curve", "Results", "Run", "SeedResult",
           "TrainingEvent", "network_of"]

OK, FAILED, REFUSED, NOT_APPLIED, NOT_FINISHED = "ok", "failed", "refused", "not applied", "not finished"
TIMED_OUT = "timed out"
#: a row (never a run) whose final metric is clearly worse than the baseline's (:mod:`gradwire.compare.report`)
UNSOUND = "unsound"


@functools.lru_cache(maxsize=64)
def network_of(net: str) -> NetSpec | None:
    """The network a run's ``net`` names (results.json keeps networks as spec strings), or None if it names none.

    A results file written elsewhere may name a network this version cannot read; its table still renders.
    """
    try:
        return NetSpec.of(net)
    except ValueError:
        return None


class _Status:
    """``ok`` and ``finished`` from a ``status`` (module doc), for :class:`Run` and :class:`Row`."""

    status: str

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def finished(self) -> bool:
        return self.status != NOT_FINISHED


@dataclass
class Curve:
    """A metric of one training over its time: ``values[i]`` at ``seconds[i]`` (and ``steps[i]`` when known)."""

    seconds: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Curve:
        return cls(list(d.get("seconds", [])), list(d.get("values", [])), list(d.get("steps", [])))


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


@dataclass
class SeedResult:
    """One training: one seed of one (network, strategy), as its first rank measured it.

    Times in seconds. ``metrics`` holds final values (``test_accuracy`` for the
    bundled models; a script's last reported values and ``train_loss``, the
    loss gradwire saw); ``curves`` the same metrics over training time.
    """

    seed: int
    seconds: float = 0.0
    """wall time of the training as the harness saw it (process start-up included for scripts)"""
    train_seconds: float = 0.0
    """the training loop: the sum of the epochs, or first forward to last optimizer step"""
    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)
    step_compute: list[float] = field(default_factory=list)
    """per step, the step less its waits (bundled models); empty for scripts (see :attr:`compute_ms`)"""
    exposed_seconds: float = 0.0
    """the training thread blocked on communication in flight, over the whole training"""
    exposed_network_seconds: float | None = None
    """the part of ``exposed_seconds`` spent waiting for the modelled network; the rest is waiting for a
    peer to reach the collective (compute on a shared core, a straggler) or CPU work in completion
    callbacks (:func:`gradwire.strategies.split_exposed`). None in results that did not record it."""
    epoch_seconds: list[float] = field(default_factory=list)
    epoch_accuracy: list[float] = field(default_factory=list)
    wire_bytes: float = 0.0
    """bytes this rank put on the wire during training (protocol framing included)"""
    payload_bytes: float = 0.0
    step_wire_bytes: list[float] = field(default_factory=list)
    """per step, the bytes of the collectives issued during it (scripts; empty in results that did not record it)"""
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    """what else the harness kept: counters, checksums, the strategy applied on each rank"""

    @property
    def step_ms(self) -> float:
        """Mean wall time per step (ms)."""
        return _mean(self.step_seconds) * 1e3

    @property
    def compute_ms(self) -> float:
        """Mean time per step outside communication waits (ms)."""
        if self.step_compute:
            return _mean(self.step_compute) * 1e3
        if not self.step_seconds:
            return float("nan")
        return (sum(self.step_seconds) - self.exposed_seconds) / len(self.step_seconds) * 1e3

    @property
    def network_ms(self) -> float:
        """Mean time per step waiting for the modelled network (ms)."""
        if not self.step_seconds:
            return float("nan")
        network = self.exposed_seconds if self.exposed_network_seconds is None else self.exposed_network_seconds
        return network / len(self.step_seconds) * 1e3

    @property
    def peer_wait_ms(self) -> float:
        """Mean time per step waiting for peers or callbacks rather than the network (ms)."""
        if not self.step_seconds or self.exposed_network_seconds is None:
            return float("nan")
        return max(0.0, self.exposed_seconds - self.exposed_network_seconds) / len(self.step_seconds) * 1e3

    @property
    def wire_bytes_per_step(self) -> float:
        return self.wire_bytes / self.steps if self.steps else float("nan")

    @property
    def peak_step_bytes(self) -> float:
        """The most bytes one step put on the wire (an averaging round's burst; NaN when not recorded)."""
        return max(self.step_wire_bytes) if self.step_wire_bytes else float("nan")

    def bytes_until(self, step: int) -> float:
        """The bytes put on the wire in steps 1..``step`` (NaN when not recorded)."""
        return float(sum(self.step_wire_bytes[:step])) if self.step_wire_bytes else float("nan")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SeedResult:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["curves"] = {name: Curve.from_json(c) for name, c in d.get("curves", {}).items()}
        return cls(**kwargs)


@dataclass
class Run(_Status):
    """Every seed of one (network, strategy)."""

    strategy: str
    net: str
    status: str = NOT_FINISHED
    error: str = ""
    seeds: list[SeedResult] = field(default_factory=list)
    seconds: float = 0.0
    ranks_agree: bool | None = True
    """every rank ended with the same parameters (bundled models; None where not checked)"""
    applied: str = ""
    """what was applied to a script (the strategy and the optimizer scheme, in words)"""

    @property
    def run(self) -> tuple[str, str]:
        return self.net, self.strategy

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"], d["finished"] = self.ok, self.finished
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Run:
        status = d.get("status") or (OK if d.get("ok") else NOT_FINISHED if d.get("finished") is False else FAILED)
        return cls(d["strategy"], d["net"], status, d.get("error", ""),
                   [SeedResult.from_json(s) for s in d.get("seeds", [])], d.get("seconds", 0.0),
                   d.get("ranks_agree", True), d.get("applied", ""))


@dataclass(frozen=True)
class TrainingEvent:
    """One training ended (for progress lines): ``status`` as a run's; ``dropped`` seeds of the run won't run.

    ``note``: what else to say of it (the files it left in the working directory, moved).
    """

    strategy: str
    net: str
    seed: int
    status: str
    seconds: float
    error: str = ""
    dropped: int = 0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class Row(_Status):
    """One line of a comparison's table: a (network, strategy)'s time, bytes, metric and step breakdown.

    :func:`gradwire.compare.report.rows_of` makes the rows from the runs; that
    module defines each column.
    """

    net: str
    strategy: str
    status: str
    unit: str = "epoch"
    """what the time and bytes are per: ``epoch`` (bundled models) or ``step`` (a script)"""
    epoch_seconds: float = float("nan")
    step_ms: float = float("nan")
    speedup: float = float("nan")
    ideal_speedup: float = float("nan")
    wire_mb_per_epoch: float = float("nan")
    wire_mb_per_step: float = float("nan")
    reduction: float = float("nan")
    metric: str = "test_accuracy"
    metric_mean: float = float("nan")
    metric_min: float = float("nan")
    metric_max: float = float("nan")
    time_to_target: float | None = None
    reached: int = 0
    seeds: int = 0
    target: float | None = None
    """the metric's value the time to target is measured to (``--target``, or the baseline's final widened by
    ``--target-within``)"""
    bytes_to_target: float = float("nan")
    """bytes one rank put on the wire until the target was reached (mean over the seeds that reach it)"""
    sooner: float = float("nan")
    """the baseline's time to target / this row's (both reached on every seed)"""
    fewer_bytes_to_target: float = float("nan")
    """the baseline's bytes to target / this row's"""
    vs_baseline: float = float("nan")
    """the final metric's mean relative to the baseline's: ``mean / baseline mean - 1``"""
    sound_bound: float = float("nan")
    """the final metric past which this row is unsound: the baseline's worst seed moved by the margin in the
    worse direction (:mod:`gradwire.compare.report`); NaN where not judged"""
    sound_by: str = ""
    """what that margin is: ``tolerance alone`` (the baseline ran fewer than 3 seeds, no spread to judge by),
    else ``tolerance`` or ``spread`` (the baseline seeds' max - min), whichever is wider; '' where not judged"""
    peak_kib_per_step: float = float("nan")
    """the most KiB one step put on the wire, over every seed (an averaging round's burst)"""
    compute_ms: float = float("nan")
    overhead_ms: float = float("nan")
    exposed_ms: float = float("nan")
    """waiting for the modelled network, per step"""
    exposed_share: float = float("nan")
    peer_wait_ms: float = float("nan")
    """waiting past the network (a late peer, callbacks), per step"""
    peer_wait_share: float = float("nan")
    of_ideal: float = float("nan")
    """compute-only time / this strategy's time"""
    predicted_speedup: float = float("nan")
    """the step model's speedup for this strategy on this network, the comparison's own step replayed
    (:mod:`gradwire.compare.crossover`); NaN where nothing was predicted"""
    step_p50_ms: float = float("nan")
    """the steps' median, 95th percentile and longest over every seed (shown on a network that changes)"""
    step_p95_ms: float = float("nan")
    step_max_ms: float = float("nan")
    error: str = ""
    applied: str = ""
    auto: list[dict[str, Any]] = field(default_factory=list)
    """``auto``'s decisions per seed (rank 0's; every rank decides alike): what it chose where, over time"""

    @property
    def time_per_unit(self) -> float:
        """Seconds per epoch, or per step."""
        return self.epoch_seconds if self.unit == "epoch" else self.step_ms / 1e3

    @property
    def wire_per_unit(self) -> float:
        return self.wire_mb_per_epoch if self.unit == "epoch" else self.wire_mb_per_step

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: (float("nan") if v is None and k not in ("time_to_target", "target") else v)
                                  for k, v in d.items() if k in known}
        return cls(**values)


@dataclass
class Results:
    """A whole comparison: its configuration (plain types), the runs, and the table's rows once made."""

    config: dict[str, Any]
    started: str
    runs: list[Run] = field(default_factory=list)
    interrupted: bool = False
    rows: list[Row] = field(default_factory=list)
    """the table's rows (:func:`gradwire.compare.report.rows_of`), filled by the CLI after the runs"""
    predicted: dict[str, Any] | None = None
    """the predicted speedup at each measured network and against bandwidth
    (:class:`gradwire.compare.crossover.SpeedupCurves`, plain types)"""
    workdir: list[dict[str, Any]] = field(default_factory=list)
    """per training of a script: what it created in the working directory (``moved`` into its folder's
    ``workdir/``), and what was there before that it ``modified`` or ``removed`` (:mod:`gradwire.compare.workdir`)"""
    stopped: str = ""
    """why the comparison stopped before its last training, when it did (not a Ctrl-C: see ``interrupted``)"""
    tolerance: str = ""
    """the tolerance the rows' soundness was judged with, as ``--tolerance`` spells it
    (``loss=2%,accuracy=1pt``); filled with the rows"""

    def run(self, net: str, strategy: str) -> Run:
        return next(r for r in self.runs if r.net == net and r.strategy == strategy)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"config": self.config, "started": self.started, "runs": [r.to_json() for r in self.runs]}
        if self.interrupted:
            d["interrupted"] = True
        if self.rows:
            d["rows"] = [r.as_dict() for r in self.rows]
        if self.predicted is not None:
            d["predicted"] = self.predicted
        if self.workdir:
            d["workdir"] = self.workdir
        if self.stopped:
            d["stopped"] = self.stopped
        if self.tolerance:
            d["tolerance"] = self.tolerance
        d["clock"] = _clock_record(self.config)
        return d

    def save(self, path: Path) -> None:
        path.write_text(compact_json(self.to_json()) + "\n")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Results:
        rows = [Row.from_json(r) for r in d.get("rows", [])]
        return cls(d["config"], d.get("started", ""), [Run.from_json(r) for r in d["runs"]],
                   bool(d.get("interrupted", False)), rows, d.get("predicted"), list(d.get("workdir", [])),
                   d.get("stopped", ""), d.get("tolerance", ""))


def _scalar(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def compact_json(obj: Any, indent: int = 0, digits: int = 6) -> str:
    """JSON for people to read and diff: one line per list of numbers, floats to ``digits`` significant digits.

    A comparison holds a few thousand per-step times; one value per line made
    its file ~12,000 lines. Six digits keep microseconds of a 100 s training.
    """
    import json

    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, float) and math.isfinite(obj):
        return json.dumps(float(f"{obj:.{digits}g}"))
    if _scalar(obj):
        return json.dumps(obj)
    if isinstance(obj, (list, tuple)):
        if all(_scalar(x) for x in obj):
            return "[" + ", ".join(compact_json(x, 0, digits) for x in obj) + "]"
        return "[\n" + ",\n".join(inner + compact_json(x, indent + 1, digits) for x in obj) + "\n" + pad + "]"
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{json.dumps(str(k))}: {compact_json(v, indent + 1, digits)}" for k, v in obj.items()]
        if all(_scalar(v) for v in obj.values()) and sum(map(len, items)) < 100:
            return "{" + ", ".join(items) + "}"
        return "{\n" + ",\n".join(inner + item for item in items) + "\n" + pad + "}"
    raise TypeError(f"not JSON: {type(obj).__name__}")


def _clock_record(config: dict[str, Any]) -> dict[str, str]:
    """What every time figure of the file is measured on: the clock, and on the simulated one the device."""
    nets = config.get("nets") or []
    spec = network_of(nets[0]) if nets else None
    if spec is None or spec.clock != "sim":
        return {"clock": "realtime", "device": "this host"}
    from gradwire.device import parse_device

    device = parse_device(spec.device or "host")
    return {"clock": "sim", "device": device.text, "device_described": device.describe()}
