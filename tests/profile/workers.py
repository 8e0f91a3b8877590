"""Rank functions for the profile tests (spawn pickles them by name)."""
from __future__ import annotations

import datetime
import time

#: seconds each step sleeps outside any collective: blocked, yet not communication
IDLE = 0.1


def ddp_steps_with_idle_time(rank: int, world: int, net: str, steps: int) -> dict:
    """DDP steps on ``net`` inside a ProfileSession, each followed by an idle sleep and a blocking all_reduce.

    Returns the session's result and what the rank knows it did: the seconds it
    slept, and the modelled seconds of every collective.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire
    from gradwire.profile import ProfileSession

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    with ProfileSession() as session:
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(torch.randn(32, 128)), torch.randint(0, 10, (32,))).backward()
            opt.step()
            time.sleep(IDLE)
            dist.all_reduce(torch.ones(1024))  # blocking: Work.wait
            dist.all_reduce(torch.ones(1024), async_op=True).get_future().wait()  # a future's wait
    result = session.result.as_dict()
    result["slept"] = IDLE * steps
    result["model_seconds"] = result["ops"]["total"]["model_seconds"]
    dist.barrier()
    with ProfileSession() as overlapped:  # an op that completes while the thread sleeps: all of it hidden
        work = dist.all_reduce(torch.ones(1 << 20), async_op=True)
        time.sleep(1.0)
        work.wait()
    result["overlapped"] = overlapped.result.as_dict()
    return result
