"""`gradwire demo`: a quick look at a simulated network under real collectives.

Spawns a few ranks on the ``gradwire`` backend, runs an all_reduce sweep and a
few DDP training steps, and prints measured time beside the model's.
"""
from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from gradwire.cli._args import check_net_fits, net_spec, positive_int

if TYPE_CHECKING:
    from gradwire.net import NetSpec


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run a collective sweep and a few DDP steps on a simulated network")
    p.add_argument("--net", type=net_spec, default="1gbe", help="network spec or preset (default: 1gbe)")
    p.add_argument("--world-size", "-n", type=positive_int(2, 8), default=2, help="ranks to spawn, 2-8 (default: 2)")
    p.add_argument("--steps", type=positive_int(1), default=5, help="DDP training steps, >= 1 (default: 5)")
    p.set_defaults(func=run)


def _worker(rank: int, world: int, net: NetSpec, steps: int) -> dict:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    sweep = []
    for nbytes in (4 << 10, 256 << 10, 4 << 20, 16 << 20):
        t = torch.ones(nbytes // 4)
        dist.all_reduce(t)  # warm-up
        gradwire.reset_stats()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        s = gradwire.stats().ops["all_reduce"]
        sweep.append({"bytes": nbytes, "measured": sorted(times)[1], "model": s.model_seconds / s.calls,
                      "wire": s.wire_bytes // s.calls})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gradwire.reset_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(64, 256)
        torch.nn.functional.cross_entropy(ddp(x), torch.randint(0, 10, (64,))).backward()
        opt.step()
    step = (time.perf_counter() - t0) / max(steps, 1)
    total = gradwire.stats().total
    return {"sweep": sweep, "step": step, "wire_per_step": total.wire_bytes / max(steps, 1),
            "model_per_step": total.model_seconds / max(steps, 1)}


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from gradwire.launch import spawn
    from gradwire.net.units import human_size

    spec = args.net
    check_net_fits(spec, args.world_size)
    console = Console(emoji=False)
    console.print(f"[bold]gradwire demo[/]: {args.world_size} ranks on [cyan]{spec.to_string()}[/]")
    res = spawn(_worker, args.world_size, (spec, args.steps), timeout=300)[0]
    table = Table(title="all_reduce (fp32, blocking, median of 3)")
    for col in ("size", "measured (ms)", "model (ms)", "wire bytes / rank"):
        table.add_column(col, justify="right")
    for row in res["sweep"]:
        table.add_row(human_size(row["bytes"], 1), f"{row['measured'] * 1e3:.2f}", f"{row['model'] * 1e3:.2f}", human_size(row["wire"], 1))
    console.print(table)
    console.print(
        f"DDP, MLP 256-512-10: {res['step'] * 1e3:.1f} ms per step, "
        f"{human_size(res['wire_per_step'], 1)} on the wire per rank per step, "
        f"{res['model_per_step'] * 1e3:.1f} ms of modelled communication per step"
    )
    return 0

