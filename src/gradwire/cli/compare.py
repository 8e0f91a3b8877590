"""`gradwire compare`: train a real model under every strategy and network; table, JSON, plots.

With no command it runs the default experiment: the digits CNN (wide), one
worker per core (at least 2), on two networks, one where communication
dominates and one where it does not; baseline vs onebit, delayed,
onebit+delayed and PyTorch's fp16 and PowerSGD hooks, 3 seeds each, plus a
compute-only run. One table per network, and a plot of the predicted speedup
against bandwidth with each strategy's crossover.
The strategies take turns in one set of worker processes (round k: every
strategy on seed k), so a machine that drifts shifts them all alike.

With ``-- CMD`` it runs your own training command, unchanged, under every
strategy: ``gradwire compare --net bandwidth=500mbit -- torchrun
--nproc-per-node 4 train.py``. The strategy is applied where the script
builds its DDP model, with its own optimizer (SGD's momentum, or Adam/AdamW
in a 1-bit Adam scheme, moved into the compressed exchange); a strategy that
cannot apply is reported as refused, with the reason. ``--workers N`` starts
N copies of a ``python train.py`` command itself; ``{seed}`` in the command
is replaced by the seed (every run also gets ``GRADWIRE_SEED``). The script's
``gradwire.report(step=..., name=value)`` calls give the table its metric;
without them it shows the training loss gradwire saw. Every training
starts from the working directory the first one did: what a training
creates there (a ``snapshot.pt`` it would resume from) is moved into its
folder, ``<out>/runs/<nnn>-.../workdir/``, and a training that modifies a
file that was there before stops the comparison, saying which.

A row is ``ok`` only if its final metric is not clearly worse than the
baseline's (:mod:`gradwire.compare.report`): past the baseline's worst seed
by more than ``--tolerance`` (a loss 2% above the baseline's, an accuracy 1
point below, by default), or than the baseline seeds' spread where 3 seeds
or more show a wider one; with fewer the table says the verdict rests on
the tolerance alone. An unsound strategy keeps its figures but is never
named fastest.

Ctrl-C (or SIGTERM, SIGHUP) stops it with one line: every process of the
training in flight is stopped, in whatever session it runs (torchrun's
workers, their DataLoader workers), the trainings that finished are kept in
``results.json``, the runs that did not finish are marked ``"finished": false``.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradwire.cli._args import (
    _typed, check_net_fits, command_after_dashes, default_nets, net_spec, output_dir, positive_int, seconds,
)

if TYPE_CHECKING:
    from gradwire.compare.config import Tolerance
    from gradwire.net import NetSpec
    from gradwire.strategies import StrategyChoice

#: options of the bundled models only, and of a command only (for the refusals)
_MODEL_ONLY = ("model", "epochs", "batch_size", "lr")
_CMD_ONLY = ("adam_warmup", "metric", "allow_modified", "target_within", "strategy_args")


def add_parser(sub: Any) -> None:
    from gradwire.compare.config import (DEFAULT_NET, DEFAULT_NETS, DEFAULT_STRATEGIES, DEFAULT_TOLERANCE, CompareConfig,
                                         Tolerance)
    from gradwire.compare.script import DEFAULT_SCRIPT_STRATEGIES
    from gradwire.exchange.schemes import DEFAULT_ADAM_WARMUP

    d = CompareConfig.__dataclass_fields__
    p = sub.add_parser("compare", help="measure every strategy on real training: ours, or your own script (the main job)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--net", action="append", type=net_spec, default=None,
                   help=f"network spec or preset; repeat for several (default: {' and '.join(DEFAULT_NETS)}; "
                        f"with a command: {DEFAULT_NET})")
    p.add_argument("--strategies", default=None,
                   help="comma-separated composed names; the first is the baseline (default: "
                        f"{','.join(DEFAULT_STRATEGIES)}; with a command: {','.join(DEFAULT_SCRIPT_STRATEGIES)})")
    p.add_argument("--workers", type=positive_int(1, 64), default=None,
                   help="ranks per run (default: one per core, at least 2); with a command: start this many copies "
                        "of it (default: the command starts its ranks, e.g. torchrun)")
    p.add_argument("--seeds", type=positive_int(1), default=None,
                   help="number of seeds, 0..N-1 (default: 3; with a command: 3 if it contains {seed}, else 1)")
    p.add_argument("--out", type=output_dir, default="gradwire-compare",
                   help="output folder, created if missing (default: %(default)s)")
    p.add_argument("--timeout", type=seconds, default=None,
                   help="seconds one training may take; past it every process of the training is stopped and the "
                        "row says 'timed out' (default, with a command: 900 for the baseline, which trains first, "
                        "and compute-only before it, then max(120, 4 x the baseline's longest measured seed); "
                        "bundled models: 900 per strategy)")
    p.add_argument("--clock", choices=("sim", "realtime"), default=None,
                   help="sim: every time is the simulated cluster's (compute priced on --device, communication on "
                        "the network model; the same on any host, busy or not); realtime: this host's wall clock "
                        "(default: sim for the bundled models, realtime with a command)")
    p.add_argument("--device", type=_typed("device", _device), default=None,
                   help="what the simulated cluster computes on: cpu-core, t4, v100, a100, h100 (datasheet "
                        "rooflines), TFLOPS,GB/s (e.g. 19.5,1555), host (this rank's thread CPU time), host:x0.1 "
                        "(scaled), step=35ms (a step as you measured it) (default: cpu-core; a device implies --clock sim)")
    models = p.add_argument_group("the bundled digits models (without a command)")
    models.add_argument("--model", default=None, help=f"model name (default: {d['model'].default})")
    models.add_argument("--epochs", type=positive_int(1), default=None, help=f"(default: {d['epochs'].default})")
    models.add_argument("--batch-size", type=positive_int(1), default=None,
                        help=f"per worker (default: {d['batch_size'].default})")
    models.add_argument("--lr", type=float, default=None, help=f"(default: {d['lr'].default})")
    p.add_argument("--target", type=float, default=None,
                   help=f"the metric's value for the time to target, and the verdict's fastest: the sound strategy "
                        f"that reached it soonest on every seed (bundled models: test accuracy, default "
                        f"{d['target_accuracy'].default}; with a command: the table's metric, reached from above "
                        f"for a loss; default: none)")
    p.add_argument("--tolerance", type=_typed("tolerance", Tolerance.parse), default=None,
                   metavar="loss=SHARE,accuracy=POINTS",
                   help="how much worse than the baseline's a final metric may end and its row still be sound: a "
                        "loss (loss, perplexity, MSE) relative to the baseline's, a share (accuracy, F1, AUC, error "
                        "rate) in absolute points (1pt: 0.91 may end at 0.90; 91.0 at 90.0 for a percentage); give "
                        "either or both, e.g. 'loss=1%%' or 'loss=1%%,accuracy=0.5pt' (default: "
                        f"{str(DEFAULT_TOLERANCE).replace('%', '%%')}). Past the baseline's worst seed by more, or by "
                        "more than its seeds' spread where 3 or more show a wider one, a row is UNSOUND")
    p.add_argument("--no-ideal", dest="ideal", action="store_false",
                   help="skip the compute-only training (every gradient reduction answered on the rank itself): "
                        "one training fewer per seed, without the table's ideal bound, share of ideal and "
                        "predicted column (default: train it first)")
    models.add_argument("--no-interleave", dest="interleave", action="store_false",
                        help="run each strategy in processes of its own, one after another (default: take turns)")
    script = p.add_argument_group("your own script (after --)")
    script.add_argument("--adam-warmup", type=positive_int(1), default=None,
                        help=f"Adam/AdamW steps in full precision before the variance freezes and compression "
                             f"starts (default: {DEFAULT_ADAM_WARMUP})")
    script.add_argument("--metric", default=None,
                        help="the gradwire.report metric the table shows (default: the first one reported, "
                             "else the training loss gradwire saw)")
    script.add_argument("--target-within", type=_typed("share", _share), default=None, metavar="SHARE",
                        help="the target is each network's baseline's final metric widened by SHARE in the worse "
                             "direction (2%% or 0.02: a loss 2%% above the baseline's); the table then shows each "
                             "row's metric, time and bytes to it against the baseline's (not with --target)")
    script.add_argument("--strategy-args", action="append", default=None, metavar="STRATEGY=ARGS",
                        type=_typed("strategy_args", _strategy_args),
                        help="append ARGS to the command for STRATEGY's trainings, e.g. 'diloco:100=--steps 1200' "
                             "(a strategy that needs more steps than the baseline); repeat for several")
    script.add_argument("--allow-modified", action="store_true", default=None,
                        help="go on when a training modified or removed a file the working directory held before "
                             "(default: stop there, as the next trainings could resume from it). What a training "
                             "creates there is always moved into its folder, <out>/runs/<nnn>-.../workdir/")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the training command, after --")
    p.set_defaults(func=run)


def _share(text: str) -> float:
    """``2%`` or ``0.02`` as 0.02."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"expected a share such as 2% or 0.02, got {text!r}") from None
    if not 0 <= value < 1:
        raise ValueError(f"must be from 0 to 1 (0% to 100%), got {text!r}")
    return value


