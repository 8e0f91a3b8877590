"""Plots of a comparison: the metric over training time, and where each step's time goes."""
from __future__ import annotations

from pathlib import Path

from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.report import Row, metric_name
from gradwire.compare.results import Results

__all__ = ["plot_accuracy", "plot_breakdown", "plot_metric"]


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metric(results: Results, path: Path) -> Path:
    """The table's metric against training time, mean over seeds, one line per strategy.

    A metric recorded at different times in different seeds is averaged point
    by point (the i-th value of every seed), up to the shortest seed.
    """
    plt = _plt()
    metric = metric_name(results)
    nets = list(dict.fromkeys(r.net for r in results.runs if r.strategy != COMPUTE_ONLY))
    fig, axes = plt.subplots(1, len(nets), figsize=(6 * len(nets), 4.2), squeeze=False)
    for ax, net in zip(axes[0], nets):
        for run in results.runs:
            if not run.ok or (run.net != net and run.strategy != COMPUTE_ONLY):
                continue
            curves = [s.curves[metric] for s in run.seeds if metric in s.curves and s.curves[metric].values]
            if not curves:
                continue
            n = min(len(c.values) for c in curves)
            t = [sum(c.seconds[i] for c in curves) / len(curves) for i in range(n)]
            v = [sum(c.values[i] for c in curves) / len(curves) for i in range(n)]
            style = ":" if run.strategy == COMPUTE_ONLY else "-"
            ax.plot(t, v, style, marker="o" if n < 40 else None, ms=3, label=run.strategy)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy" if metric == "test_accuracy" else metric)
        ax.set_title(net, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: the bundled models' plot keeps its name
plot_accuracy = plot_metric


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
