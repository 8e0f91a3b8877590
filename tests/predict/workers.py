"""Rank functions for the predict tests (spawn pickles them by name)."""
from __future__ import annotations

import datetime
import json
from pathlib import Path


def model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def recorded_ddp(rank: int, world: int, hooks: list[str], out: str, steps: int = 8) -> None:
    """Plain DDP loops inside a ProfileSession, one per hook, each written as ``gradwire profile`` writes a rank."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire
    from gradwire.profile import ProfileSession

    torch.set_num_threads(1)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    for hook in hooks:
        gradwire.configure("loopback")
        dist.init_process_group("gradwire", store=dist.PrefixStore(f"{hook}/", store), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        torch.manual_seed(0)
        net = model()
        with ProfileSession() as session:
            ddp = DDP(net, bucket_cap_mb=0.25)
            if hook == "onebit":
                from gradwire.exchange import CompressionState
                from gradwire.hooks import compression_hook

                ddp.register_comm_hook(CompressionState("onebit", momentum=0.9), compression_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            for _ in range(steps):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(torch.randn(16, 64)), torch.randint(0, 10, (16,))).backward()
                opt.step()
        result = session.result.as_dict()
        result["rank"] = rank
        folder = Path(out, hook)
        folder.mkdir(exist_ok=True)
        (folder / f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()
