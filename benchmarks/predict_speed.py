"""How long `gradwire predict` takes for a 100-bucket model: 6 strategies x 3 networks x 2 ... 1024 ranks.

The model is described, not run (``--model benchmarks/predict_speed.py:model``):
100 linear layers of 2560 x 2560 on the meta device (655 M parameters, DDP's
default buckets: one 25 MiB layer each). Times the whole command in a fresh
process (imports, the meta model, measuring the compressors' CPU time, every
prediction and the ratio column, the tables), ``--repeats`` times, and the
sweep alone in this process. Writes benchmarks/results/predict_speed.json.

    python benchmarks/predict_speed.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from torch import nn

from _results import write_results

HERE = Path(__file__).resolve().parent
STRATEGIES = "sync,fp16,onebit,delayed,onebit+delayed,powersgd:4"
NETS = ["10gbe", "25gbe,topology=1x8,intra=nvlink", "100gbe,topology=1x8,intra=nvlink,algorithm=hierarchical"]


def model() -> nn.Module:
    """100 layers of 2560 x 2560 (+ bias): one DDP bucket each."""
    return nn.Sequential(*[nn.Linear(2560, 2560) for _ in range(100)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "gradwire.cli.main", "predict", "--model", f"{Path(__file__).resolve()}:model",
           "--compute-ms", "300", "--strategies", STRATEGIES, "--batch-size", "8"]
    for net in NETS:
        cmd += ["--net", net]
    walls = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, COLUMNS="200"))
        walls.append(time.perf_counter() - start)
    from gradwire.predict import default_worlds, sweep
    from gradwire.predict.describe import describe_model
    from gradwire.predict.plans import exchange_cost

    prof = describe_model(f"{Path(__file__).resolve()}:model", 300.0)
    strategies = STRATEGIES.split(",")
    costs = {s: exchange_cost(s) for s in strategies}
    start = time.perf_counter()
    preds, ratios = sweep(lambda s: prof, strategies, NETS, default_worlds, costs.__getitem__)
    sweep_s = time.perf_counter() - start
    load = os.getloadavg()
    result = {"timed_command": " ".join(cmd[2:]), "buckets": len(prof.buckets), "predictions": len(preds),
              "ratio_cells": len(ratios), "command_seconds": walls, "command_median_s": statistics.median(walls),
              "sweep_seconds": sweep_s}
    print(f"{len(prof.buckets)} buckets, {len(preds)} predictions + {len(ratios)} ratio cells: command "
          f"{statistics.median(walls):.2f} s (median of {len(walls)}), sweep alone {sweep_s:.2f} s; load {load[0]:.1f}")
    write_results(HERE / "results" / "predict_speed.json", [], **result)


if __name__ == "__main__":
    main()
