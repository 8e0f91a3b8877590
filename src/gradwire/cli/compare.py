"""`gradwire compare`: train a real model under every strategy and network; table, JSON, plots.

With no arguments it runs the default experiment: the digits CNN (wide) on 4
workers on the default network, baseline vs onebit, delayed, onebit+delayed and
PyTorch's fp16 and PowerSGD hooks, 3 seeds each, plus a compute-only run.
The strategies take turns in one set of worker processes (round k: every
strategy on seed k), so a machine that drifts shifts them all alike.

Ctrl-C stops it with one line: the trainings that finished are kept in
``results.json``, the runs that did not finish are marked ``"finished": false``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gradwire.cli._args import check_net_fits, output_dir, positive_int


def add_parser(sub: Any) -> None:
    from gradwire.compare.config import DEFAULT_NET, DEFAULT_STRATEGIES, CompareConfig

    d = CompareConfig.__dataclass_fields__
    p = sub.add_parser("compare", help="measure every strategy on real training (the main job)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--net", action="append", default=None,
                   help=f"network spec or preset; repeat for a sweep (default: {DEFAULT_NET})")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help="comma-separated composed names; the first is the baseline (default: %(default)s)")
    p.add_argument("--workers", type=positive_int(2, 16), default=d["workers"].default, help="ranks per run (default: %(default)s)")
    p.add_argument("--model", default=d["model"].default, help="model name (default: %(default)s)")
    p.add_argument("--epochs", type=positive_int(1), default=d["epochs"].default, help="(default: %(default)s)")
    p.add_argument("--seeds", type=positive_int(1), default=len(d["seeds"].default), help="number of seeds, 0..N-1 (default: %(default)s)")
    p.add_argument("--batch-size", type=positive_int(1), default=d["batch_size"].default, help="per worker (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d["lr"].default, help="(default: %(default)s)")
    p.add_argument("--target", type=float, default=d["target_accuracy"].default,
                   help="test accuracy for time-to-accuracy (default: %(default)s)")
    p.add_argument("--out", type=output_dir, default="gradwire-compare",
                   help="output folder, created if missing (default: %(default)s)")
    p.add_argument("--no-interleave", dest="interleave", action="store_false",
                   help="run each strategy in processes of its own, one after another (default: take turns)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gradwire.compare import CompareConfig, print_table, rows_of, run_compare, to_markdown
    from gradwire.compare.config import DEFAULT_NET
    from gradwire.compare.plots import plot_accuracy, plot_breakdown

    cfg = CompareConfig(
        nets=tuple(args.net or [DEFAULT_NET]),
        strategies=tuple(s.strip() for s in args.strategies.split(",") if s.strip()),
        workers=args.workers, model=args.model, epochs=args.epochs, seeds=tuple(range(args.seeds)),
        batch_size=args.batch_size, lr=args.lr, target_accuracy=args.target, out=Path(args.out),
        interleave=args.interleave,
    )
    for net in cfg.nets:
        check_net_fits(net, cfg.workers)
    console = Console(stderr=True)
    total = (1 + len(cfg.nets) * len(cfg.strategies)) * len(cfg.seeds)
    trained = [0]
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} trainings"), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("compare", total=total)

            def done(t: dict) -> None:
                trained[0] += t["ok"]
                status = "ok" if t["ok"] else f"FAILED (its {t['dropped']} other seeds dropped)"
                line = f"  {t['strategy']:<22} {t['net']:<36} seed {t['seed']}  {status} ({t['seconds']:.0f} s)"
                progress.console.print(line)
                progress.advance(task, 1 + t.get("dropped", 0))

            results = run_compare(cfg, on_training=done)
    except KeyboardInterrupt:
        print(f"gradwire compare: interrupted; {trained[0]} of {total} trainings finished and kept in "
              f"{cfg.out / 'results.json'} (unfinished runs marked \"finished\": false)", file=sys.stderr)
        return 130
    rows = rows_of(results)
    print_table(rows, cfg.target_accuracy)
    out = Path(cfg.out)
    results["rows"] = [r.as_dict() for r in rows]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(to_markdown(rows, cfg.target_accuracy))
    plot_accuracy(results, out / "accuracy.png")
    plot_breakdown(rows, out / "breakdown.png")
    console.print(f"results: {out / 'results.json'}, {out / 'table.md'}, {out / 'accuracy.png'}, {out / 'breakdown.png'}")
    failed = [r for r in results["runs"] if not r["ok"]]
    for r in failed:
        console.print(f"[red]{r['strategy']} on {r['net']} failed:[/]\n{r['error']}")
    return 1 if failed else 0
