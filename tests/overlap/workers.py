"""Rank functions for the overlap tests (module level: spawn pickles them by name)."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import nn


def _init(rank: int, world: int, net: str | None = None) -> None:
    import gradwire

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def _batches(rank: int, steps: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + rank)
    return [(torch.rand(batch, 1, 8, 8, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(steps)]


def handler_vs_ddp(rank: int, world: int, steps: int) -> dict[str, list[torch.Tensor]]:
    """Train the CNN N steps with DDP and with AsyncGradientHandler from the same start."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire.overlap import AsyncGradientHandler, broadcast_module
    from gradwire.train import build_model

    _init(rank, world)
    data, loss_fn, out = _batches(rank, steps), nn.CrossEntropyLoss(), {}
    for kind in ("ddp", "handler"):
        model = build_model("cnn", seed=rank)  # different per rank: the start must come from rank 0
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if kind == "ddp":
            module: nn.Module = DDP(model)
        else:
            broadcast_module(model)
            module, handler = model, AsyncGradientHandler(model)
            handler.attach(opt)
        for x, y in data:
            opt.zero_grad()
            loss_fn(module(x), y).backward()
            if kind == "handler":
                handler.synchronize()
            opt.step()
        out[kind] = [p.detach().clone() for p in model.parameters()]
    return out


def handler_misuse(rank: int, world: int) -> dict[str, str]:
    """Step before synchronize, and a second backward before synchronize: both must raise."""
    from gradwire.overlap import AsyncGradientHandler, broadcast_module

    _init(rank, world, "bandwidth=10mbit,latency=20ms")
    model = nn.Linear(64, 10)
    broadcast_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = AsyncGradientHandler(model)
    handler.attach(opt)
    x = torch.ones(4, 64)
    out: dict[str, str] = {}
    model(x).sum().backward()
    out["pending"] = str(handler.pending)
    before = model.weight.detach().clone()
    try:
        opt.step()
        out["step"] = "no error"
    except RuntimeError as exc:
        out["step"] = str(exc)
    out["unchanged"] = str(torch.equal(before, model.weight))
    try:
        model(x).sum().backward()
        out["twice"] = "no error"
    except RuntimeError as exc:
        out["twice"] = str(exc)
    handler.synchronize()
    opt.step()  # allowed now
    out["after"] = str(handler.pending)
    return out


def train_many(rank: int, world: int, net: str, configs: list) -> list:
    """Run several TrainConfigs one after the other on one process group."""
    from gradwire.train import train_rank

    _init(rank, world, net)
    return [train_rank(c) for c in configs]