def _strategy_args(text: str) -> tuple[str, tuple[str, ...]]:
    from gradwire.compare.script import parse_strategy_args

    return parse_strategy_args(text)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n) is not None]


def run(args: argparse.Namespace) -> int:
    cmd = command_after_dashes(args.cmd, "gradwire compare [options] -- torchrun ... train.py", required=False)
    if cmd:
        return _run_script(args, cmd)
    return _run_models(args)


def _device(text: str) -> str:
    from gradwire.device import parse_device

    return parse_device(text).text


def _nets(args: argparse.Namespace, default: tuple[str, ...], clock: str = "realtime") -> tuple[NetSpec, ...]:
    """``--net`` (or ``default``, parsed as ``--net`` is), on ``--clock`` (or ``clock``) with ``--device``."""
    from gradwire.compare.config import on_clock

    chosen = args.clock or ("sim" if args.device is not None else clock)  # a device is the simulated clock's
    if args.device is not None and chosen != "sim":
        raise ValueError(f"--device {args.device} prices compute on the simulated clock: add --clock sim "
                         "(the realtime clock takes compute as this host runs it)")
    return tuple(on_clock(net, chosen, args.device) for net in default_nets(args.net, default))


def _strategies(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[StrategyChoice, ...]:
    """``--strategies`` (or ``default``), parsed."""
    from gradwire.strategies import parse_strategy

    names = default if args.strategies is None else tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    return tuple(parse_strategy(name) for name in names)


def _run_models(args: argparse.Namespace) -> int:
    from gradwire.compare import CompareConfig, run_compare
    from gradwire.compare.config import DEFAULT_CLOCK, DEFAULT_NETS, DEFAULT_STRATEGIES, default_workers, usable_cores

    given = _given(args, _CMD_ONLY)
    if given:
        raise ValueError(f"{', '.join(given)}: only for a command of your own (after --)")
    d = CompareConfig.__dataclass_fields__
    workers = default_workers() if args.workers is None else args.workers
    if not 2 <= workers <= 16:
        raise ValueError(f"argument --workers: must be an integer from 2 to 16 for the bundled models, got {workers}")

    def pick(value: Any, name: str) -> Any:
        return d[name].default if value is None else value

    cfg = CompareConfig(
        nets=_nets(args, DEFAULT_NETS, DEFAULT_CLOCK), strategies=_strategies(args, DEFAULT_STRATEGIES), workers=workers,
        model=pick(args.model, "model"), epochs=pick(args.epochs, "epochs"),
        seeds=tuple(range(3 if args.seeds is None else args.seeds)), batch_size=pick(args.batch_size, "batch_size"),
        lr=pick(args.lr, "lr"), target_accuracy=pick(args.target, "target_accuracy"), out=Path(args.out),
        interleave=args.interleave, timeout=pick(args.timeout, "timeout"), ideal=args.ideal,
    )
    for net in cfg.nets:
        check_net_fits(net, cfg.workers)
        _check_recorded_model(net, cfg.model)
    if workers > usable_cores() and cfg.nets[0].clock != "sim":
        print(f"gradwire compare: warning: {workers} workers on {usable_cores()} cores: ranks will wait for peers "
              "that are not running; the table reports that as other waits, not communication", file=sys.stderr)
    total = len(cfg.run_names) * len(cfg.seeds)
    return _run_and_report(lambda done: run_compare(cfg, on_training=done), cfg.out, total, cfg.target_accuracy,
                           "accuracy.png", args.tolerance,
                           predict_for=cfg)


def _check_recorded_model(net: NetSpec, model: str) -> None:
    """A recorded device (``device=profile:DIR``) prices the recorded model's ops: refuse another bundled model."""
    from gradwire.device import model_signature, parse_device
    from gradwire.train import build_model

    device = parse_device(net.device) if net.device else None
    if device is not None and device.kind == "recorded":
        device.recording.check_model(model_signature(build_model(model).named_parameters()))


def _world_of(cmd: list[str]) -> int | None:
    """The ranks a torchrun command starts on this node (``--nproc-per-node N``), when it says."""
    for i, a in enumerate(cmd):
        for flag in ("--nproc-per-node", "--nproc_per_node"):
            value = a[len(flag) + 1:] if a.startswith(flag + "=") else cmd[i + 1] if a == flag and i + 1 < len(cmd) else None
            if value is not None and value.isdigit():
                return int(value)
    return None


def _run_script(args: argparse.Namespace, cmd: list[str]) -> int:
    from gradwire.compare.config import DEFAULT_NET
    from gradwire.compare.script import DEFAULT_SCRIPT_STRATEGIES, ScriptConfig, launch_form, run_script_compare
    from gradwire.exchange.schemes import DEFAULT_ADAM_WARMUP

    given = _given(args, _MODEL_ONLY) + ([] if args.interleave else ["--no-interleave"])
    if given:
        raise ValueError(f"{', '.join(given)}: only for the bundled models; with a command the script decides "
                         "its model and training")
    if args.device is not None and args.device.startswith("step:"):
        raise ValueError(f"--device {args.device} scales compute by a training step, which a command's steps do "
                         "not mark; give the device the step runs on (e.g. a100, 19.5,1555 or host:x0.1), or "
                         "use step= with the bundled models (without a command)")
    seeds = args.seeds if args.seeds is not None else 3 if any("{seed}" in a for a in cmd) else 1
    cfg = ScriptConfig(cmd=tuple(cmd), nets=_nets(args, (DEFAULT_NET,)), strategies=_strategies(args, DEFAULT_SCRIPT_STRATEGIES),
                       seeds=tuple(range(seeds)), workers=args.workers, out=Path(args.out),
                       timeout=args.timeout,
                       adam_warmup=DEFAULT_ADAM_WARMUP if args.adam_warmup is None else args.adam_warmup,
                       metric=args.metric, target=args.target, allow_modified=bool(args.allow_modified),
                       target_within=args.target_within, strategy_args=dict(args.strategy_args or ()),
                       ideal=args.ideal)
    world = cfg.workers if cfg.workers is not None else _world_of(cmd) if launch_form(cmd) == "torchrun" else None
    if world is not None and world > 1:
        for net in cfg.nets:
            check_net_fits(net, world)
    total = len(cfg.run_names) * len(cfg.seeds)
    return _run_and_report(lambda done: run_script_compare(cfg, on_training=done), cfg.out, total, cfg.target,
                           "metric.png", args.tolerance)


def _run_and_report(start: Any, out: Path, total: int, target: float | None, plot_name: str,
                    tolerance: Tolerance | None, predict_for: Any = None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gradwire.compare import print_table, rows_of, to_markdown
    from gradwire.compare.predicted import predict_beside
    from gradwire.compare.report import prediction_line
    from gradwire.compare.config import DEFAULT_TOLERANCE
    from gradwire.compare.processes import ComparisonStopped
    from gradwire.compare.report import reason
    from gradwire.compare.plots import plot_breakdown, plot_metric
    from gradwire.compare.results import FAILED, TIMED_OUT, TrainingEvent

    console = Console(stderr=True, emoji=False)
    trained = [0]
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} trainings"), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("compare", total=total)

            def done(t: TrainingEvent) -> None:
                trained[0] += t.ok
                if t.ok:
                    status = "ok"
                else:
                    said = reason(t.status, t.error)[:120]
                    dropped = f"; its {t.dropped} other seeds dropped" if t.dropped else ""
                    status = f"{t.status.upper()}{dropped}: {said}"
                line = f"  {t.strategy:<22} {t.net:<36} seed {t.seed}  {status} ({t.seconds:.0f} s)"
                progress.console.print(escape(line))
                if t.note:
                    progress.console.print(escape(f"    {t.note}"))
                progress.advance(task, 1 + t.dropped)

            results = start(done)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, ComparisonStopped) else signal.SIGINT
        by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
        print(f"gradwire compare: interrupted{by}; {trained[0]} of {total} trainings finished and kept in "
              f"{out / 'results.json'} (unfinished runs marked \"finished\": false)", file=sys.stderr)
        return 128 + signum
    tolerance = tolerance or DEFAULT_TOLERANCE
    rows = rows_of(results, tolerance)
    results.tolerance = str(tolerance)
    say = lambda line: console.print(escape(line))  # noqa: E731
    curves = predict_beside(predict_for, rows, results.runs, say) if predict_for is not None else None
    print_table(rows, target)
    results.rows = rows
    plots = [out / plot_name, out / "breakdown.png"]
    markdown = to_markdown(rows, target)
    if curves is not None:
        from gradwire.compare.plots import plot_bandwidth

        results.predicted = curves.as_dict()
        line = curves.verdict()
        console.print(escape(line))
        markdown += f"\n{line} (bandwidth.png).\n"
        against = prediction_line(rows)
        if against:
            console.print(escape(against))
            markdown += f"\n{against}.\n"
        plots.append(plot_bandwidth(results.predicted, rows, out / "bandwidth.png"))
    results.save(out / "results.json")
    (out / "table.md").write_text(markdown)
    plot_metric(results, plots[0])
    plot_breakdown(rows, plots[1])
    console.print(f"results: {out / 'results.json'}, {out / 'table.md'}, " + ", ".join(map(str, plots)))
    failed = [r for r in results.runs if r.status in (FAILED, TIMED_OUT)]
    for r in failed:
        console.print(f"[red]{escape(r.strategy)} on {escape(r.net)} {r.status}:[/]\n{escape(r.error)}")
    if results.stopped:
        console.print(f"[red]gradwire compare stopped:[/] {escape(results.stopped)}")
    return 1 if failed or results.stopped else 0
