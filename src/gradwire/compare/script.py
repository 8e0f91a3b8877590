"""``gradwire compare -- CMD``: the user's own training script under every strategy and network.

Each training runs the command unchanged, in fresh processes, with the
profile's ``sitecustomize`` first on ``PYTHONPATH``
(:mod:`gradwire.profile.bootstrap`): the script's ``init_process_group``
gets the ``gradwire`` backend on the run's network whatever backend it
names, and :mod:`gradwire.compare.child` applies the strategy where the
script builds its DDP model and records its steps. Three launch forms:

1. ``torchrun ... train.py ...`` (or ``python -m torch.distributed.run``):
   run as given; ``PET_MASTER_PORT`` is set to a free port, so consecutive
   runs do not meet on torchrun's default port (an explicit
   ``--master-port`` or ``--standalone`` still wins);
2. ``--workers N python train.py ...``: gradwire starts N copies with
   ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
   ``MASTER_ADDR`` and ``MASTER_PORT`` set (and ``OMP_NUM_THREADS=1`` unless
   set, as torchrun does); when one exits with an error the others are
   stopped after a short grace;
3. anything else, run once as given: a script that starts its own ranks
   (``torch.multiprocessing.spawn``, as PyTorch's DDP tutorial does).

Seeds: every run gets ``GRADWIRE_SEED``; a ``{seed}`` in the command is
replaced by the seed (``train.py --seed {seed}``). The order of the
trainings rotates from round to round as in :mod:`gradwire.compare.runner`.

Outcome of a training (:mod:`gradwire.compare.results`):

- ``refused`` / ``not applied``: what a rank's injection said (its
  ``status.rank<N>.json``, written before the refusal was raised); a script
  that never built a DDP model is ``not applied`` for every strategy but
  ``sync`` (and compute-only), which are the script as written;
- ``timed out``: it ran past its limit (:func:`training_timeout`: by
  default 900 s for the baseline, which trains first, then
  ``max(120 s, 4 x`` the baseline's measured time``)``) and was stopped with
  every process it started;
- ``failed``: the command exited with an error or wrote no results; the
  error is the command's own stderr (its last lines), so a bad path or a
  syntax error reads as Python wrote it;
- ``ok``: it exited 0, or every rank had written its results at
  ``destroy_process_group`` and only teardown failed (gloo now and then
  aborts a process after training: "terminate called without an active
  exception").

A run that is not ``ok`` drops its remaining seeds; the other runs go on.
Every training's files stay in ``<out>/runs/<nnn>-<strategy>-seed<k>/``:
the ranks' results, ``stdout.log`` and ``stderr.log``, and in ``workdir/``
what the training created in the working directory, moved there so that
the next training starts from the directory the first one did; a training
that modified or removed what the working directory held before stops the
comparison (:mod:`gradwire.compare.workdir`). ``results.json`` lists both
under ``workdir``.
"""
from __future__ import annotations

import json
import re
import shlex
import signal
import statistics
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gradwire.compare import child
from gradwire.compare.child import ADAM_WARMUP_ENV, RECORD_KEY, SEED_ENV, STRATEGY_ENV
from gradwire.compare.config import COMPUTE_ONLY, DEFAULT_NET, Named, ideal_of
from gradwire.compare.ledger import Ledger
from gradwire.compare.processes import ProcessTree, deferred_signals, subreaper
from gradwire.compare.results import (
    FAILED, NOT_APPLIED, OK, REFUSED, TIMED_OUT, Curve, Results, SeedResult, TrainingEvent,
)
from gradwire.compare.workdir import Changes, WorkDir
from gradwire.exchange.schemes import DEFAULT_ADAM_WARMUP
from gradwire.net import NetSpec
from gradwire.strategies import StrategyChoice, parse_strategy

__all__ = ["DEFAULT_SCRIPT_STRATEGIES", "ScriptConfig", "launch_form", "parse_strategy_args", "run_script_compare",
           "training_timeout"]

#: baseline, gradwire's compressed exchange with and without overlap, PyTorch's hooks as peers
DEFAULT_SCRIPT_STRATEGIES = ("sync", "onebit", "onebit+delayed", "torch-fp16", "torch-powersgd:4")

