"""What ``auto`` costs a step once it has chosen ``none``: its steps beside sync's and plain ``none``'s, taking turns.

Two ranks on the gradwire backend (10 Gbit/s, 20 us: the default comparison's fast network, where ``auto``
keeps sync's exchange) each hold four DDP replicas of the default CNN (601 k parameters, one bucket):
``sync`` and ``sync-twin`` (PyTorch's ``allreduce_hook``, momentum in SGD: what ``gradwire compare`` runs
as sync), ``none`` (gradwire's :class:`~gradwire.exchange.CompressionState` without compression, momentum in
the state) and ``auto``. They train in turns, blocks of ``--block`` steps in an order reversed every block,
one fixed batch, a barrier before each step; each variant's median step past its first two blocks is the
figure. The twin's distance from sync is what a tie reads as. Beside it, the training thread's own work
that the step time hides in noise: the median seconds a step spends inside the comm hook (sync: the division
and the issue; the state: its momentum, its check for non-finite values, the division and the issue; auto:
its chooser too) and inside ``optimizer.step()`` (sync's momentum is there, the state's is in its hook).
Writes ``benchmarks/results/auto_steady_cost.json``.

    python benchmarks/auto_steady_cost.py [--steps 1200] [--runs 2]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import time

from _results import ROOT, write_results

VARIANTS = ("sync", "none", "auto", "sync-twin")
NET = "bandwidth=10gbit,latency=20us"


def _timed(hook, spent: list[float]):
    """``hook`` adding the seconds of each call to ``spent[0]``."""
    def run(state, bucket):
        t0 = time.perf_counter()
        try:
            return hook(state, bucket)
        finally:
            spent[0] += time.perf_counter() - t0
    return run


def _rank(rank: int, world: int, steps: int, block: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire
    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook
    from gradwire.train.models import build_model

    torch.set_num_threads(1)
    gradwire.configure(NET)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(rank))
    runs = {}
    for name in VARIANTS:
        ddp = DDP(build_model("cnn-wide", seed=0), bucket_cap_mb=25.0)
        state = None
        in_hook = [0.0]  # this step's seconds inside the comm hook so far
        if name.startswith("sync"):
            ddp.register_comm_hook(None, _timed(allreduce_hook, in_hook))
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        else:
            state = CompressionState(name, momentum=0.9)
            ddp.register_comm_hook(state, _timed(compression_hook, in_hook))
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        runs[name] = (ddp, opt, state, [], in_hook, [], [])
    for b in range(steps // block):
        for name in VARIANTS if b % 2 == 0 else VARIANTS[::-1]:
            ddp, opt, _, times, in_hook, hooks, steps_of_opt = runs[name]
            for _ in range(block):
                dist.barrier()
                in_hook[0] = 0.0
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                t1 = time.perf_counter()
                opt.step()
                t2 = time.perf_counter()
                times.append(t2 - t0)
                hooks.append(in_hook[0])
                steps_of_opt.append(t2 - t1)
    out = {}
    for name, (_, _, _, times, _, hooks, steps_of_opt) in runs.items():
        out[name] = statistics.median(times[2 * block:]) * 1e3
        out[f"{name}_hook"] = statistics.median(hooks[2 * block:]) * 1e3
        out[f"{name}_optimizer"] = statistics.median(steps_of_opt[2 * block:]) * 1e3
    auto = runs["auto"][2]
    out["auto_chose"] = auto.auto.describe() if auto is not None and auto.auto is not None else ""
    dist.destroy_process_group()
    return out


def main() -> None:
    from gradwire.launch import spawn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1200, help="steps per variant (default: %(default)s)")
    p.add_argument("--block", type=int, default=20, help="steps per turn (default: %(default)s)")
    p.add_argument("--runs", type=int, default=2, help="measurements in fresh processes (default: %(default)s)")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/auto_steady_cost.json"))
    args = p.parse_args()
    if args.steps < 3 * args.block or args.block < 1 or args.runs < 1:
        p.error("--steps must be at least 3 blocks, --block and --runs at least 1")
    rows = []
    started = time.perf_counter()
    for run in range(args.runs):
        ranks = spawn(_rank, 2, (args.steps, args.block), timeout=60 + args.steps * 0.5)
        for rank, r in enumerate(ranks):
            row = {"run": run, "rank": rank, **{f"{n}_ms": round(r[n], 3) for n in VARIANTS},
                   **{f"{n}_{part}_ms": round(r[f"{n}_{part}"], 3) for n in VARIANTS for part in ("hook", "optimizer")},
                   "auto_minus_none_ms": round(r["auto"] - r["none"], 3),
                   "none_minus_sync_ms": round(r["none"] - r["sync"], 3),
                   "twin_minus_sync_ms": round(r["sync-twin"] - r["sync"], 3), "auto_chose": r["auto_chose"]}
            rows.append(row)
            print({k: v for k, v in row.items() if k != "auto_chose"}, r["auto_chose"])
    write_results(args.out, rows, net=NET, steps=args.steps, block=args.block,
                  wall_s=round(time.perf_counter() - started, 1))


if __name__ == "__main__":
    main()
