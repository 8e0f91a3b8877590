"""Small model, small buckets: is a compressed exchange ever slower than sync where sync waits on the network?

`gradwire compare -- torchrun --nproc-per-node 2 examples/small_adamw.py` (a 28 k-parameter residual MLP,
AdamW, ``bucket_cap_mb=0.01``: six buckets of 12-23 KB per step) on simulated networks where sync waits on
the network for much of its step, under sync, onebit (small buckets fused into one exchange, the default),
``onebit:fuse=0`` (each bucket its own exchange, as before fusion), int8 and onebit+delayed, over several
seeds. Each network's rows go to ``results/small_model.json`` with sync's share of the step spent not
computing (1 - compute-only / sync) and each strategy's speedup and accuracy; the check: where sync waits
40% of its step or more, onebit is not slower than sync.

    python benchmarks/small_model.py                       # 200 and 500 Mbit/s, 3 seeds (~10 min here)
    python benchmarks/small_model.py --nets bandwidth=200mbit --seeds 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import ROOT, write_results

STRATEGIES = "sync,onebit,onebit:fuse=0,int8,onebit+delayed"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default="bandwidth=200mbit;bandwidth=500mbit", help="networks, ';'-separated")
    p.add_argument("--strategies", default=STRATEGIES)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/small_model.json"))
    args = p.parse_args()

    rows, checks = [], []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:  # what the script writes stays out of the repository
        runs = Path(work) / "compare"
        nets = [a for net in args.nets.split(";") for a in ("--net", net)]
        cmd = [sys.executable, "-m", "gradwire", "compare", *nets, "--strategies", args.strategies,
               "--seeds", str(args.seeds), "--metric", "test_accuracy", "--out", str(runs), "--",
               "torchrun", "--nproc-per-node", "2", str(ROOT / "examples/small_adamw.py"), "--seed", "{seed}"]
        subprocess.run(cmd, cwd=work, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        result = json.loads((runs / "results.json").read_text())
    for net in dict.fromkeys(r["net"] for r in result["rows"]):
        mine = {r["strategy"]: r for r in result["rows"] if r["net"] == net}
        sync, ideal = mine["sync"], mine.get("compute-only")
        waits = 1 - ideal["step_ms"] / sync["step_ms"] if ideal and ideal.get("step_ms") else None
        for name, r in mine.items():
            rows.append({"net": net, "strategy": name, "status": r["status"], "step_ms": r["step_ms"],
                         "speedup": r["speedup"], "wire_kib_per_step": _kib(r["wire_mb_per_step"]),
                         "reduction": r["reduction"], "accuracy_mean": r["metric_mean"],
                         "accuracy_min": r["metric_min"], "accuracy_max": r["metric_max"], "seeds": r["seeds"]})
        onebit = mine.get("onebit")
        if waits is not None and onebit is not None and onebit.get("speedup") is not None:
            checks.append({"net": net, "sync_waits_share": round(waits, 3), "onebit_speedup": onebit["speedup"],
                           "onebit_fuse0_speedup": (mine.get("onebit:fuse=0") or {}).get("speedup"),
                           "holds": waits < 0.4 or onebit["speedup"] >= 1.0})
    for c in checks:
        print(json.dumps(c))
    write_results(args.out, rows, checks=checks, wall_s=round(time.perf_counter() - started, 1),
                  strategies=args.strategies, seeds=args.seeds)


def _kib(mb: float | None) -> float | None:
    return None if mb is None else round(mb * 1e6 / 1024, 1)


if __name__ == "__main__":
    main()