#: what a comparison writes into its folder (an earlier comparison's are moved to previous-<time>/)
OUTPUTS = ("results.json", "table.md", "metric.png", "breakdown.png")

#: lines of a failed command's stderr kept as its error
ERROR_LINES = 30

#: the message gloo's teardown leaves when it aborts a finished process
TEARDOWN_ABORT = "terminate called without an active exception"

#: how a training stopped at its time limit is said
TIMED_OUT_PREFIX = "timed out after"

#: the time limit of a training before the baseline has one measured (the baseline itself, compute-only before it)
FIRST_TIMEOUT = 900.0
#: the derived limit is at least this (seconds): process start-up and a loaded machine vary
TIMEOUT_FLOOR = 120.0
#: the derived limit is this many times the baseline's longest seed so far
TIMEOUT_FACTOR = 4.0


def training_timeout(given: float | None, baseline_seconds: list[float]) -> tuple[float, str]:
    """(seconds one training may take, the rule that gave them, in words).

    ``--timeout`` when given. Otherwise the baseline has not been measured
    yet (it trains first, with compute-only before it: :data:`FIRST_TIMEOUT`)
    or it has: ``max(TIMEOUT_FLOOR, TIMEOUT_FACTOR x`` its longest measured
    seed), its wall time with process start-up. A strategy 4x slower than
    the baseline (PowerSGD on CPU measured 2.1x) still finishes; a hung one
    is stopped minutes, not a quarter of an hour, later.
    """
    if given is not None:
        return given, "--timeout"
    if not baseline_seconds:
        return FIRST_TIMEOUT, "the limit before the baseline is measured"
    slowest = max(baseline_seconds)
    limit = max(TIMEOUT_FLOOR, TIMEOUT_FACTOR * slowest)
    return limit, (f"{TIMEOUT_FACTOR:g} x the baseline's {slowest:.0f} s, at least {TIMEOUT_FLOOR:.0f} s; "
                   "--timeout sets it")


