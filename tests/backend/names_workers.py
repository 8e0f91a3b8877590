"""Rank functions for the backend-name tests: what a script and its libraries read of a group's backend."""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


def names(rank: int, world: int, asked: str | None, stand_in: bool) -> dict[str, Any]:
    """Init with ``asked`` (plain torch), or on gradwire standing in for ``asked`` as the profile's bootstrap does."""
    timeout = datetime.timedelta(seconds=30)
    if stand_in:
        import gradwire
        from gradwire.backend import names as backend_names

        dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=timeout)
        gradwire.backend.report_as(dist.group.WORLD, asked)
        is_gradwire = backend_names.is_gradwire
    else:
        dist.init_process_group(asked, rank=rank, world_size=world, timeout=timeout)

        def is_gradwire(group: Any) -> bool:
            return type(group).__name__ == "GradwireProcessGroup"

    w = dist.group.WORLD
    out: dict[str, Any] = {}

    def seen(group: Any) -> tuple:
        return (dist.get_backend(group), dist.get_backend_config(group), group.name(), group._get_backend_name())

    out["world"] = seen(w)
    out["world_is_gradwire"] = is_gradwire(w)
    sub = dist.new_group(list(range(world)))
    out["sub"] = seen(sub)
    out["sub_is_gradwire"] = is_gradwire(sub)
    same = dist.new_group(list(range(world)), backend=dist.get_backend())
    out["same_name_is_gradwire"] = is_gradwire(same)
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t, group=sub)
    out["sub_sum"] = t.tolist()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    out["ddp_backend_name"] = model._get_ddp_logging_data().get("backend_name")
    if asked == "gloo":  # importing Lightning costs seconds of CPU a rank: only where its path is the point
        from lightning.fabric.utilities.distributed import _sync_ddp

        # Lightning averages a logged integer counter: SUM and divide on "gloo", ReduceOp.AVG otherwise
        try:
            out["lightning_mean"] = _sync_ddp(torch.tensor([rank + 1, 10], dtype=torch.int64),
                                              reduce_op="mean").tolist()
        except (RuntimeError, ValueError) as exc:  # an integer AVG: gloo cannot cast its float quotient back
            out["lightning_mean"] = ("error", str(exc)[:200])
    dist.destroy_process_group()
    return out
