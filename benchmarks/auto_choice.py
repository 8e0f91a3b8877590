"""``auto`` against every fixed strategy of its family, on the networks where each of them wins or loses.

Comparisons, each one `gradwire compare` from a scratch folder:

1. ``default``: the default model and networks (500 Mbit/s and 10 Gbit/s) under sync, onebit, torch-fp16,
   auto, delayed, onebit+delayed and auto+delayed;
2. ``small``: examples/small_adamw.py (28 k parameters, 10 KB buckets, AdamW) on 200 Mbit/s under sync,
   onebit, int8 and auto, 20 epochs of 50 steps (its default of 4, 1.6 s of 8 ms steps on this host, read
   the twin's ratio at 0.60-1.17 over 10 seeds: one step's median over 20 swings twofold within a run on
   2 busy cores, and 200 steps average few such swings);
3. ``changing``: the small CNN (``--model cnn``, 38 k parameters, 300 epochs) on 1 Gbit/s whose
   bandwidth drops to 100 Mbit/s for 4 s of every 8 s, under sync, fp16, onebit and auto (on the default
   model onebit is the fastest on both links, so no switch could beat it; on this one sync is the fastest
   on the fast link and a compressor on the slow one). The drops are in seconds and the run in epochs:
   300 epochs last 25-30 s at this host's 0.08-0.09 s per epoch of sync, three drops (its 120 epochs
   before lasted 18-25 s when an epoch took 0.15-0.2 s, and 10 s since: one drop, reached in the run's
   last seconds, so auto's time was its first pass over both links and no recall of a link it had met);
   ``changing-10g`` the default model from 10 Gbit/s (where sync wins between the drops and onebit
   during them);
4. ``long``: the default comparison's sync family trained 40 epochs instead of 10 (what auto's fixed cost,
   its first decision and the steps before it, weighs in a longer run).

Per network: auto's speedup against the best fixed strategy of its family (sync's family: sync and the
compressors under sync; delayed's: delayed alone and with a compressor), auto's accuracy against sync's seeds, and
what auto chose. The default and small runs also train ``onebit:warmup=1``, onebit under another name: its
ratio to onebit is what a tie reads as in that run. Results: ``results/auto_choice.json``.

Paired seeds: compare trains seed ``k`` of every strategy in one round of the same processes, so each
seed gives one ratio (the best fixed strategy's time of that seed over auto's), and the rounds' ratios
are what the noise of one training is measured by. ``paired`` is their geometric mean with a 95%
bootstrap interval; with ``--seeds 12`` the twin's interval says how close to 1 a tie can be told.

    python benchmarks/auto_choice.py                       # every comparison, 2 seeds
    python benchmarks/auto_choice.py --only small --seeds 1
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _results import ROOT, write_results

#: a twin of a fixed strategy (the same exchange under another name: onebit's warm-up is one step either way):
#: its ratio to the original says what a tie reads as in the same run (the noise floor of "auto / best fixed"),
#: and it is never a "best fixed" itself
CONTROL = "onebit:warmup=1"
RUNS = {
    "default": (["--strategies", f"sync,onebit,torch-fp16,auto,delayed,onebit+delayed,auto+delayed,{CONTROL}"],
                None),
    "small": (["--net", "bandwidth=200mbit", "--strategies", f"sync,onebit,int8,auto,{CONTROL}", "--metric",
               "test_accuracy"], ["torchrun", "--nproc-per-node", "2", str(ROOT / "examples/small_adamw.py"),
                                  "--epochs", "20", "--seed", "{seed}"]),
    "changing": (["--model", "cnn", "--epochs", "300", "--net",
                  "bandwidth=1gbit,latency=100us,drop=100mbit:for=4s:every=8s",
                  "--strategies", "sync,fp16,onebit,auto"], None),
    "long": (["--epochs", "40", "--strategies", f"sync,onebit,torch-fp16,auto,{CONTROL}"], None),
    "changing-10g": (["--net", "bandwidth=10gbit,latency=20us,drop=100mbit:for=4s:every=8s", "--strategies",
                      "sync,fp16,onebit,auto"], None),
}


def family(strategy: str) -> str:
    """The strategy after the ``+``; ``delayed`` for plain delayed (its uncompressed member); else ``sync``
    (sync, a compressor under sync, PyTorch's hooks)."""
    if "+" in strategy:
        return strategy.split("+", 1)[1]
    return "delayed" if strategy.split(":")[0] == "delayed" else "sync"


def seed_times(result: dict, strategy: str, net: str) -> dict[int, float]:
    """Seconds per unit of each seed of ``strategy`` on ``net``: per epoch (bundled models) or per step."""
    for run in result["runs"]:
        if run["strategy"] == strategy and run["net"] == net and run.get("ok"):
            return {s["seed"]: (float(np.mean(s["epoch_seconds"])) if s.get("epoch_seconds")
                                else float(np.mean(s["step_seconds"]))) for s in run["seeds"]}
    return {}


def paired(result: dict, net: str, strategy: str, against: str) -> dict:
    """``against``'s time over ``strategy``'s, seed by seed (>1: ``strategy`` faster), with their geometric
    mean and its 95% bootstrap interval (the seeds resampled 10,000 times; too few seeds: no interval)."""
    mine, theirs = seed_times(result, strategy, net), seed_times(result, against, net)
    seeds = sorted(set(mine) & set(theirs))
    ratios = [theirs[k] / mine[k] for k in seeds]
    out: dict = {"seed_ratios": [round(r, 3) for r in ratios]}
    if len(ratios) >= 3:
        logs = np.log(ratios)
        means = np.random.default_rng(0).choice(logs, size=(10_000, len(logs))).mean(axis=1)
        out["paired"] = round(float(np.exp(logs.mean())), 3)
        out["paired_ci95"] = [round(float(np.exp(q)), 3) for q in np.quantile(means, [0.025, 0.975])]
    return out


def _compare(cmd: list[str], work: str) -> None:
    """Run one comparison; SIGTERM or Ctrl-C here stops it the way it stops itself (SIGTERM: it saves what
    finished and ends its workers), rather than leaving it running without this script."""
    child = subprocess.Popen(cmd, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        child.wait()
    except KeyboardInterrupt:
        child.terminate()
        child.wait(timeout=120)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def analyse(name: str, result: dict) -> tuple[list[dict], list[dict]]:
    """One comparison's rows (per network and strategy) and checks (auto against the best fixed strategy of its
    family, the twin against onebit)."""
    rows: list[dict] = []
    checks: list[dict] = []
    for net in dict.fromkeys(r["net"] for r in result["rows"]):
        mine = {r["strategy"]: r for r in result["rows"] if r["net"] == net and r["strategy"] != "compute-only"}
        sync = mine["sync"]
        for strategy, r in mine.items():
            rows.append({"run": name, "net": net, "strategy": strategy, "status": r["status"],
                         "step_ms": r["step_ms"], "speedup": r["speedup"], "metric": r["metric"],
                         "metric_mean": r["metric_mean"], "metric_min": r["metric_min"],
                         "metric_max": r["metric_max"], "reduction": r["reduction"], "error": r.get("error", ""),
                         "auto": [a["describe"] for a in r.get("auto") or []],
                         "auto_decisions": [a["decisions"] for a in r.get("auto") or []],
                         "seed_times": seed_times(result, strategy, net)})
        for auto in (s for s in mine if s.split("+")[0].split(":")[0] == "auto"):
            fam = family(auto)
            fixed = {s: r for s, r in mine.items() if family(s) == fam and s != auto and s != CONTROL
                     and not s.startswith("auto") and r.get("speedup") is not None}
            best = max(fixed, key=lambda s: fixed[s]["speedup"], default=None)
            a = mine[auto]
            if best is None or a.get("speedup") is None:
                continue
            checks.append({"run": name, "net": net, "auto": auto, "best_fixed": best,
                           "ratio": round(a["speedup"] / fixed[best]["speedup"], 3),
                           "auto_vs_sync": round(a["speedup"], 3),
                           "accuracy": a["metric_mean"], "sync_accuracy": [sync["metric_min"], sync["metric_max"]],
                           "chose": [x["describe"] for x in a.get("auto") or []],
                           **paired(result, net, auto, best)})
        twin = CONTROL.split(":")[0]
        if CONTROL in mine and mine[CONTROL].get("speedup") and mine[twin].get("speedup"):
            checks.append({"run": name, "net": net, "control": CONTROL, "of": twin,
                           "ratio": round(mine[CONTROL]["speedup"] / mine[twin]["speedup"], 3),
                           **paired(result, net, CONTROL, twin)})
    return rows, checks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=sorted(RUNS), action="append", help="run only these (repeat)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/auto_choice.json"))
    args = p.parse_args()
    rows, checks = [], []
    started = time.perf_counter()
    for name in args.only or list(RUNS):
        options, command = RUNS[name]
        with tempfile.TemporaryDirectory() as work:
            out = Path(work) / "compare"
            cmd = [sys.executable, "-m", "gradwire", "compare", *options, "--seeds", str(args.seeds),
                   "--out", str(out)] + (["--", *command] if command else [])
            # a failed run still has its row (status and error): compare's exit code is not the verdict
            _compare(cmd, work)
            result = json.loads((out / "results.json").read_text())
        name_rows, name_checks = analyse(name, result)
        rows += name_rows
        checks += name_checks
    for c in checks:
        print(json.dumps(c))
    write_results(args.out, rows, checks=checks, seeds=args.seeds, wall_s=round(time.perf_counter() - started, 1))


if __name__ == "__main__":
    main()