@dataclass(frozen=True)
class ScriptConfig(Named):
    """A comparison of one script: its command x every network x every strategy x every seed."""

    cmd: tuple[str, ...]
    """the command, as after ``--``; ``{seed}`` in it is replaced by the seed"""
    nets: tuple[NetSpec, ...] = field(default_factory=lambda: (NetSpec.of(DEFAULT_NET),))
    strategies: tuple[StrategyChoice, ...] = field(
        default_factory=lambda: tuple(parse_strategy(s) for s in DEFAULT_SCRIPT_STRATEGIES))
    """the first is the baseline"""
    seeds: tuple[int, ...] = (0,)
    workers: int | None = None
    """start this many copies of the command (``python train.py``); None: the command starts its ranks"""
    out: Path = field(default_factory=lambda: Path("gradwire-compare"))
    timeout: float | None = None
    """seconds one training may take; None: derived from the baseline's measured time (:func:`training_timeout`)"""
    adam_warmup: int = DEFAULT_ADAM_WARMUP
    """optimizer steps of full-precision Adam before the variance freezes (compressed strategies)"""
    metric: str | None = None
    """the reported metric the table shows (None: the first the script reports, else the training loss)"""
    target: float | None = None
    """the metric's value to measure the time to (reached from above for a loss); None: no time to target"""
    allow_modified: bool = False
    """go on when a training modified or removed a file the working directory held before the comparison
    (:mod:`gradwire.compare.workdir`); by default the comparison stops there"""
    target_within: float | None = None
    """the target as a share of each network's baseline: its final metric (mean over seeds) widened by this
    in the worse direction (0.02: a loss 2% above the baseline's); None: ``target`` or none"""
    strategy_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """arguments appended to the command for one strategy's trainings (``{"diloco:100": ("--steps", "1200")}``):
    a strategy that needs more steps than the baseline gets them from the script's own flag"""
    ideal: bool = True
    """train compute-only too, first (the table's ideal bound and share of it); off, one training fewer per seed"""

    def __post_init__(self) -> None:
        if not self.cmd:
            raise ValueError("no command given: use `gradwire compare [options] -- torchrun ... train.py`")
        object.__setattr__(self, "cmd", tuple(self.cmd))
        self._parse_named()
        if not self.seeds:
            raise ValueError("at least one seed is needed")
        if self.workers is not None:
            if not 1 <= self.workers <= 64:
                raise ValueError(f"--workers must be between 1 and 64, got {self.workers}")
            if launch_form(self.cmd) == "torchrun":
                raise ValueError("--workers starts the ranks itself: give `python train.py ...` with it, or "
                                 "torchrun without it")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if self.adam_warmup < 1:
            raise ValueError(f"--adam-warmup must be >= 1 step (Adam needs a variance to freeze), got {self.adam_warmup}")
        if self.target_within is not None:
            if self.target is not None:
                raise ValueError("--target and --target-within both set the target: give one")
            if not 0 <= self.target_within < 1:
                raise ValueError(f"--target-within must be a share from 0 to 1 (0.02 or 2%), got {self.target_within}")
        extra: dict[str, tuple[str, ...]] = {}
        for name, args in self.strategy_args.items():
            key = str(parse_strategy(name))
            if key not in self.strategy_names:
                raise ValueError(f"--strategy-args {name}: not one of the strategies ({', '.join(self.strategy_names)})")
            if key == self.strategy_names[0]:
                raise ValueError(f"--strategy-args {name}: the baseline runs the command as given; put its "
                                 "arguments in the command")
            extra[key] = tuple(args)
        object.__setattr__(self, "strategy_args", extra)

    def as_dict(self) -> dict[str, Any]:
        return {"mode": "script", "cmd": list(self.cmd), "nets": list(self.net_names),
                "strategies": list(self.strategy_names), "seeds": list(self.seeds), "workers": self.workers,
                "out": str(self.out), "timeout": self.timeout, "adam_warmup": self.adam_warmup,
                "metric": self.metric, "target": self.target, "target_within": self.target_within,
                "strategy_args": {k: list(v) for k, v in self.strategy_args.items()},
                "allow_modified": self.allow_modified, "ideal": self.ideal, "launch": launch_form(self.cmd)}

    def command(self, strategy: str, seed: int) -> list[str]:
        """The command one training of ``strategy`` runs: ``{seed}`` replaced, the strategy's arguments appended."""
        return [a.replace("{seed}", str(seed)) for a in self.cmd + self.strategy_args.get(strategy, ())]


def parse_strategy_args(text: str) -> tuple[str, tuple[str, ...]]:
    """``STRATEGY=ARGS`` (``diloco:100=--steps 1200``) as (strategy, the arguments split as a shell would).

    A strategy's options hold ``=`` too (``diloco:100:lr=0.5=--steps 1200``):
    the strategy is the shortest prefix before an ``=`` that names one.
    """
    cuts = [i for i, c in enumerate(text) if c == "="]
    for i in cuts:
        name, args = text[:i].strip(), text[i + 1:]
        try:
            parse_strategy(name)
        except ValueError:
            continue
        if args.strip():
            return name, tuple(shlex.split(args))
    raise ValueError(f"expected STRATEGY=ARGS with a strategy's name and the arguments to append "
                     f"(e.g. 'diloco:100=--steps 1200'), got {text!r}")


def launch_form(cmd: tuple[str, ...] | list[str]) -> str:
    """``torchrun`` (torchrun or ``python -m torch.distributed.run``) or ``plain`` (anything else)."""
    if not cmd:
        return "plain"
    if Path(cmd[0]).name == "torchrun":
        return "torchrun"
    for a, b in zip(cmd, cmd[1:]):
        if a == "-m" and b in ("torch.distributed.run", "torch.distributed.launch"):
            return "torchrun"
    return "plain"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", name)


@dataclass
class _Launched:
    """The processes of one training: the ones started and all they start (:mod:`gradwire.compare.processes`)."""

    tree: ProcessTree
    started: float
    ended: float = 0.0
    """when the last process exited or was told to stop"""

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return self.tree.roots

    def kill(self) -> None:
        """Stop every process of the training, in whatever session, and reap them."""
        self.tree.stop()


