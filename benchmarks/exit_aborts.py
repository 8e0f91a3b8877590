"""How often a finished 2-rank DDP job dies at exit (SIGABRT), on plain gloo and on the gradwire backend.

Each run is ``torchrun --nproc-per-node 2 benchmarks/exit_job.py BACKEND``
beside ``--busy`` busy loops (a loaded host makes gloo's worker threads late:
src/gradwire/backend/teardown.py). A run aborted when it exits non-zero and
its output says "terminate called". The backends alternate run by run, so
both see the same host.

    python benchmarks/exit_aborts.py --runs 30 --busy 3 --out benchmarks/results/exit_aborts.json
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _results import ROOT, write_results

JOB = str(Path(__file__).resolve().parent / "exit_job.py")
BACKENDS = ("gloo", "gradwire")


def run_once(backend: str, timeout: float) -> dict:
    env = {**os.environ, "GRADWIRE_NET": "bandwidth=500mbit,latency=100us"}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", JOB, backend],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, out = -9, "timed out"
    return {"backend": backend, "code": code, "aborted": code != 0 and "terminate called" in out,
            "other_failure": code != 0 and "terminate called" not in out, "seconds": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="runs per backend")
    p.add_argument("--busy", type=int, default=3, help="busy loops beside the runs")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/exit_aborts.json"))
    args = p.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows = []
    try:
        for i in range(args.runs):
            for backend in BACKENDS:
                rows.append({"run": i, **run_once(backend, args.timeout)})
                r = rows[-1]
                print(f"run {i:3d} {backend:9s} exit {r['code']:4d}{'  ABORTED' if r['aborted'] else ''}", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    summary = {b: {"runs": sum(r["backend"] == b for r in rows),
                   "aborted": sum(r["aborted"] for r in rows if r["backend"] == b),
                   "other_failures": sum(r["other_failure"] for r in rows if r["backend"] == b)} for b in BACKENDS}
    for b, s in summary.items():
        print(f"{b}: {s['aborted']} of {s['runs']} runs aborted at exit, {s['other_failures']} failed otherwise")
    write_results(args.out, rows, busy=args.busy, summary=summary)


if __name__ == "__main__":
    main()
