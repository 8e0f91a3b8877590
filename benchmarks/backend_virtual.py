"""Virtual clock: real data, no waiting, same modelled time as realtime.

300 all_reduces of 1 MiB on 4 ranks at 100 Mbit/s (with jitter, fixed seed):
- wall time in virtual mode vs the same loop on ``loopback`` (target <= +10%),
- modelled total in virtual mode vs realtime mode for the same spec and seed
  (target: equal), and the realtime run's wall time for scale.
Writes benchmarks/results/backend_virtual.json.

    python benchmarks/backend_virtual.py [--skip-realtime]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

from _results import write_results

SPEC = "bandwidth=100mbit,latency=50us,jitter=20us,seed=7"
OPS, NBYTES, WORLD = 300, 1 << 20, 4


def _rank(rank: int, world: int, spec: str) -> dict:
    import torch
    import torch.distributed as dist

    import gradwire

    gradwire.configure(spec)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    t = torch.ones(NBYTES // 4)
    gradwire.reset_stats()
    t0 = time.perf_counter()
    c0 = gradwire.clock()
    for _ in range(OPS):
        t.fill_(1.0)
        dist.all_reduce(t)
    wall = time.perf_counter() - t0
    ok = bool(torch.all(t == world))
    s = gradwire.stats().ops["all_reduce"]
    return {"wall_s": wall, "clock_s": gradwire.clock() - c0, "model_total_s": s.model_seconds, "correct": ok}


def main() -> None:
    from gradwire.launch import spawn

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-realtime", action="store_true")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"loopback": [], "virtual": []}
    for _ in range(args.repeats):  # interleave so both see the same machine load
        runs["loopback"].append(max(spawn(_rank, WORLD, ("loopback",), timeout=600), key=lambda r: r["wall_s"]))
        runs["virtual"].append(max(spawn(_rank, WORLD, (SPEC + ",clock=virtual",), timeout=600), key=lambda r: r["wall_s"]))
    loop_wall = statistics.median(r["wall_s"] for r in runs["loopback"])
    virt_wall = statistics.median(r["wall_s"] for r in runs["virtual"])
    v = runs["virtual"][0]
    out = {"spec": SPEC, "ops": OPS, "bytes": NBYTES, "world": WORLD,
           "loopback_wall_s": loop_wall, "virtual_wall_s": virt_wall,
           "virtual_over_loopback_pct": (virt_wall / loop_wall - 1) * 100,
           "virtual_model_total_s": v["model_total_s"], "virtual_clock_s": v["clock_s"],
           "all_correct": all(r["correct"] for rs in runs.values() for r in rs)}
    if not args.skip_realtime:
        rt = spawn(_rank, WORLD, (SPEC,), timeout=600)
        out["realtime_model_total_s"] = rt[0]["model_total_s"]
        out["realtime_wall_s"] = max(r["wall_s"] for r in rt)
        out["model_totals_equal"] = all(abs(r["model_total_s"] - v["model_total_s"]) < 1e-9 for r in rt)
    for k, val in out.items():
        print(f"{k:28s} {val:.4f}" if isinstance(val, float) else f"{k:28s} {val}")
    path = Path(__file__).parent / "results" / "backend_virtual.json"
    write_results(path, [], indent=2, **out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
