"""Rank functions for networks that change: ops timed against the model of the condition they ran in."""
from __future__ import annotations

import datetime
import time
from typing import Any


def _init(rank: int, world: int, net: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    import gradwire

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))


def ops_across_a_drop(rank: int, world: int, net: str, nbytes: int, seconds: float) -> list[tuple[float, float]]:
    """Blocking all_reduces back to back for about ``seconds``: each op's (start on the schedule, seconds taken).

    Every rank runs the same number of ops (one that stopped on its own clock would leave its peer's last
    collective unmatched): as many as the model fits into ``seconds``, with 2 ms of host time per op.
    """
    import torch
    import torch.distributed as dist

    import gradwire.backend as backend
    from gradwire.net import NetworkModel

    model, t, count = NetworkModel(net, world), 0.0, 0
    while t < seconds:
        t += model.cost("all_reduce", nbytes, start=t).seconds + 0.002
        count += 1
    _init(rank, world, net, 60)
    buf = torch.ones(nbytes // 4)
    out = []
    origin = backend._origin
    for _ in range(count):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        out.append((t0 - origin, time.perf_counter() - t0))
    return out


def ddp_through_an_outage(rank: int, world: int, net: str, steps: int, timeout_s: float) -> dict[str, Any]:
    """A few DDP steps of a small model; each step's seconds and the final parameters (or the error)."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire.backend as backend

    _init(rank, world, net, timeout_s)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(rank)
    times: list[float] = []
    starts: list[float] = []
    began = time.perf_counter()  # when the work that may fail began: DDP's construction, then each step
    try:
        model = DDP(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            x = torch.randn(16, 64, generator=gen)
            t0 = began = time.perf_counter()
            starts.append(t0 - backend._origin)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x[:, :8]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            time.sleep(0.1)  # the step's other work
    except Exception as exc:  # noqa: BLE001 - the test reads what every rank raised, and when
        now = time.perf_counter()
        failed = [e for e in backend.events() if e.error]
        issued = failed[0].issued if failed else began  # the op that timed out
        return {"error": f"{type(exc).__name__}: {exc}", "raised_after": now - issued, "times": times,
                "starts": starts}
    return {"times": times, "starts": starts, "params": [p.detach().clone() for p in model.parameters()]}


def warm_and_after_idle(rank: int, world: int, net: str, nbytes: int, idle_s: float) -> dict[str, float]:
    """Seconds of an all_reduce right after another (warm) and after ``idle_s`` of quiet (TCP's restart)."""
    import torch
    import torch.distributed as dist

    _init(rank, world, net, 60)
    buf = torch.ones(nbytes // 4)
    dist.all_reduce(buf)  # the connection's first data: slow start from the initial window
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t0)
    time.sleep(idle_s)
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    took = time.perf_counter() - t0
    import gradwire.backend as backend

    last, before = backend.events()[-1], backend.events()[-2]
    return {"warm": min(times), "after_idle": took, "idle": last.started - before.modelled_done}


def ops_on_a_shared_link(rank: int, world: int, net: str, nbytes: int, count: int) -> list[float]:
    """``count`` blocking all_reduces back to back: each one's seconds."""
    import torch
    import torch.distributed as dist

    _init(rank, world, net, 60)
    buf = torch.ones(nbytes // 4)
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        out.append(time.perf_counter() - t0)
    return out


def network_now_across_a_drop(rank: int, world: int, net: str, period: float, phases: list[float]) -> list[tuple[float, ...]]:
    """The group's ``network_now()`` at the next moment of each phase (seconds into a ``period`` of the
    schedule, counted from wherever the group's start left the clock), with the time it was read."""
    import torch.distributed as dist

    import gradwire.backend as backend

    _init(rank, world, net, 60)
    out = []
    for phase in phases:
        now = time.perf_counter() - backend._origin
        t = now - now % period + phase
        time.sleep(max(0.0, (t if t > now else t + period) - now))
        out.append((time.perf_counter() - backend._origin, *dist.group.WORLD.network_now()))
    dist.barrier()
    return out


def disagree_on_the_outage(rank: int, world: int, net: str, timeout_s: float) -> dict[str, Any]:
    """Rank 0 issues its first all_reduce before the outage and its second in it; rank 1 its first in it.

    Rank 1 times out first and ends; rank 0's second op, never matched, then sees its peer's connection close
    (a real network in an outage would carry no close either). What it raises, and how long after its issue.
    """
    import torch
    import torch.distributed as dist

    import gradwire.backend as backend

    _init(rank, world, net, timeout_s)
    buf = torch.ones(16)
    began = time.perf_counter()
    try:
        if rank == 0:
            time.sleep(max(0.0, backend._origin + 0.5 - time.perf_counter()))
            dist.all_reduce(buf)  # priced from 0.5 s: done before the outage
            time.sleep(max(0.0, backend._origin + 1.6 - time.perf_counter()))
        else:
            time.sleep(max(0.0, backend._origin + 1.1 - time.perf_counter()))
        began = time.perf_counter()
        dist.all_reduce(buf)
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised, and when
        return {"error": f"{type(exc).__name__}: {exc}", "raised_after": time.perf_counter() - began}
    return {"error": ""}
