"""Rank functions for the ``local`` network: reductions answered from the rank's own data, the rest real."""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

OP = dist.ReduceOp


def _inner_collectives() -> int:
    """Collectives the inner gloo groups of this process ran (their sequence numbers)."""
    import gradwire

    return sum(g._gloo_backend._get_sequence_number_for_group() for g in gradwire.backend.groups().values())


def collectives(rank: int, world: int) -> dict[str, Any]:
    import gradwire

    gradwire.configure("local")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    x = torch.tensor([1.0, -2.0, 3.0]) + rank  # the ranks hold different data: the answer is the own one's
    out: dict[str, Any] = {}
    for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(OP, name))
        out[name] = t.tolist()
    t = torch.tensor([-3, 5], dtype=torch.int64) + rank
    dist.all_reduce(t, op=OP.AVG, async_op=True).wait()
    out["int_avg"] = t.tolist()
    full = torch.arange(2.0 * world) + 10 * rank  # rank r's own chunk: [2r, 2r+1] + 10r
    t = torch.zeros(2)
    dist.reduce_scatter_tensor(t, full)
    out["reduce_scatter_tensor"] = t.tolist()
    t = x.clone()
    dist.reduce(t, dst=0)
    out["reduce"] = t.tolist()
    out["inner_after_reductions"] = _inner_collectives()
    # the rest carry data a rank cannot make up: they run on the real group, at 0 s
    t = x.clone()
    dist.broadcast(t, src=1)
    out["broadcast"] = t.tolist()
    slots = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(slots, x)
    out["all_gather"] = [s.tolist() for s in slots]
    objects: list[Any] = [None]
    if rank == 1:
        objects = [{"from": 1}]
    dist.broadcast_object_list(objects, src=1)  # a receiver's size tensor is uninitialised: it needs the root's
    out["broadcast_object"] = objects[0]
    y = x.clone()
    dist.send(y, 1 - rank) if rank == 0 else dist.recv(y, 1 - rank)
    out["point_to_point"] = y.tolist()
    dist.barrier()
    stats = gradwire.stats().as_dict()
    reduced = stats["all_reduce"]
    out["bytes"] = (reduced["payload_bytes"], reduced["sent_bytes"], reduced["wire_bytes"],
                    stats["total"]["model_seconds"])
    out["inner"] = _inner_collectives()
    dist.destroy_process_group()
    return out


def ddp_training(rank: int, world: int, steps: int) -> dict[str, Any]:
    import gradwire
    from torch.nn.parallel import DistributedDataParallel as DDP

    gradwire.configure("local")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(256, 20, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    stats = gradwire.stats().as_dict()
    out = {"losses": losses, "all_reduce_calls": stats["all_reduce"]["calls"],
           "wire_bytes": stats["all_reduce"]["wire_bytes"], "inner": _inner_collectives()}
    dist.destroy_process_group()
    return out
