"""The README's nccl-tests table and plot: all_reduce on a simulated 1 GbE, measured and model.

    python benchmarks/bench_table.py

is the same as::

    gradwire bench --backend gradwire --net 1gbe -b 64K -e 64M -f 4 -n 5 -w 1 \\
        --json benchmarks/results/bench_allreduce_1gbe.json --plot benchmarks/results/bench_allreduce_1gbe.png \\
        > benchmarks/results/bench_allreduce_1gbe.txt
"""
from __future__ import annotations

import sys
from pathlib import Path

from gradwire.cli.main import main

if __name__ == "__main__":
    results = Path(__file__).parent / "results"
    stem = results / "bench_allreduce_1gbe"
    argv = ["bench", "--backend", "gradwire", "--net", "1gbe", "-b", "64K", "-e", "64M", "-f", "4", "-n", "5",
            "-w", "1", "--json", f"{stem}.json", "--plot", f"{stem}.png"]
    with open(f"{stem}.txt", "w") as fh:
        stdout, sys.stdout = sys.stdout, fh
        try:
            rc = main(argv)
        finally:
            sys.stdout = stdout
    sys.stdout.write(Path(f"{stem}.txt").read_text())
    print(f"wrote {stem}.txt, .json and .png")
    sys.exit(rc)
