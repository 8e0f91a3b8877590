"""Plots of a comparison: accuracy over wall time, and where each step's time goes."""
from __future__ import annotations

from itertools import accumulate
from pathlib import Path

from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.report import Row

__all__ = ["plot_accuracy", "plot_breakdown"]


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(results: dict, path: Path) -> Path:
    """Test accuracy against cumulative training time, mean over seeds, one line per strategy."""
    plt = _plt()
    nets = list(dict.fromkeys(r["net"] for r in results["runs"] if r["strategy"] != COMPUTE_ONLY))
    fig, axes = plt.subplots(1, len(nets), figsize=(6 * len(nets), 4.2), squeeze=False)
    for ax, net in zip(axes[0], nets):
        for run in results["runs"]:
            if not run["ok"] or (run["net"] != net and run["strategy"] != COMPUTE_ONLY):
                continue
            seeds = run["seeds"]
            n = min(len(s["epoch_seconds"]) for s in seeds)
            t = [sum(x) / len(seeds) for x in zip(*[list(accumulate(s["epoch_seconds"][:n])) for s in seeds])]
            a = [sum(x) / len(seeds) for x in zip(*[s["epoch_accuracy"][:n] for s in seeds])]
            style = ":" if run["strategy"] == COMPUTE_ONLY else "-"
            ax.plot(t, a, style, marker="o", ms=3, label=run["strategy"])
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_title(net, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_breakdown(rows: list[Row], path: Path) -> Path:
    """Stacked bars per strategy: compute / strategy overhead / exposed communication (ms per step)."""
    plt = _plt()
    nets = list(dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY))
    fig, axes = plt.subplots(1, len(nets), figsize=(6 * len(nets), 4.2), squeeze=False)
    for ax, net in zip(axes[0], nets):
        sel = [r for r in rows if r.ok and (r.net == net or r.strategy == COMPUTE_ONLY)]
        names = [r.strategy for r in sel]
        comp = [r.compute_ms for r in sel]
        over = [r.overhead_ms for r in sel]
        expo = [r.exposed_ms for r in sel]
        ax.bar(names, comp, label="compute")
        ax.bar(names, over, bottom=comp, label="strategy overhead (compression, copies, shared cores)")
        ax.bar(names, expo, bottom=[c + o for c, o in zip(comp, over)], label="exposed communication")
        ax.set_ylabel("ms per step")
        ax.set_title(net, fontsize=9)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
