"""``auto``'s online link estimate on real packets against the shaped rate, and its choice against the simulated run's.

The same training (``auto_link_job.py``: DDP of one 131 k-element layer on gloo, SGD, the
``auto`` hook deciding every 4 steps, 40 steps) runs

1. under ``gradwire emulate`` (network namespaces, tc-shaped veth links, 2 nodes: real TCP between
   them) at 100 Mbit/s and 1 Gbit/s, and
2. under ``gradwire profile`` on the simulated backend with the same bandwidth,

and each run's rank 0 writes what ``auto`` measured and chose. The check: the emulated estimate of
the bus bandwidth within 10% of the shaped rate, and the same choice as the simulated run.
Needs root (namespaces). Results: ``results/auto_link.json``.

    sudo python benchmarks/auto_link.py
    sudo python benchmarks/auto_link.py --burst 4KiB --out /tmp/auto_link_burst.json
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

JOB = ROOT / "benchmarks/auto_link_job.py"


def _run(cmd: list[str], out: Path, env: dict[str, str]) -> dict:
    subprocess.run(cmd, check=True, env=env, cwd=out.parent, timeout=600)
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/auto_link.json"))
    p.add_argument("--burst", help="the shapers' token bucket, passed to gradwire emulate (default: its own)")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        for rate in args.rates.split(","):
            net = f"bandwidth={rate}"
            emulated = Path(work) / f"emulated_{rate}.json"
            simulated = Path(work) / f"simulated_{rate}.json"
            burst = ["--burst", args.burst] if args.burst else []
            e = _run([sys.executable, "-m", "gradwire", "emulate", "--net", net, "--nodes", "2", *burst,
                      "--nproc-per-node", "1", "--timeout", "300", "--", str(JOB), "--out", str(emulated)],
                     emulated, env)
            s = _run([sys.executable, "-m", "gradwire", "profile", "--net", net, "--", "torchrun",
                      "--nproc-per-node", "2", str(JOB), "--out", str(simulated)], simulated, env)
            shaped = _bits(rate)
            est = e["link"]["bus_gbit_s"] * 1e9
            rows.append({"net": net, "shaped_bit_s": shaped, "emulated_bus_bit_s": est,
                         "error": round(est / shaped - 1, 4), "emulated_alpha_us": e["link"]["alpha_us"],
                         "emulated_choice": e["choice"], "simulated_bus_bit_s": s["link"]["bus_gbit_s"] * 1e9,
                         "simulated_choice": s["choice"], "same_choice": e["choice"] == s["choice"],
                         "emulated": e["describe"], "simulated": s["describe"]})
            print(json.dumps(rows[-1]))
    write_results(args.out, rows, wall_s=round(time.perf_counter() - started, 1))


def _bits(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"rate {rate!r}: write e.g. 100mbit or 1gbit")


if __name__ == "__main__":
    main()
