"""Predicted against measured speedup, per strategy and network, in one `gradwire compare` run.

`gradwire compare` predicts each strategy's speedup at every network it
measures, replaying the same trainings on the step model from the
compute-only run's compute and a calibration of this host taken after the
runs (:mod:`gradwire.compare.crossover`). This runs the default comparison
(2 ranks, the digits CNN, 500 Mbit/s / 100 us and 10 Gbit/s / 20 us; sync,
onebit, delayed, onebit+delayed, torch-fp16, torch-powersgd:4; 3 seeds)
from this checkout and reports, per network and strategy, the measured
speedup over sync, the predicted one and the error (predicted / measured -
1), and the mean step measured against the one predicted, sync's included.
Judged: every strategy within ``--within`` (10%) on every network.

Writes benchmarks/results/predict_compare.json (rows and summary) and keeps
the run's table.md and results.json in benchmarks/results/predict_compare/.
Examples::

    python benchmarks/predict_compare.py                 # the default comparison, about 5 minutes
    python benchmarks/predict_compare.py --from DIR      # score a comparison already run (its --out)
    python benchmarks/predict_compare.py -- --seeds 1    # extra arguments for gradwire compare
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import ROOT, write_results

OUT = Path(__file__).parent / "results" / "predict_compare.json"
KEPT = Path(__file__).parent / "results" / "predict_compare"


def _run_compare(out: Path, extra: list[str]) -> dict[str, Any]:
    """`gradwire compare` from this checkout's source into ``out``; its wall time and the load before it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gradwire", "compare", "--out", str(out), *extra], check=True, env=env,
                   cwd=ROOT)
    return {"wall_s": round(time.perf_counter() - start, 1), "load_before": round(load, 2)}


def score(results: dict[str, Any], within: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of (net, strategy): measured and predicted speedup and step, the errors; and the summary."""
    predicted = results.get("predicted") or {}
    steps_ms = predicted.get("step_ms_at_nets", {})
    epochs = results["config"].get("epochs")
    rows = []
    for r in results["rows"]:
        if r["strategy"] == "compute-only" or r["status"] not in ("ok", "unsound"):
            continue
        predicted_step = steps_ms.get(r["net"], {}).get(r["strategy"])
        measured_step = None
        if r.get("epoch_seconds") and epochs:
            run = next(x for x in results["runs"] if x["net"] == r["net"] and x["strategy"] == r["strategy"])
            steps = sum(len(s["step_seconds"]) for s in run["seeds"]) / len(run["seeds"])
            measured_step = r["epoch_seconds"] * epochs / steps * 1e3  # the table's time, per step
        row = {"net": r["net"], "strategy": r["strategy"], "measured": r["speedup"],
               "predicted": r.get("predicted_speedup"), "measured_step_ms": measured_step,
               "predicted_step_ms": predicted_step}
        row["error"] = None if row["predicted"] is None else row["predicted"] / row["measured"] - 1
        if measured_step and predicted_step:
            row["step_error"] = predicted_step / measured_step - 1
        rows.append(row)
    judged = [r for r in rows if r["error"] is not None]
    worst = max(judged, key=lambda r: abs(r["error"]), default=None)
    summary = {
        "within": within,
        "all_within": bool(judged) and all(abs(r["error"]) <= within for r in judged),
        "outside": [f"{r['strategy']} on {r['net']}: {r['error']:+.1%}" for r in judged if abs(r["error"]) > within],
        "worst": None if worst is None else {"strategy": worst["strategy"], "net": worst["net"],
                                             "error": worst["error"]},
        "calibration": {k: predicted.get("calibration", {}).get(k) for k in ("scale", "load", "compute", "shares",
                                                                              "busy_cores")},
    }
    return rows, summary


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'network':34} {'strategy':18} {'measured':>9} {'predicted':>9} {'error':>7}   step ms measured / predicted")
    for r in rows:
        err = "" if r["error"] is None else f"{r['error']:+.1%}"
        pred = "" if r["predicted"] is None else f"{r['predicted']:.3f}"
        steps = (f"{r['measured_step_ms']:.1f} / {r['predicted_step_ms']:.1f} ({r['step_error']:+.1%})"
                 if r.get("step_error") is not None else "")
        print(f"{r['net']:34} {r['strategy']:18} {r['measured']:9.3f} {pred:>9} {err:>7}   {steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="a comparison's --out folder to score instead of running one")
    parser.add_argument("--within", type=float, default=0.10, help="the error judged (default: %(default)s)")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: arguments for gradwire compare")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    run: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.source or Path(tmp) / "compare"
        if args.source is None:
            run = _run_compare(folder, extra)
        results = json.loads((folder / "results.json").read_text())
        KEPT.mkdir(parents=True, exist_ok=True)
        for name in ("results.json", "table.md", "bandwidth.png"):
            if (folder / name).exists() and (folder / name).resolve() != (KEPT / name).resolve():
                shutil.copy(folder / name, KEPT / name)
    rows, summary = score(results, args.within)
    _print(rows)
    print(f"within {args.within:.0%} everywhere: {summary['all_within']}" +
          (f"; outside: {'; '.join(summary['outside'])}" if summary["outside"] else ""))
    write_results(OUT, rows, **run, **summary)


if __name__ == "__main__":
    main()
