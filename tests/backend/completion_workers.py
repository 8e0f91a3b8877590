"""Rank functions for the completion machinery: a failing hand-off, and a future asked for during an inline wait."""
from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import torch
import torch.distributed as dist


def _init(rank: int, world: int, net: str) -> None:
    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    dist.all_reduce(torch.ones(1))  # warm-up: connections


def failing_hand_off(rank: int, world: int, net: str) -> dict[str, Any]:
    """The completer's hand-off to a delivery thread fails once (as when no thread can be started)."""
    from gradwire.backend import work

    _init(rank, world, net)
    real_submit = work.DELIVERIES.submit
    calls = []

    def submit(fn: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(fn)
        if len(calls) == 1:
            raise RuntimeError("can't start new thread")
        real_submit(fn, *args, **kwargs)

    work.DELIVERIES.submit = submit  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    first = dist.all_reduce(torch.ones(1 << 18), async_op=True)
    t0 = time.perf_counter()
    try:
        first.wait(datetime.timedelta(seconds=5))
        out["first"] = None
    except Exception as exc:  # noqa: BLE001
        out["first"] = (type(exc).__name__, str(exc)[:300], time.perf_counter() - t0)
    t = torch.ones(1 << 18)
    try:
        dist.all_reduce(t, async_op=True).wait(datetime.timedelta(seconds=5))
        out["second"] = t[:3].tolist()
    except Exception as exc:  # noqa: BLE001
        out["second"] = (type(exc).__name__, str(exc)[:300])
    work.DELIVERIES.submit = real_submit  # type: ignore[method-assign]
    dist.destroy_process_group()
    return out


def future_during_inline_wait(rank: int, world: int, net: str, nbytes: int) -> dict[str, Any]:
    """One thread waits inline on a blocking all_reduce; another asks for its future meanwhile."""
    _init(rank, world, net)
    t = torch.ones(nbytes // 4)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # what dist.all_reduce(t) sends: the inline path
    work = dist.group.WORLD.allreduce([t], opts)
    t0 = time.perf_counter()
    waiter = threading.Thread(target=work.wait)
    waiter.start()
    time.sleep(0.05)
    asked = time.perf_counter()
    future = work.get_future()
    got_future = time.perf_counter() - asked
    value = future.wait()
    waiter.join(30)
    out = {"get_future": got_future, "op": time.perf_counter() - t0, "value": value[0][:2].tolist() if value else value,
           "completed": work.is_completed()}
    dist.destroy_process_group()
    return out
