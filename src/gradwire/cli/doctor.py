"""``gradwire doctor``: check that every rank runs the same stack and can reach the others.

    gradwire doctor                       # spawn 2 ranks on this machine
    gradwire doctor --world-size 4
    torchrun --nnodes 2 --nproc-per-node 1 ... -m gradwire.cli.main doctor   # one rank per node

Exits 1 when a check fails (a version mismatch, a missing backend, a wrong
all_reduce, a failed probe), 2 on bad input.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from gradwire.cli._args import positive_int, seconds


def add_parser(subparsers: Any) -> None:
    """Register ``gradwire doctor``."""
    p = subparsers.add_parser(
        "doctor", help="check versions, backends, interfaces and links across ranks",
        description="Run on every rank (spawned, or under torchrun): compare versions, list backends "
        "and CUDA/NCCL, name gloo's interface, probe latency and bandwidth between each pair of ranks.",
    )
    p.add_argument("--world-size", type=positive_int(1), default=2, metavar="N", help="ranks to spawn, >= 2 (default 2)")
    p.add_argument("--probe-bytes", type=positive_int(4), default=4 << 20, metavar="B",
                   help="message size of the bandwidth probe, >= 4 (default 4 MiB)")
    p.add_argument("--timeout", type=seconds, default=60.0, metavar="S",
                   help="seconds per collective, > 0 (default 60)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the checks and print the verdict on rank 0; 1 if any check failed."""
    from rich.console import Console
    from rich.table import Table

    from gradwire.bench.doctor import FAIL, OK, run_doctor

    report = run_doctor(args.world_size, args.timeout, args.probe_bytes)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0 if report.ok else 1
    console = Console(emoji=False)
    ranks = Table(title="ranks", title_justify="left")
    for col in ("rank", "host", "python", "torch", "gradwire", "backends", "CUDA/NCCL", "gloo interface"):
        ranks.add_column(col)
    for i in report.infos:
        backends = ", ".join(name for name, ok in i.backends.items() if ok) or "none"
        cuda = f"{i.cuda}/{i.nccl or '-'}, {i.gpus} GPUs" if i.cuda else "-"
        ranks.add_row(str(i.rank), i.host, i.python, i.torch, i.gradwire, backends, cuda,
                      f"{i.iface} {i.address}")
    console.print(ranks)
    verdict = Table(title="verdict", title_justify="left")
    verdict.add_column("check")
    verdict.add_column("status")
    verdict.add_column("detail")
    style = {OK: "green", FAIL: "bold red"}
    for c in report.checks:
        verdict.add_row(c.name, f"[{style.get(c.status, 'yellow')}]{c.status}[/]", c.detail)
    console.print(verdict)
    failed = [c.name for c in report.checks if c.status == FAIL]
    console.print(f"[bold red]FAIL[/]: {', '.join(failed)}" if failed else "[green]all checks passed[/]")
    return 1 if failed else 0
