"""A peer that dies or stalls mid-training: what do the survivors do?

``run_fault(strategy, world, fault)`` starts ``world`` ranks that train a
tiny model with ``strategy`` on a process group; at step ``DIE_AT`` rank
``world - 1`` exits (``exit``: ``os._exit(1)``), is killed (``kill``:
SIGKILL to itself) or stops answering (``stall``: sleeps past the group
timeout). Every survivor must raise a Python exception within the group
timeout plus 5 s: the parent records, per survivor, the exception and the
seconds from the fault to the raise, or ``hang`` (nothing in time),
``crash`` (a signal such as SIGSEGV), ``continued`` (training finished as if
nothing happened).

Not ``gradwire.launch.spawn``: it stops every rank as soon as one fails,
which is the very thing to observe here.
"""
from __future__ import annotations

import datetime
import os
import queue as queue_mod
import signal
import time
from dataclasses import dataclass
from typing import Any

DIE_AT = 3
STEPS = 40
#: the process group's timeout in these runs
GROUP_TIMEOUT = 4.0


@dataclass
class Outcome:
    """What one survivor did: ``raised`` (with the error), ``hang``, ``crash`` or ``continued``."""

    rank: int
    kind: str
    seconds: float | None = None
    error: str = ""


def _worker(rank: int, world: int, strategy: str, fault: str, backend: str, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import gradwire
    from gradwire.strategies import build_strategy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
    torch.set_num_threads(1)
    gradwire.configure("loopback")
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    strat = build_strategy(strategy, momentum=0.9)
    module = strat.wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=strat.optimizer_momentum)
    strat.attach(opt)
    g = torch.Generator().manual_seed(rank)
    dying = rank == world - 1

    def tell(*msg: Any) -> None:  # delivered before the process ends (a queue's feeder thread dies with os._exit)
        out.put(msg)
        out.close()
        out.join_thread()

    try:
        for step in range(STEPS):
            if dying and step == DIE_AT:
                out.put(("fault", rank, time.monotonic()))
                if fault != "stall":
                    out.close()
                    out.join_thread()
                if fault == "exit":
                    os._exit(1)
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(GROUP_TIMEOUT + 60)  # stall: alive, never answering
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(module(x), y).backward()
            strat.step(opt)
        strat.finish(opt)
    except BaseException as exc:  # noqa: BLE001 - the very thing to report
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        tell("raised", rank, time.monotonic(), f"{type(exc).__name__}: {first}")
        os._exit(0)
    tell("continued", rank, time.monotonic())
    os._exit(0)


def run_fault(strategy: str, world: int, fault: str, backend: str = "gradwire") -> list[Outcome]:
    """The survivors' outcomes (ranks ``0 .. world-2``) when rank ``world-1`` meets ``fault``."""
    from gradwire.launch import free_port, rank_context

    if fault not in ("exit", "kill", "stall"):
        raise ValueError(f"fault must be exit, kill or stall, got {fault!r}")
    ctx = rank_context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, strategy, fault, backend, port, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    survivors = set(range(world - 1))
    outcomes: dict[int, Outcome] = {}
    t_fault: float | None = None
    deadline = time.monotonic() + 120.0  # set to the fault time + timeout + 5 s once the fault happens
    try:
        while len(outcomes) < len(survivors) and time.monotonic() < deadline:
            try:
                msg = out.get(timeout=0.1)
            except queue_mod.Empty:
                for r in survivors - set(outcomes):
                    code = procs[r].exitcode
                    if code is not None and code != 0:
                        outcomes[r] = Outcome(r, "crash", error=f"exit code {code}")
                continue
            kind, rank = msg[0], msg[1]
            if kind == "fault":
                t_fault = msg[2]
                deadline = t_fault + GROUP_TIMEOUT + 5.0
            elif rank in survivors:
                seconds = None if t_fault is None else msg[2] - t_fault
                outcomes[rank] = Outcome(rank, kind, seconds, msg[3] if kind == "raised" else "")
        for r in survivors - set(outcomes):
            outcomes[r] = Outcome(r, "hang", error=f"nothing within {GROUP_TIMEOUT + 5:.0f} s of the fault")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    return [outcomes[r] for r in sorted(outcomes)]
