"""Overhead of the gradwire backend over plain gloo, preset ``loopback``, n=2.

Both groups live in the same processes: the default group is ``gradwire``
(loopback: the model adds nothing) and a second group is plain gloo. Blocks of
all_reduces alternate between them so both see the same machine state; the
medians of the per-call times are compared. ``--runs N`` repeats the whole
measurement in fresh processes N times (default 5) and reports each run and
the median over runs, with the spread. Writes
benchmarks/results/backend_overhead.json.

    python benchmarks/backend_overhead.py [--runs 5]
"""
from __future__ import annotations

import datetime
import statistics
import time
from pathlib import Path

from _results import write_results

SIZES = [(4 << 10, 40, 50), (16 << 20, 20, 3)]  # (bytes, blocks, calls per block)


def _rank(rank: int, world: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    import gradwire

    gradwire.configure("loopback")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    sim = dist.group.WORLD
    rows = []
    for nbytes, blocks, calls in SIZES:
        t = torch.ones(nbytes // 4)
        times: dict[str, list[float]] = {"gloo": [], "gradwire": []}
        for b in range(blocks):
            order = [("gloo", gloo), ("gradwire", sim)] if b % 2 == 0 else [("gradwire", sim), ("gloo", gloo)]
            for name, group in order:
                dist.all_reduce(t, group=group)  # warm this path
                for _ in range(calls):
                    t0 = time.perf_counter()
                    dist.all_reduce(t, group=group)
                    times[name].append(time.perf_counter() - t0)
        g, s = statistics.median(times["gloo"]), statistics.median(times["gradwire"])
        rows.append({"bytes": nbytes, "calls": len(times["gloo"]), "gloo_us": g * 1e6, "gradwire_us": s * 1e6,
                     "overhead_us": (s - g) * 1e6, "overhead_pct": (s / g - 1) * 100})
    return rows


def main() -> None:
    import argparse

    from gradwire.launch import spawn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="measurements in fresh processes (default: %(default)s)")
    args = p.parse_args()
    runs = []
    for i in range(args.runs):
        rows = spawn(_rank, 2, timeout=600)[0]
        runs.append(rows)
        for r in rows:
            print(f"run {i + 1}: {r['bytes']:>10d} B  gloo {r['gloo_us']:10.1f} us  gradwire {r['gradwire_us']:10.1f} us"
                  f"  overhead {r['overhead_us']:+8.1f} us ({r['overhead_pct']:+.2f}%)  [{r['calls']} calls each]")
    summary = []
    for j, (nbytes, _, _) in enumerate(SIZES):
        us = [run[j]["overhead_us"] for run in runs]
        pct = [run[j]["overhead_pct"] for run in runs]
        summary.append({"bytes": nbytes, "runs": len(runs), "median_overhead_us": statistics.median(us),
                        "median_overhead_pct": statistics.median(pct), "min_pct": min(pct), "max_pct": max(pct),
                        "min_us": min(us), "max_us": max(us)})
        print(f"median of {len(runs)} runs: {nbytes:>10d} B  overhead {statistics.median(us):+8.1f} us "
              f"({statistics.median(pct):+.2f}%), runs from {min(pct):+.2f}% to {max(pct):+.2f}%")
    out = Path(__file__).parent / "results" / "backend_overhead.json"
    write_results(out, runs, summary=summary)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
