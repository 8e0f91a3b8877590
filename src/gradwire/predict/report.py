"""What ``gradwire predict`` shows: a table per network, a plot of efficiency against ranks, saved profiles.

Pure presentation of :class:`~gradwire.predict.model.Prediction` objects
(rich for the tables, matplotlib for the plot); the command line only calls
it. On a network that changes (``drop=``, ``trace=``...) each cell adds the
step's 50th and 95th percentile and its longest over the replayed schedule.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["plot", "read_profiles", "report"]


def _ratio_text(r: float | str) -> str:
    return r if isinstance(r, str) else f"{r:.3g}x"


def _rate(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def report(preds: dict, ratios: dict, strategies: list[str], nets: list[str], worlds: dict[str, list[int]],
           target: float, base: Any) -> None:
    """One table per network: step, efficiency and throughput per strategy; the ratio needed."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120), emoji=False)
    unit = "optimizer steps/s" + (", samples/s" if base.batch_size else "; --batch-size for samples/s")
    micro = (f"{base.accumulate} micro-steps: {base.accumulate - 1} x {base.micro_seconds * 1e3:.2f} not "
             "synchronising, then " if base.accumulate > 1 else "")
    console.print(f"{base.name}: {base.compute_seconds * 1e3:.2f} ms of compute per optimizer step ({micro}forward "
                  f"{base.forward * 1e3:.2f}, backward {base.backward * 1e3:.2f}, optimizer "
                  f"{base.optimizer * 1e3:.2f}), {len(base.buckets)} buckets, "
                  f"{base.gradient_bytes / 2**20:.1f} MiB of gradients; " + "; ".join(base.notes), highlight=False)
    for net in nets:
        table = Table(title=f"{net}: step time, scaling efficiency, throughput ({unit})")
        table.add_column("ranks", justify="right")
        for s in strategies:
            table.add_column(s, justify="right")
        table.add_column(f"ratio for {target:.0%}", justify="right")
        for n in worlds[net]:
            row = [str(n)]
            for s in strategies:
                p = preds[(net, n, s)]
                cell = f"{p.step_seconds * 1e3:.1f} ms\n{p.efficiency:.0%}\n{_rate(p.steps_per_second)} steps/s"
                if p.batch_size:
                    cell += f"\n{_rate(p.throughput)} samples/s"
                if p.percentiles is not None:
                    p50, p95, longest = (x * 1e3 for x in p.percentiles)
                    cell += f"\np50 {p50:.1f} / p95 {p95:.1f}\nmax {longest:.1f} ms"
                row.append(cell)
            row.append(_ratio_text(ratios.get((net, n), "-")))
            table.add_row(*row)
        console.print(table)


def plot(preds: dict, strategies: list[str], nets: list[str], target: float, path: Path) -> None:
    """Scaling efficiency against world size: one panel per network, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(nets), figsize=(5.5 * len(nets), 4), squeeze=False)
    for ax, net in zip(axes[0], nets):
        for s in strategies:
            ps = sorted((p for (pn, _, ps_), p in preds.items() if pn == net and ps_ == s), key=lambda p: p.world)
            ax.plot([p.world for p in ps], [p.efficiency for p in ps], marker="o", ms=3, label=s)
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("ranks")
        ax.set_ylabel("scaling efficiency (compute / step)")
        ax.set_title(net, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_profiles(path: Path) -> dict[str, Any]:
    """The step profiles in a JSON file written by ``gradwire predict --json``, by strategy.

    Raises ValueError saying what is wrong with the file (not JSON, no
    ``profiles`` object, a profile with missing or impossible fields).
    """
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
    if not isinstance(items, dict) or not items:
        raise ValueError(f"--profiles {str(path)!r} holds no \"profiles\" object; {hint}")
    profiles = {}
    for key, d in items.items():
        try:
            profiles[key] = StepProfile.from_dict(d)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"--profiles {str(path)!r}: profile {key!r} is not a step profile ({what}); "
                             f"{hint}") from None
    if "*" not in profiles:
        profiles["*"] = profiles.get("sync") or next(iter(profiles.values()))
    return profiles
