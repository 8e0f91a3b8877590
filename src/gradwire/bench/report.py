"""Write a :class:`BenchResult`: the nccl-tests table, JSON, CSV and a plot.

The table keeps nccl-tests' columns in nccl-tests' order, so scripts that parse
``all_reduce_perf`` output read it too; the ``model(us)`` column, when a
network is modelled, comes last. Bandwidths below 1 GB/s get four decimals
instead of two: on the slow networks simulated here two would read 0.12 for
anything between 0.115 and 0.125.
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from gradwire.bench.driver import IN_PLACE, OUT_OF_PLACE, BenchResult, BenchRow
from gradwire.net.spec import NetSpec

__all__ = ["format_table", "plot", "to_dict", "write_csv", "write_json"]


def _time(us: float | None) -> str:
    if us is None:
        return "N/A"
    if us >= 10000:
        return f"{us:.0f}"
    return f"{us:.1f}" if us >= 100 else f"{us:.2f}"


def _bw(gbs: float | None) -> str:
    if gbs is None:
        return "N/A"
    return f"{gbs:.2f}" if gbs >= 1 else f"{gbs:.4f}"


def _wrong(n: int | None) -> str:
    return "N/A" if n is None else str(n)


def _header(result: BenchResult) -> list[str]:
    c = result.config
    lines = [
        f"# gradwire bench: {', '.join(c.ops)} on {result.backend}, {result.world_size} ranks",
        f"#  minBytes {c.min_bytes} maxBytes {c.max_bytes} step: {c.factor:g}(factor) "
        f"warmup iters: {c.warmup} iters: {c.iters} validation: {int(c.check)}",
    ]
    if result.net:
        how = "simulated by the gradwire backend" if result.simulated else "priced by the model only"
        lines.append(f"#  network: {result.net.to_string()} ({how}; model(us) = its price of one call)")
    if c.backend == "gradwire" and c.net is not None:  # a zero network (loopback) has no model, still a clock
        lines.append("#  clock: " + _clock_line(c.net))
    lines += ["#", "# Using devices", *(f"#  {r}" for r in result.ranks), "#"]
    return lines


def _clock_line(net: Any) -> str:
    """What a row's time is, in words: the simulated cluster clock (and its device) or this host's wall clock."""
    if net.clock != "sim":
        return "this host's wall clock (realtime: the modelled network waited out, real packets)"
    if not net.device or net.device.startswith("host"):
        return ("the simulated cluster clock (the network model's time, plus the benchmark's own tensor work as "
                "this host's thread CPU time: device=host, the default)")
    from gradwire.device import parse_device

    return ("the simulated cluster clock (the network model's time, plus a reduction's arithmetic and the "
            f"benchmark's copies on {parse_device(net.device).describe()})")


def format_table(result: BenchResult) -> str:
    """The whole report: header, then one nccl-tests table and footer per collective."""
    model = result.net is not None
    lines = _header(result)
    for op in dict.fromkeys(r.op for r in result.rows):
        rows = [r for r in result.rows if r.op == op]
        extra = ["", f" {'model':>9}", f" {'(us)':>9}"] if model else ["", "", ""]
        lines += [
            f"# Collective test: {op}",
            f"#{'':>54}{'out-of-place':>22}{'':>12}{'in-place':>22}{extra[0]}",
            f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
            + f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2 + extra[1],
            f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
            + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2 + extra[2],
        ]
        by_size: dict[int, dict[str, BenchRow]] = {}
        for r in rows:
            by_size.setdefault(r.size, {})[r.placement] = r
        for size, pair in by_size.items():
            first: BenchRow = next(iter(pair.values()))
            line = f"{size:>12}  {first.count:>12}  {first.dtype:>8}  {first.redop:>6}  {first.root:>6}"
            for placement in (OUT_OF_PLACE, IN_PLACE):
                cell = pair.get(placement)
                line += (f"  {_time(cell.time_us if cell else None):>7}  {_bw(cell.algbw if cell else None):>6}"
                         f"  {_bw(cell.busbw if cell else None):>6}  {_wrong(cell.wrong if cell else None):>6}")
            if model:
                line += f" {_time(first.model_us):>9}"
            lines.append(line)
        wrong = sum(r.wrong or 0 for r in rows)
        lines += [
            f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
            f"# Avg bus bandwidth    : {_bw(result.avg_busbw(op))}",
            "#",
        ]
    return "\n".join(lines) + "\n"


def _text(spec: NetSpec | None) -> str | None:
    """A spec as results files keep it: its string (None stays None)."""
    return None if spec is None else spec.to_string()


def to_dict(result: BenchResult, fit: Any = None) -> dict[str, Any]:
    """A JSON-ready dict: config, run facts, one entry per row, and the fit if given."""
    out = {
        "config": {**asdict(replace(result.config, net=None)), "net": _text(result.config.net)},
        "world_size": result.world_size,
        "backend": result.backend,
        "net": _text(result.net),
        "simulated": result.simulated,
        "wrong": result.wrong,
        "rows": [asdict(r) for r in result.rows],
    }
    if fit is not None:
        out["fit"] = fit.to_dict()
    return out


def write_json(result: BenchResult, path: str | Path, fit: Any = None) -> Path:
    """Write :func:`to_dict` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_dict(result, fit), indent=2) + "\n")
    return path


def write_csv(result: BenchResult, path: str | Path) -> Path:
    """One CSV line per op, size and placement, columns named as :class:`BenchRow` fields."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = ["backend", "world_size", *(f.name for f in fields(BenchRow))]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for r in result.rows:
            writer.writerow({"backend": result.backend, "world_size": result.world_size, **asdict(r)})
    return path


def plot(result: BenchResult, path: str | Path) -> Path:
    """Time and busbw against size: measured (both placements) and, if modelled, the model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, op in enumerate(dict.fromkeys(r.op for r in result.rows)):
        color = colors[i % len(colors)]
        for placement, marker, style in ((OUT_OF_PLACE, "o", "-"), (IN_PLACE, "x", ":")):
            rows = [r for r in result.rows if r.op == op and r.placement == placement and r.time_us is not None]
            if rows:
                sizes = [r.size for r in rows]
                label = f"{op} {placement}"
                ax_t.plot(sizes, [r.time_us for r in rows], marker=marker, linestyle=style, color=color, label=label)
                ax_b.plot(sizes, [r.busbw for r in rows], marker=marker, linestyle=style, color=color, label=label)
        model = [r for r in result.rows if r.op == op and r.placement == OUT_OF_PLACE and r.model_us]
        if model:
            factor = {r.size: (r.busbw / r.algbw if r.algbw else 0.0) for r in result.rows
                      if r.op == op and r.busbw is not None}
            sizes = [r.size for r in model]
            model_us = [float(r.model_us or 0.0) for r in model]
            ax_t.plot(sizes, model_us, "--", color=color, alpha=0.6, label=f"{op} model")
            ax_b.plot(sizes, [size / (us * 1e3) * factor.get(size, 0.0) if us else 0.0
                              for size, us in zip(sizes, model_us)],
                      "--", color=color, alpha=0.6, label=f"{op} model")
    net = f", net {result.net.to_string()}" if result.net else ""
    title = f"{result.backend}, {result.world_size} ranks{net}"
    ax_t.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="time per call (us)", title=title)
    ax_b.set(xscale="log", xlabel="size (bytes)", ylabel="bus bandwidth (GB/s)", title=title)
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
