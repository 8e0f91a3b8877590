"""Rank functions for tests/exchange/test_replicas.py (spawn pickles them by name).

:func:`every_case` trains a tiny model for a few steps under each
(compressor, scheme) case in one process group, and after every step
gathers every rank's parameters and compares them with rank 0's,
``torch.equal``. Each rank trains on its own data, so the ranks' gradients,
momenta and residuals differ; only the exchange can keep the replicas equal.
"""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3
#: ``hook``: the exchange's own momentum and SGD without it; the others go through ``scheme_for``
SCHEMES = ("hook", "sgd", "momentum", "adamw")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 24), nn.Tanh(), nn.Linear(24, 4))


def _optimizer(scheme: str, params: Any) -> torch.optim.Optimizer:
    if scheme == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    momentum = {"hook": 0.0, "sgd": 0.0, "momentum": 0.9}[scheme]
    return torch.optim.SGD(params, lr=0.05, momentum=momentum, weight_decay=1e-3 if scheme == "momentum" else 0.0)


def _spread(model: nn.Module, world: int) -> float:
    """Largest difference of any rank's parameters from rank 0's (0.0: equal bit for bit)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rows = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(rows, flat)
    return max(0.0 if torch.equal(rows[0], r) else float((rows[0] - r).abs().max()) for r in rows)


def run_case(rank: int, world: int, compressor: str, scheme: str) -> list[float] | str:
    """Train ``STEPS`` steps; the spread of the replicas after each (or why the scheme refuses)."""
    from gradwire.exchange import CompressionState, UnsupportedOptimizer, scheme_for
    from gradwire.hooks import compression_hook, scheme_hook

    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.0005)  # several buckets, some fused
    opt = _optimizer(scheme, ddp.parameters())
    state = CompressionState(compressor, momentum=0.9 if scheme == "hook" else 0.0, warmup_iters=0,
                             min_compress_numel=0)
    runner: Any = opt
    if scheme == "hook":
        ddp.register_comm_hook(state, compression_hook)
    else:
        try:
            runner = scheme_for(opt, state, adam_warmup=1, track_every=1)
        except UnsupportedOptimizer as exc:
            return f"refused: {exc}"
        ddp.register_comm_hook(runner, scheme_hook)
    g = torch.Generator().manual_seed(100 + rank)
    spreads = []
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        runner.step()
        spreads.append(_spread(model, world))
    return spreads


def every_case(rank: int, world: int, cases: list[tuple[str, str]]) -> dict[str, list[float] | str]:
    """:func:`run_case` for each ``(compressor, scheme)``, in one process group."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        return {f"{c}/{s}": run_case(rank, world, c, s) for c, s in cases}
    finally:
        dist.destroy_process_group()
