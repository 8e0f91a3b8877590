"""Rank functions for ReduceOp.AVG on integer and bool tensors (NCCL's semantics on the gradwire backend)."""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

AVG = dist.ReduceOp.AVG


def rows(rank: int) -> list[int]:
    """Each rank's values: their sums (-3, 5, 7, -7 over 2 ranks) have odd negatives, where truncation and floor differ."""
    return [[-3, 5, 7, -8], [0, 0, 0, 1]][rank]


def integer_avg(rank: int, world: int, dtype_name: str) -> dict[str, Any]:
    import gradwire

    gradwire.configure("10gbe")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    dtype = getattr(torch, dtype_name)
    mine = torch.tensor(rows(rank), dtype=dtype)
    out: dict[str, Any] = {}
    t = mine.clone()
    dist.all_reduce(t, op=AVG)
    out["all_reduce"] = t.tolist()
    t = mine.clone()
    dist.all_reduce(t, op=AVG, async_op=True).wait()
    out["all_reduce_async"] = t.tolist()
    t = mine.clone()
    dist.reduce(t, 0, op=AVG)
    out["reduce"] = t.tolist()
    full = torch.cat([mine, mine])  # each rank gets one copy of the average
    t = torch.zeros(4, dtype=dtype)
    dist.reduce_scatter_tensor(t, full, op=AVG)
    out["reduce_scatter_tensor"] = t.tolist()
    t = torch.zeros(4, dtype=dtype)
    dist.reduce_scatter(t, [mine.clone() for _ in range(world)], op=AVG)
    out["reduce_scatter"] = t.tolist()
    t = mine.clone()
    opts = dist.AllreduceOptions()
    opts.reduceOp = AVG
    dist.group.WORLD.allreduce([t], opts).wait()
    out["caller_options_untouched"] = opts.reduceOp == AVG
    errors = []
    for call in (lambda b: dist.all_reduce(b, op=AVG), lambda b: dist.reduce(b, 0, op=AVG)):
        try:
            call(torch.ones(3, dtype=torch.bool))
            errors.append(None)
        except TypeError as exc:
            errors.append(str(exc))
    out["bool"] = errors
    dist.barrier()  # every rank raised before any collective: the group still works
    dist.destroy_process_group()
    return out