def _launch(cfg: ScriptConfig, cmd: list[str], env: dict[str, str], folder: Path) -> _Launched:
    from gradwire.launch import free_port

    stdout = (folder / "stdout.log").open("wb")
    stderr = (folder / "stderr.log").open("wb")
    tree = ProcessTree()
    try:
        if cfg.workers is None:
            env = dict(env, PET_MASTER_PORT=str(free_port()))
            tree.add(subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, start_new_session=True))
        else:
            common = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(cfg.workers),
                          LOCAL_WORLD_SIZE=str(cfg.workers))
            common.setdefault("OMP_NUM_THREADS", "1")
            for rank in range(cfg.workers):
                rank_env = dict(common, RANK=str(rank), LOCAL_RANK=str(rank))
                tree.add(subprocess.Popen(cmd, env=rank_env, stdout=stdout, stderr=stderr, start_new_session=True))
    except BaseException:
        tree.stop()  # the copies started before one could not be
        raise
    finally:
        stdout.close()
        stderr.close()
    return _Launched(tree, time.perf_counter())


def _wait(launched: _Launched, timeout: float, grace: float = 10.0) -> tuple[int, str]:
    """Wait for every process; (exit code, why it was stopped). The first non-zero code wins.

    However it ends, every process the training started is stopped and
    reaped before this returns: a rank's DataLoader workers, a torchrun
    worker in its own session, what a finished script left running.
    """
    deadline = launched.started + timeout
    failed_at: float | None = None
    watched = 0.0
    try:
        while True:
            codes = [p.poll() for p in launched.procs]
            if all(c is not None for c in codes):
                bad = [c for c in codes if c]
                return (bad[0] if bad else 0), ""
            now = time.perf_counter()
            if now - watched > 0.5:  # remember the tree while its parents live (processes module doc)
                launched.tree.watch()
                watched = now
            if failed_at is None and any(c for c in codes if c is not None):
                failed_at = now  # a rank failed: its peers may wait in a collective for it
            if failed_at is not None and now - failed_at > grace:
                bad = [c for c in codes if c]
                return bad[0], "the other ranks were stopped after one failed"
            if now > deadline:
                return -signal.SIGKILL, f"{TIMED_OUT_PREFIX} {timeout:.0f} s"
            time.sleep(0.05)
    finally:
        launched.ended = time.perf_counter()
        with deferred_signals():
            launched.kill()


