"""Figures and a summary of ``benchmarks/wan_diloco.sh``: val loss against wall time and against bytes, per network.

    python benchmarks/wan_diloco_plot.py benchmarks/results/wan_diloco

Reads the comparison's ``results.json``; writes ``loss_time.png``, ``loss_bytes.png`` and ``summary.json``
(through ``_results.write_results``: the rows of the table, each with what the issue asks of it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

from gradwire.compare.config import COMPUTE_ONLY  # noqa: E402
from gradwire.compare.report import rows_of, to_markdown  # noqa: E402
from gradwire.compare.results import Results  # noqa: E402


def _plot(results: Results, rows: dict, x: str, path: Path) -> None:
    nets = list(dict.fromkeys(r.net for r in results.runs if r.strategy != COMPUTE_ONLY))
    fig, axes = plt.subplots(1, len(nets), figsize=(5.5 * len(nets), 4.2), squeeze=False)
    for ax, net in zip(axes[0], nets):
        for run in results.runs:
            if run.net != net or not run.seeds:
                continue
            for k, seed in enumerate(run.seeds):
                curve = seed.curves.get("val_loss")
                if curve is None:
                    continue
                xs = (curve.seconds if x == "time" else
                      [seed.bytes_until(s) / 2**20 for s in curve.steps])
                ax.plot(xs, curve.values, marker=".", label=run.strategy if k == 0 else None)
        target = next((r["target"] for r in rows.values() if r["net"] == net and r.get("target")), None)
        if target is not None:
            ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:.3f} (sync +2%)")
        ax.set_xscale("log" if x == "bytes" else "linear")
        ax.set_xlabel("training time (s)" if x == "time" else "MiB one rank put on the wire (log)")
        ax.set_ylabel("val loss")
        ax.set_ylim(0.3, 1.2)
        ax.set_title(net, fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/wan_diloco")
    raw = json.loads((out / "results.json").read_text())
    results = Results.from_json(raw)
    if not raw.get("rows"):  # a comparison stopped early: the table of the runs that finished
        results.runs = [run for run in results.runs if run.finished]
        results.rows = rows_of(results)
        (out / "table.md").write_text(to_markdown(results.rows, None))
        raw["rows"] = [r.as_dict() for r in results.rows]
    rows = {(r["net"], r["strategy"]): r for r in raw["rows"]}
    _plot(results, rows, "time", out / "loss_time.png")
    _plot(results, rows, "bytes", out / "loss_bytes.png")
    keep = ("net", "strategy", "status", "step_ms", "speedup", "metric_mean", "metric_min", "metric_max",
            "vs_baseline", "target", "time_to_target", "reached", "seeds", "sooner", "bytes_to_target",
            "fewer_bytes_to_target", "wire_mb_per_step", "peak_kib_per_step", "reduction", "error")
    write_results(out / "summary.json", [{k: r.get(k) for k in keep} for r in rows.values()],
                  command=f"bash benchmarks/wan_diloco.sh (figures: python benchmarks/wan_diloco_plot.py {out})",
                  load=(out / "load.txt").read_text() if (out / "load.txt").exists() else "")


if __name__ == "__main__":
    main()
