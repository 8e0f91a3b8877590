"""`gradwire predict`: step time and scaling efficiency for 2 … 1024 ranks per strategy.

A short real run per strategy on ``loopback`` measures compute per step and
the collectives each step issues; the network model then prices those
collectives for every world size (virtual time, nothing runs).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from gradwire.cli._args import check_net_fits, input_file, output_file, positive_int

DEFAULT_WORLDS = "2,4,8,16,32,64,128,256,512,1024"


def add_parser(sub: Any) -> None:
    from gradwire.compare.config import DEFAULT_NET

    p = sub.add_parser("predict", help="predict step time and scaling efficiency on larger clusters",
                       description=__doc__.splitlines()[0])
    p.add_argument("--net", default=DEFAULT_NET, help="network spec or preset (default: %(default)s)")
    p.add_argument("--strategies", default="sync,onebit,delayed,onebit+delayed",
                   help="comma-separated composed names (default: %(default)s)")
    p.add_argument("--model", default="cnn-wide", help="model name (default: %(default)s)")
    p.add_argument("--measure-world", type=positive_int(2), default=4,
                   help="ranks of the measured run, >= 2 (default: %(default)s)")
    p.add_argument("--steps", type=positive_int(5), default=120,
                   help="steps of the measured run; shorter runs are noisier (default: %(default)s)")
    p.add_argument("--worlds", default=DEFAULT_WORLDS, help="world sizes to predict (default: %(default)s)")
    p.add_argument("--profiles", type=input_file, default=None,
                   help="read measured profiles from this JSON (written by --json) instead of measuring")
    p.add_argument("--json", type=output_file, default=None, help="write profiles and predictions here")
    p.add_argument("--plot", type=output_file, default=None,
                   help="write a PNG of step time and efficiency against world size")
    p.set_defaults(func=run)


def _worlds(text: str) -> list[int]:
    try:
        worlds = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ValueError(f"--worlds must be comma-separated integers, got {text!r}") from None
    if not worlds or min(worlds) < 2:
        raise ValueError(f"--worlds must list world sizes >= 2, got {text!r}")
    return worlds


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from gradwire.net import parse_spec
    from gradwire.overlap import parse_strategy
    from gradwire.predict import StepProfile, measure_profiles, predict_many

    net = parse_spec(args.net).to_string()
    worlds = _worlds(args.worlds)
    for n in worlds:
        check_net_fits(net, n)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        parse_strategy(s)
    if args.profiles:
        profiles = read_profiles(args.profiles)
    else:
        profiles = measure_profiles(strategies, args.model, args.measure_world, args.steps)
    preds = predict_many(profiles, net, worlds)
    console = Console(width=max(Console().width, 120))
    table = Table(title=f"predicted step time (ms) and scaling efficiency on {net}")
    table.add_column("ranks", justify="right")
    for p in profiles:
        table.add_column(p.strategy, justify="right")
    for n in worlds:
        cells = [str(n)]
        for prof in profiles:
            pr = next(x for x in preds if x.strategy == prof.strategy and x.world == n)
            cells.append(f"{pr.step_seconds * 1e3:.1f} ({pr.efficiency:.0%})")
        table.add_row(*cells)
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"net": net, "profiles": [p.as_dict() for p in profiles],
                                               "predictions": [dict(vars(p), efficiency=p.efficiency) for p in preds]},
                                              indent=1))
    if args.plot:
        _plot(preds, profiles, worlds, net, Path(args.plot))
    return 0


def read_profiles(path: Path) -> list:
    """The step profiles in a JSON file written by ``gradwire predict --json``.

    Raises ValueError saying what is wrong with the file (not JSON, no
    ``profiles`` list, a profile with missing or impossible fields).
    """
    from gradwire.net import OPS
    from gradwire.predict import StepProfile

    hint = "give a file written by gradwire predict --json"
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise ValueError(f"--profiles {str(path)!r} is not a text file; {hint}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--profiles {str(path)!r} is not JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno}); {hint}") from None
    items = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"--profiles {str(path)!r} holds no \"profiles\" list; {hint}")
    profiles = []
    for i, d in enumerate(items):
        try:
            prof = StepProfile.from_dict(d)
            _check_profile(prof, OPS)
        except (TypeError, KeyError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"--profiles {str(path)!r}: profile {i} is not a step profile ({what}); {hint}") from None
        profiles.append(prof)
    return profiles


def _check_profile(prof: Any, ops: tuple[str, ...]) -> None:
    """Raise ValueError for values a measured profile cannot have."""
    if not isinstance(prof.world, int) or prof.world < 1:
        raise ValueError(f"world must be an integer >= 1, got {prof.world!r}")
    for name in ("compute_seconds", "real_comm_seconds"):
        value = getattr(prof, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    for c in prof.collectives:
        if c.op not in ops:
            raise ValueError(f"unknown collective {c.op!r}; valid: {', '.join(ops)}")
        if not all(isinstance(v, (int, float)) and 0 <= v < math.inf for v in (c.nbytes, c.calls)):
            raise ValueError(f"collective {c.op}: nbytes and calls must be finite numbers >= 0")


def _plot(preds: list, profiles: list, worlds: list[int], net: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for prof in profiles:
        ps = [next(x for x in preds if x.strategy == prof.strategy and x.world == n) for n in worlds]
        a.plot(worlds, [p.step_seconds * 1e3 for p in ps], marker="o", ms=3, label=prof.strategy)
        b.plot(worlds, [p.efficiency for p in ps], marker="o", ms=3, label=prof.strategy)
    for ax, label in ((a, "step time (ms)"), (b, "scaling efficiency (compute / step)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(net, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