def _tail(path: Path, lines: int = ERROR_LINES) -> str:
    """The last ``lines`` of a log, after the first C++ abort's ``what():`` line if that came earlier.

    A rank that aborts in C++ (gloo's enforce) prints its reason once, and the
    launcher then prints tracebacks of the others and its own summary.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    every = text.rstrip().splitlines()
    cause = next((line.strip() for line in every[:-lines] if "what():" in line), None)
    return "\n".join(([cause] if cause else []) + every[-lines:])


def _read(folder: Path, pattern: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(folder.glob(pattern)):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a rank killed while writing: counted as missing
    return out


def _chunked(curve: Curve, points: int = 60) -> Curve:
    """At most ``points`` points: consecutive values averaged (a per-step loss is noisy)."""
    n = len(curve.values)
    if n <= points:
        return curve
    size = -(-n // points)
    out = Curve()
    for i in range(0, n, size):
        out.seconds.append(curve.seconds[min(n, i + size) - 1])
        out.values.append(statistics.fmean(curve.values[i:i + size]))
        if curve.steps:
            out.steps.append(curve.steps[min(n, i + size) - 1])
    return out


def _final_loss(values: list[float]) -> float:
    """The mean of the last tenth of the steps' losses (at least 1, at most 50)."""
    k = max(1, min(50, len(values) // 10))
    return statistics.fmean(values[-k:])


def _seed_result(seed: int, seconds: float, ranks: list[dict[str, Any]], code: int) -> SeedResult:
    """One training's figures: the first rank's timing and bytes, the ranks' losses, the script's reports."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    first = ranks[0]
    result = SeedResult(seed, seconds=seconds, train_seconds=first.get("train_seconds", 0.0), steps=first["steps"],
                        step_seconds=first.get("step_seconds", []), exposed_seconds=first.get("exposed_seconds", 0.0),
                        exposed_network_seconds=first.get("exposed_network_seconds"),
                        wire_bytes=first.get("wire_bytes", 0), payload_bytes=first.get("payload_bytes", 0),
                        step_wire_bytes=first.get("step_wire_bytes", []))
    losses = [r["loss"]["value"] for r in ranks if r.get("loss", {}).get("value")]
    if losses:
        result.metrics["train_loss"] = statistics.fmean(_final_loss(v) for v in losses)
        n = min(len(v) for v in losses)
        curve = ranks[0]["loss"]
        result.curves["train_loss"] = _chunked(Curve(curve["time"][:n], [statistics.fmean(v[i] for v in losses)
                                                                        for i in range(n)], curve["step"][:n]))
    reporter = next((r for r in ranks if r.get("reports")), None)
    if reporter is not None:
        for entry in reporter["reports"]:
            for name, value in entry["values"].items():
                curve = result.curves.setdefault(name, Curve())
                curve.seconds.append(entry["time"])
                curve.values.append(value)
                curve.steps.append(entry["step"])
                result.metrics[name] = value
    result.detail = {"world": first["world"], "exit_code": code, "timed_by": first["timed_by"],
                     "comm_seconds": first.get("comm_seconds", 0.0), "collectives": first.get("collectives", 0),
                     "ended": [r["ended"] for r in ranks], "injection": [r["injection"] for r in ranks]}
    return result


def _outcome(cfg: ScriptConfig, strategy: str, folder: Path, code: int, why: str,
             seconds: float, seed: int) -> tuple[str, str, SeedResult | None, str]:
    """(status, error, result, applied) of one finished training (see the module doc)."""
    statuses = _read(folder, "status.rank*.json")
    for kind in (REFUSED, NOT_APPLIED):
        said = next((s for s in statuses if s["status"] == kind), None)
        if said is not None:
            return kind, said["reason"], None, ""
    records = [r for r in _read(folder, "rank*.json")]
    compared = [r[RECORD_KEY] for r in records if RECORD_KEY in r]
    stderr = _tail(folder / "stderr.log")
    applied = compared[0]["injection"]["short"] if compared else ""
    world = compared[0]["world"] if compared else 0
    complete = bool(compared) and len(compared) == world
    clean_end = complete and all(c["ended"] == "destroy_process_group" for c in compared)
    if why.startswith(TIMED_OUT_PREFIX):
        return TIMED_OUT, f"{why}\n{stderr}".strip(), None, applied
    if code != 0 and not (clean_end and not why and (code in (-signal.SIGABRT, 128 + signal.SIGABRT) or
                                                     TEARDOWN_ABORT in stderr)):
        head = f"exit code {code}" + (f" ({why})" if why else "")
        return FAILED, f"{head}\n{stderr}".strip(), None, applied
    if not compared:
        return FAILED, (f"the command wrote no results (exit code {code}): did it call "
                        f"torch.distributed.init_process_group?\n{stderr}").strip(), None, applied
    if not complete:
        return FAILED, f"{len(compared)} of {world} ranks wrote results (exit code {code})\n{stderr}".strip(), \
            None, applied
    broken = next((c for c in compared if c["ended"] == "uncaught exception"), None)
    if broken is not None:
        return FAILED, f"rank {broken['rank']}: {broken['error']}\n{stderr}".strip(), None, applied
    sync = strategy == COMPUTE_ONLY or parse_strategy(strategy) == parse_strategy("sync")
    if not sync and not any(c["injection"]["ddp"] for c in compared):
        return NOT_APPLIED, ("the script built no DistributedDataParallel model; the strategy is applied at "
                             "DDP construction"), None, applied
    if not any(c["steps"] for c in compared):
        return FAILED, "the script took no training step gradwire could time (no DDP forward)", None, applied
    return OK, "", _seed_result(seed, seconds, compared, code), applied


def _collect(workdir: WorkDir, folder: Path, results: Results) -> Changes:
    """Move what the training created in the working directory into its folder; note what it changed."""
    found = workdir.collect(folder / "workdir")
    if found.created or found.touched:
        results.workdir.append({"training": folder.name, "into": str(folder / "workdir"), **found.as_dict()})
    return found


def _train(cfg: ScriptConfig, net: NetSpec, strategy: str, seed: int, folder: Path,
           baseline_seconds: list[float]) -> tuple[int, str, float]:
    """Run one training and stop all it started, however it ends: (exit code, why it was stopped, seconds)."""
    from gradwire.profile.bootstrap import child_env

    name, spec = ("sync", ideal_of(net).to_string()) if strategy == COMPUTE_ONLY else (strategy, net.to_string())
    env = child_env(spec, folder, after_init=child.__name__)
    env.update({STRATEGY_ENV: name, ADAM_WARMUP_ENV: str(cfg.adam_warmup), SEED_ENV: str(seed)})
    try:
        launched = _launch(cfg, cfg.command(strategy, seed), env, folder)  # stops what it started if it raises
    except OSError as exc:  # the program could not start at all
        return 127, f"{cfg.cmd[0]}: {exc.strerror or exc}", 0.0
    limit, rule = training_timeout(cfg.timeout, baseline_seconds)
    code, why = _wait(launched, limit)  # stops every process on the way out, on Ctrl-C too
    if why.startswith(TIMED_OUT_PREFIX):
        why += f" ({rule})"
    return code, why, launched.ended - launched.started


def run_script_compare(cfg: ScriptConfig, on_training: Callable[[TrainingEvent], None] | None = None) -> Results:
    """Run the script under every (net, strategy) and seed, plus compute-only (unless ``cfg.ideal`` is off);
    save results.json as trainings end.

    The books (rotation, results as trainings end, seeds dropped, Ctrl-C)
    are a :class:`~gradwire.compare.ledger.Ledger`'s. While it runs, this
    process is a child subreaper (:mod:`gradwire.compare.processes`), and
    SIGTERM or SIGHUP stop it as Ctrl-C does.

    Raises:
        KeyboardInterrupt: (:class:`~gradwire.compare.processes.ComparisonStopped` for
            SIGTERM or SIGHUP) after stopping every process of the training in
            flight, moving what it created in the working directory, and saving
            results.json with the unfinished runs marked ``not finished``.
    """
    out = Path(cfg.out)
    ledger = Ledger(out, OUTPUTS, cfg.as_dict(), cfg.run_names, cfg.seeds, on_training, ranks_agree=None)
    nets = dict(zip(cfg.net_names, cfg.nets))
    workdir = WorkDir(Path.cwd(), skip=(out,))
    baseline = cfg.strategy_names[0]
    with subreaper() as no_reaper, ledger.running():
        if no_reaper:
            warnings.warn(f"gradwire compare: {no_reaper}", RuntimeWarning, stacklevel=2)
        for index, (net, strategy, seed) in enumerate(ledger.order()):
            if not ledger.pending(net, strategy):  # refused, not applied or failed on an earlier seed
                continue
            folder = out / "runs" / f"{index:03d}-{_slug(strategy)}-seed{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            base = ledger.runs[(net if strategy != COMPUTE_ONLY else cfg.net_names[0], baseline)]
            try:
                code, why, seconds = _train(cfg, nets[net], strategy, seed, folder, [r.seconds for r in base.seeds])
            except KeyboardInterrupt:
                with deferred_signals():
                    _collect(workdir, folder, ledger.results)
                raise
            status, error, seed_result, applied = _outcome(cfg, strategy, folder, code, why, seconds, seed)
            found = _collect(workdir, folder, ledger.results)
            run = ledger.runs[(net, strategy)]
            extra = cfg.strategy_args.get(strategy)
            run.applied = run.applied or (applied + (f"; command + {shlex.join(extra)}" if extra and applied else ""))
            if status == OK:
                assert seed_result is not None
                ledger.ok(net, strategy, seed_result, seconds, found.note())
            else:
                ledger.not_ok(net, strategy, seed, status, error, seconds, found.note())
            if found.touched and not cfg.allow_modified:
                ledger.stop(found.refusal(folder.name, workdir.root), folder.name)
    return ledger.results
