"""Fidelity of the gradwire backend in realtime mode: measured vs modelled time.

For each case, N ranks run blocking all_reduces on the simulated network; the
median wall time of the timed iterations is compared with the model's price
of one op. Writes benchmarks/results/backend_fidelity.json.

    python benchmarks/backend_fidelity.py [--iters 12]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

from _results import write_results

CASES = [
    # (name, world, spec, bytes)
    ("16MB all_reduce, 1 Gbit/s, n=2", 2, "1gbe", 16 << 20),
    ("16MB all_reduce, 1 Gbit/s, n=4", 4, "1gbe", 16 << 20),
    ("1MB all_reduce, 100 Mbit/s, n=2", 2, "bandwidth=100mbit,latency=50us", 1 << 20),
    ("64KB all_reduce, 10 ms latency, n=2", 2, "bandwidth=10gbit,latency=10ms", 64 << 10),
]


def _rank(rank: int, world: int, spec: str, nbytes: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    import gradwire

    gradwire.configure(spec)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    t = torch.ones(nbytes // 4)
    for _ in range(2):
        dist.all_reduce(t)
    gradwire.reset_stats()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    s = gradwire.stats().ops["all_reduce"]
    return {"median": statistics.median(times), "model": s.model_seconds / s.calls,
            "algorithm": gradwire.events()[-1].algorithm}


def main() -> None:
    from gradwire.launch import spawn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=12)
    args = ap.parse_args()
    rows = []
    for name, world, spec, nbytes in CASES:
        res = spawn(_rank, world, (spec, nbytes, args.iters), timeout=300)
        r0 = res[0]
        worst = max(res, key=lambda r: abs(r["median"] / r["model"] - 1))
        err = worst["median"] / worst["model"] - 1
        rows.append({"case": name, "world": world, "spec": spec, "bytes": nbytes, "iters": args.iters,
                     "measured_ms": worst["median"] * 1e3, "model_ms": r0["model"] * 1e3,
                     "error_pct": err * 100, "algorithm": r0["algorithm"], "within_5pct": abs(err) <= 0.05})
        print(f"{name:40s} measured {worst['median'] * 1e3:9.2f} ms  model {r0['model'] * 1e3:9.2f} ms  "
              f"error {err * 100:+6.2f}%  ({r0['algorithm']})")
    out = Path(__file__).parent / "results" / "backend_fidelity.json"
    write_results(out, rows, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
