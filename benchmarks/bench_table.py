"""The README's nccl-tests table and plot: all_reduce on a simulated 1 GbE, measured and model.

    python benchmarks/bench_table.py

runs::

    gradwire bench --backend gradwire --net 1gbe -b 64K -e 64M -f 4 -n 5 -w 1 \\
        --json benchmarks/results/bench_allreduce_1gbe.json --plot benchmarks/results/bench_allreduce_1gbe.png \\
        > benchmarks/results/bench_allreduce_1gbe.txt

then rewrites the JSON in the shared shape of ``_results.write_results``: the
command, commit, host and date, then ``gradwire bench --json``'s own fields
(``config``, ``world_size``, ``backend``, ``net``, ``simulated``, ``wrong``)
and its ``rows``, unchanged.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from _results import write_results

from gradwire.cli.main import main


def shared_shape(path: Path) -> dict:
    """Rewrite ``gradwire bench --json``'s file at ``path`` through write_results (its fields kept as they are)."""
    data = json.loads(path.read_text())
    rows = data.pop("rows")
    return write_results(path, rows, indent=2, **data)


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
    if Path(f"{stem}.json").exists() and "command" not in json.loads(Path(f"{stem}.json").read_text()):
        shared_shape(Path(f"{stem}.json"))  # the file gradwire bench just wrote, not one a failed run left
    sys.stdout.write(Path(f"{stem}.txt").read_text())
    print(f"wrote {stem}.txt, .json and .png")
    sys.exit(rc)
