"""Rank functions for the model-parallel parity tests (module level: spawn pickles them by name).

Each part trains a small model a few AdamW steps and returns this rank's
parameters (its local shard where the parameters are DTensors) and, on
gradwire, what the simulated network counted during the part.
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = 3
#: the width of the layers; divisible by 4 so that FSDP2 shards need no padding on 2 or 4 ranks
WIDTH = 32


def _init(rank: int, world: int, backend: str, net: str | None) -> None:
    if backend == "gradwire":
        import gradwire

        gradwire.configure(net)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


class Block(nn.Module):
    """An MLP block as in a transformer layer: up projection, GELU, down projection, residual."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


def _blocks(n: int = 2, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[Block() for _ in range(n)])


def _local(params: Any) -> list[torch.Tensor]:
    return [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in params]


def _train(model: nn.Module, batch: Callable[[int], torch.Tensor], steps: int = STEPS) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        model(batch(step)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def _batches(seed: int) -> Callable[[int], torch.Tensor]:
    return lambda step: torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1000 * seed + step))


def _network_log(backend: str) -> dict | None:
    """The part's counters and events with their groups' global ranks, then reset (gradwire only)."""
    if backend != "gradwire":
        return None
    import gradwire
    from gradwire.backend import groups

    ranks = {gid: list(pg.global_ranks) for gid, pg in groups().items()}
    events = [(e.op, ranks.get(e.group), e.payload_bytes, e.model_seconds, e.algorithm) for e in gradwire.events()]
    out = {"stats": gradwire.stats().as_dict(), "events": events}
    gradwire.reset_stats()
    return out


def _start(backend: str) -> None:
    if backend == "gradwire":
        import gradwire

        gradwire.reset_stats()


def fsdp2(rank: int, world: int, backend: str) -> dict:
    """fully_shard on every block and the root, AdamW; inputs differ per rank (data parallel)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _blocks()
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    n_params = sum(p.numel() for p in _blocks().parameters())
    _start(backend)
    _train(model, _batches(rank))
    return {"params": _local(model.parameters()), "net": _network_log(backend), "n_params": n_params}


def tensor_parallel(rank: int, world: int, backend: str) -> dict:
    """ColwiseParallel up projections, RowwiseParallel down projections; every rank sees the same batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    model = _blocks()
    plan = {f"{i}.up": ColwiseParallel() for i in range(len(model))}
    plan.update({f"{i}.down": RowwiseParallel() for i in range(len(model))})
    parallelize_module(model, mesh, plan)
    _start(backend)
    _train(model, _batches(0))
    return {"params": _local(model.parameters()), "net": _network_log(backend)}


def pipeline(rank: int, world: int, backend: str, schedule: str, microbatches: int = 4) -> dict:
    """Two stages (one block each) on ranks 0 and 1 under a torch.distributed.pipelining schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    model = _blocks()
    stage_module = model[rank]
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = kind(stage, n_microbatches=microbatches, loss_fn=lambda out, target: (out - target).pow(2).mean())
    opt = torch.optim.AdamW(stage_module.parameters(), lr=1e-2)
    log = None
    for step in range(STEPS):
        if step == 1:  # the first step also exchanges shapes: count the steady state only
            _start(backend)
        x, target = _batches(0)(step), _batches(1)(step)
        sched.step(x) if rank == 0 else sched.step(target=target)
        opt.step()
        opt.zero_grad()
    log = _network_log(backend)
    return {"params": _local(stage_module.parameters()), "net": log,
            "activation_bytes": 8 // microbatches * WIDTH * 4, "microbatches": microbatches}


def mesh_2d(rank: int, world: int, backend: str) -> dict:
    """Data parallel (FSDP2) x tensor parallel on a (2, 2) mesh: TP inside [0, 1] and [2, 3]."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    model = _blocks()
    plan = {f"{i}.up": ColwiseParallel() for i in range(len(model))}
    plan.update({f"{i}.down": RowwiseParallel() for i in range(len(model))})
    parallelize_module(model, mesh["tp"], plan)
    for block in model:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    _start(backend)
    _train(model, _batches(mesh["dp"].get_local_rank()))
    return {"params": _local(model.parameters()), "net": _network_log(backend)}


def parallel_suite(rank: int, world: int, backend: str, net: str | None, parts: tuple[str, ...]) -> dict:
    """Run the named parts one after the other in one process group."""
    _init(rank, world, backend, net)
    runs: dict[str, Callable[[], dict]] = {
        "fsdp2": lambda: fsdp2(rank, world, backend),
        "tp": lambda: tensor_parallel(rank, world, backend),
        "pp_gpipe": lambda: pipeline(rank, world, backend, "gpipe"),
        "pp_1f1b": lambda: pipeline(rank, world, backend, "1f1b"),
        "mesh_2d": lambda: mesh_2d(rank, world, backend),
    }
    out = {name: runs[name]() for name in parts}
    dist.barrier()
    return out


def cuda_suite(rank: int, world: int, backend: str, net: str | None) -> dict:
    """FSDP2 and tensor parallel on CUDA tensors (one GPU per rank where there are enough, else shared)."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
    _init(rank, world, backend, net)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    out = {}
    mesh = init_device_mesh("cuda", (world,))
    model = _blocks().cuda()
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, lambda step: _batches(rank)(step).cuda())
    out["fsdp2"] = [p.cpu() for p in _local(model.parameters())]
    model = _blocks().cuda()
    plan = {f"{i}.up": ColwiseParallel() for i in range(len(model))}
    plan.update({f"{i}.down": RowwiseParallel() for i in range(len(model))})
    parallelize_module(model, mesh, plan)
    _train(model, lambda step: _batches(0)(step).cuda())
    out["tp"] = [p.cpu() for p in _local(model.parameters())]
    dist.barrier()
    return out
