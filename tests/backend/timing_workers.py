"""Rank functions for the timing tests: each measures what it compares inside one run."""
from __future__ import annotations

import datetime
import time


def overlap_in_one_run(rank: int, world: int, net: str, n_ops: int, nbytes: int, compute_s: float) -> dict:
    """Two back-to-back phases of ``n_ops`` async all_reduces: wait at once, then do other work first.

    The warm-up op is left out of the modelled time (the counters are reset after it).
    Per phase: seconds to issue the ops, seconds until the last one completed, modelled
    seconds and calls of the phase's ops.
    """
    import torch
    import torch.distributed as dist

    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    bufs = [torch.ones(nbytes // 4) for _ in range(n_ops)]
    dist.all_reduce(torch.ones(1))  # warm-up: connections, first-call costs
    phases = {}
    for name, busy in (("wait", 0.0), ("compute", compute_s)):
        dist.barrier()
        gradwire.reset_stats()
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, async_op=True) for b in bufs]
        issued = time.perf_counter() - t0
        # the step's other work: a sleep, not a busy loop. Both ranks spinning on a loaded 2-core machine
        # starve the inner group's threads and delay the real transfer under the model (measured: 1.77x)
        time.sleep(busy)
        for w in works:
            w.wait()
        total = time.perf_counter() - t0
        stats = gradwire.stats().ops["all_reduce"]
        phases[name] = {"issued": issued, "total": total, "model": stats.model_seconds, "calls": stats.calls}
    return phases


def two_groups_same_ranks(rank: int, world: int, net: str, nbytes: int) -> dict:
    """A large async all_reduce on the world group and one on a second group of the same ranks, issued together.

    Returns each op's wall seconds from issue to completion (a done-callback
    stamps it), and the modelled start and completion of both from the event log.
    """
    import threading

    import torch
    import torch.distributed as dist

    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    other = dist.new_group(list(range(world)))  # as a strategy makes one for its own collectives
    dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1), group=other)  # warm-up: connections of both inner groups
    dist.barrier()
    gradwire.reset_stats()
    done: dict[str, float] = {}
    lock = threading.Lock()

    def stamp(name: str):  # type: ignore[no-untyped-def]
        def cb(fut):  # type: ignore[no-untyped-def]
            with lock:
                done[name] = time.perf_counter()
            return fut.value()
        return cb

    t0 = time.perf_counter()
    first = dist.all_reduce(torch.ones(nbytes // 4), async_op=True)
    second = dist.all_reduce(torch.ones(nbytes // 4), group=other, async_op=True)
    futs = [first.get_future().then(stamp("first")), second.get_future().then(stamp("second"))]
    torch.futures.wait_all(futs)
    events = [e for e in gradwire.events() if e.op == "all_reduce"]
    dist.destroy_process_group()
    return {"first": done["first"] - t0, "second": done["second"] - t0,
            "model": [(e.group, e.started - events[0].issued, e.modelled_done - events[0].issued,
                       e.model_seconds) for e in events]}
