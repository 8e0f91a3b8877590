"""Plots of a comparison: the metric over training time, and where each step's time goes."""
from __future__ import annotations

import math
from pathlib import Path

from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.report import Row, metric_name
from gradwire.compare.results import UNSOUND, Results, network_of

__all__ = ["plot_accuracy", "plot_bandwidth", "plot_breakdown", "plot_metric"]


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
        _shade_conditions(ax, net)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy" if metric == "test_accuracy" else metric)
        ax.set_title(net, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a network where no run finished has nothing to name
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: the bundled models' plot keeps its name
plot_accuracy = plot_metric


def _shade_conditions(ax, net: str) -> None:  # type: ignore[no-untyped-def]
    """On a network that changes, shade the stretches where its link is slower than specified (grey: down).

    The schedule's t = 0 is each training's process group creation, just before its first step: the time
    axis of the training, to a fraction of a second.
    """
    from gradwire.net.schedule import Schedule

    spec = network_of(net)
    if spec is None or not spec.events:
        return
    right = ax.get_xlim()[1]
    t, labelled = 0.0, set()
    for end, cond in Schedule(spec.events).segments(0.0, spec.bandwidth):
        slower = cond.down or (cond.bandwidth is not None and cond.bandwidth < spec.bandwidth) or bool(cond.links)
        if slower:
            label = "link down" if cond.down else "link slower"
            ax.axvspan(t, min(end, right), color="0.55" if cond.down else "tab:red", alpha=0.15, lw=0,
                       label=None if label in labelled else label)
            labelled.add(label)
        t = end
        if t >= right:
            break
    ax.set_xlim(right=right)


def plot_breakdown(rows: list[Row], path: Path) -> Path:
    """Stacked bars per strategy: compute / strategy overhead / exposed communication / other waits (ms per step)."""
    plt = _plt()
    nets = list(dict.fromkeys(r.net for r in rows if r.strategy != COMPUTE_ONLY))
    fig, axes = plt.subplots(1, len(nets), figsize=(6 * len(nets), 4.2), squeeze=False)
    for ax, net in zip(axes[0], nets):
        sel = [r for r in rows if (r.ok or r.status == UNSOUND) and r.net == net]  # an unsound row's time stands
        names = [r.strategy + (" (unsound)" if r.status == UNSOUND else "") for r in sel]
        comp = [r.compute_ms for r in sel]
        over = [r.overhead_ms for r in sel]
        expo = [r.exposed_ms for r in sel]
        peer = [0.0 if math.isnan(r.peer_wait_ms) else r.peer_wait_ms for r in sel]
        ax.bar(names, comp, label="compute")
        ax.bar(names, over, bottom=comp, label="strategy overhead (compression, copies, shared cores)")
        below = [c + o for c, o in zip(comp, over)]
        ax.bar(names, expo, bottom=below, label="exposed communication (the network)")
        ax.bar(names, peer, bottom=[b + e for b, e in zip(below, expo)], label="other waits (a late peer, the real collective, callbacks)")
        ax.set_ylabel("ms per step")
        ax.set_title(net, fontsize=9)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bits(net: str) -> float:
    spec = network_of(net)
    return math.nan if spec is None else spec.bandwidth


def plot_bandwidth(predicted: dict, rows: list[Row], path: Path) -> Path:
    """Predicted speedup over the baseline against bandwidth, one line per strategy, crossovers marked.

    ``predicted`` is :meth:`gradwire.compare.crossover.SpeedupCurves.as_dict`;
    the measured speedups of ``rows`` are drawn as points of the same colour.
    """
    from gradwire.compare.crossover import rate

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    gbit = [b / 1e9 for b in predicted["bandwidths"]]
    for name, speedups in predicted["speedups"].items():
        (line,) = ax.plot(gbit, speedups, label=name)
        at = predicted["crossovers"].get(name)
        if at is not None:
            ax.axvline(at / 1e9, color=line.get_color(), ls=":", lw=1)
            ax.annotate(f"{rate(at)}", (at / 1e9, 1.0), textcoords="offset points", xytext=(3, 6),
                        fontsize=7, color=line.get_color(), rotation=90)
        measured = [(_bits(r.net) / 1e9, r.speedup) for r in rows
                    if r.strategy == name and r.ok and not math.isnan(r.speedup) and math.isfinite(_bits(r.net))]
        if measured:
            ax.plot(*zip(*measured), "o", color=line.get_color(), ms=6, mec="black")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.set_xlabel("bandwidth (Gbit/s)")
    ax.set_ylabel(f"speedup over {predicted['baseline']}")
    ax.set_title(f"predicted on {predicted['world']} ranks, the measured step ({predicted['compute_ms']:.1f} ms "
                 f"compute); dots: measured; dotted: crossover, below which a strategy pays", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
