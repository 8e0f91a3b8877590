"""The simulated cluster clock: host independence, fidelity where the host is the cluster, scale, speed.

    python benchmarks/sim_clock.py host         # one compare, quiet / beside two busy loops / every rank on one core
    python benchmarks/sim_clock.py fidelity     # device=host on the simulated clock against the realtime clock
    python benchmarks/sim_clock.py scale        # 16 ranks of the bundled CNN on this host's cores
    python benchmarks/sim_clock.py speed        # wall time of one compare on each clock

host: ``gradwire compare`` (the bundled CNN, cpu-core roofline, 200 Mbit/s and 10 Gbit/s; ``--epochs`` and
``--seeds`` shortened so that five runs fit in minutes) run five times: quiet, quiet again, beside two
``python -c 'while True: pass'``, with every process on one core (``taskset -c 0``), quiet once more. Each
run's time/epoch, speedup and of-ideal per row against the first run's: the largest difference, and whether the
accuracies are identical.

fidelity: one training per strategy and network (2 ranks), on ``clock=sim,device=host`` (this rank's thread CPU
time) and on the realtime clock, taking turns in one set of processes; the median step of each. On a quiet host
with a core per rank the two should agree: the realtime step is what this host does, the simulated one prices
the same compute from CPU time and the network from the model.

scale: 16 ranks of the bundled CNN (sync, 200 Mbit/s, cpu-core) on this host; the simulated step and the wall
time each simulated step took.

speed: the wall time of the same short compare on the simulated and on the realtime clock.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BUSY = [sys.executable, "-c", "while True: pass"]


def _compare(args: list[str], out: Path, prefix: list[str] | None = None) -> tuple[dict[str, Any], float]:
    """Run ``gradwire compare ARGS --out OUT`` (under ``prefix``, e.g. taskset); its results and wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([*(prefix or []), sys.executable, "-m", "gradwire", "compare", *args, "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text()), time.perf_counter() - t0


def _rows(res: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["net"], r["strategy"]): r for r in res["rows"]}


def host_independence(epochs: int, seeds: int) -> None:
    args = ["--epochs", str(epochs), "--seeds", str(seeds)]
    conditions = [("quiet", None, 0), ("quiet again", None, 0), ("two busy loops", None, 2),
                  ("one core (taskset -c 0)", ["taskset", "-c", "0"], 0), ("quiet, last", None, 0)]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, prefix, busy in conditions:
            loops = [subprocess.Popen(BUSY) for _ in range(busy)]
            try:
                res, wall = _compare(args, Path(tmp) / "cmp", prefix)
            finally:
                for p in loops:
                    p.kill()
                    p.wait()
            runs.append({"condition": name, "wall_s": wall, "rows": _rows(res), "clock": res.get("clock")})
            print(f"{name}: {wall:.0f} s", flush=True)
    base = runs[0]["rows"]
    out = []
    for run in runs:
        worst, accuracy_same = 0.0, True
        for key, row in run["rows"].items():
            ref = base[key]
            for field in ("epoch_seconds", "speedup", "of_ideal"):
                if ref.get(field) and row.get(field) is not None:
                    worst = max(worst, abs(row[field] / ref[field] - 1))
            accuracy_same = accuracy_same and row.get("metric_mean") == ref.get("metric_mean")
        out.append({"condition": run["condition"], "wall_s": round(run["wall_s"], 1),
                    "largest_time_difference": worst, "accuracies_identical": accuracy_same,
                    "table": {f"{n} {s}": {"epoch_seconds": r.get("epoch_seconds"), "speedup": r.get("speedup"),
                                           "of_ideal": r.get("of_ideal"), "accuracy": r.get("metric_mean")}
                              for (n, s), r in run["rows"].items()}})
        print(f"  {run['condition']}: largest difference {worst:.2e}, accuracies identical {accuracy_same}")
    write_results(RESULTS / "sim_clock_host.json", out, clock=runs[0]["clock"],
                  largest_time_difference=max(r["largest_time_difference"] for r in out),
                  accuracies_identical=all(r["accuracies_identical"] for r in out))


def _fidelity_rank(rank: int, world: int, configs: list[Any]) -> list[dict[str, Any]]:
    from gradwire.train.loop import train_in_turns

    results = train_in_turns(rank, world, configs)
    return [{"step": statistics.median(r.step_seconds[5:]), "steps": len(r.step_seconds)} for r in results]


def fidelity(steps: int, rounds: int) -> None:
    from gradwire.launch import spawn
    from gradwire.train.loop import CPU_ONLY, TrainConfig

    strategies = ["sync", "onebit", "delayed", "onebit+delayed"]
    nets = ["bandwidth=500mbit,latency=100us", "bandwidth=10gbit,latency=20us"]
    configs = []
    for _ in range(rounds):
        for net in nets:
            for s in strategies:
                for clock in ("realtime", "sim"):
                    spec = net + (",clock=sim,device=host" if clock == "sim" else "")
                    configs.append(((net, s, clock), TrainConfig(strategy=s, net=spec, model="cnn-wide",
                                                                 batch_size=64, epochs=50, max_steps=steps)))
    by_rank = spawn(_fidelity_rank, 2, ([c for _, c in configs],), timeout=3600, env=CPU_ONLY)
    steps_of: dict[tuple[str, str, str], list[float]] = {}
    for (key, _), r0, r1 in zip(configs, by_rank[0], by_rank[1]):
        steps_of.setdefault(key, []).append(max(r0["step"], r1["step"]))
    rows = []
    for net in nets:
        for s in strategies:
            real = statistics.median(steps_of[(net, s, "realtime")])
            sim = statistics.median(steps_of[(net, s, "sim")])
            rows.append({"net": net, "strategy": s, "realtime_step_ms": real * 1e3, "sim_step_ms": sim * 1e3,
                         "sim_over_realtime": sim / real})
            print(f"{net:34s} {s:16s} realtime {real * 1e3:7.2f} ms  sim(host) {sim * 1e3:7.2f} ms  "
                  f"{sim / real:.3f}", flush=True)
    write_results(RESULTS / "sim_clock_fidelity.json", rows, steps=steps, rounds=rounds,
                  worst=max(abs(r["sim_over_realtime"] - 1) for r in rows))


def _scale_rank(rank: int, world: int, steps: int) -> dict[str, Any]:
    import torch.distributed as dist

    import gradwire
    from gradwire.train.loop import COLLECTIVE_TIMEOUT, TrainConfig, train_rank

    config = TrainConfig(strategy="sync", net="bandwidth=200mbit,latency=100us,clock=sim,device=cpu-core",
                         model="cnn", epochs=50, max_steps=steps)
    gradwire.configure(config.net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    t0 = time.perf_counter()
    result = train_rank(config)
    wall = time.perf_counter() - t0
    return {"steps": len(result.step_seconds), "sim_step": statistics.median(result.step_seconds[3:]),
            "wall_per_step": wall / len(result.step_seconds), "accuracy": result.test_accuracy}


def scale(world: int, steps: int) -> None:
    from gradwire.launch import spawn
    from gradwire.train.loop import CPU_ONLY

    t0 = time.perf_counter()
    res = spawn(_scale_rank, world, (steps,), timeout=3600, env=CPU_ONLY)
    wall = time.perf_counter() - t0
    row = {"world": world, "cores": os.cpu_count(), "steps": res[0]["steps"],
           "sim_step_ms": res[0]["sim_step"] * 1e3, "sim_step_ms_every_rank": sorted({round(r["sim_step"] * 1e3, 6)
                                                                                       for r in res}),
           "wall_s_per_simulated_step": max(r["wall_per_step"] for r in res), "wall_s": wall}
    print(json.dumps(row, indent=1))
    write_results(RESULTS / "sim_clock_scale.json", [row])


def speed(epochs: int, seeds: int) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clock in ("sim", "realtime", "sim", "realtime"):
            _, wall = _compare(["--epochs", str(epochs), "--seeds", str(seeds), "--clock", clock], Path(tmp) / "cmp")
            rows.append({"clock": clock, "wall_s": wall})
            print(f"{clock}: {wall:.0f} s", flush=True)
    med = {c: statistics.median(r["wall_s"] for r in rows if r["clock"] == c) for c in ("sim", "realtime")}
    write_results(RESULTS / "sim_clock_speed.json", rows, median_wall_s=med, sim_over_realtime=med["sim"] / med["realtime"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    h = sub.add_parser("host")
    h.add_argument("--epochs", type=int, default=2)
    h.add_argument("--seeds", type=int, default=1)
    f = sub.add_parser("fidelity")
    f.add_argument("--steps", type=int, default=40)
    f.add_argument("--rounds", type=int, default=2)
    s = sub.add_parser("scale")
    s.add_argument("--world", type=int, default=16)
    s.add_argument("--steps", type=int, default=12)
    v = sub.add_parser("speed")
    v.add_argument("--epochs", type=int, default=2)
    v.add_argument("--seeds", type=int, default=1)
    a = p.parse_args()
    if a.what == "host":
        host_independence(a.epochs, a.seeds)
    elif a.what == "fidelity":
        fidelity(a.steps, a.rounds)
    elif a.what == "scale":
        scale(a.world, a.steps)
    else:
        speed(a.epochs, a.seeds)


if __name__ == "__main__":
    main()
