"""Module-level rank functions for multi-process tests (spawn pickles by name)."""
from __future__ import annotations

import os
import datetime


def echo_rank(rank: int, world: int) -> int:
    return rank * 10


def fail_on_rank_one(rank: int, world: int) -> None:
    if rank == 1:
        raise RuntimeError("boom on rank 1")


def die_in_collective(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    if rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(4))


def report_then_fail_on_rank_one(rank: int, world: int) -> int:
    from gradwire.launch import report

    report(("first", rank))
    report(("second", rank))
    if rank == 1:
        raise RuntimeError("boom after reporting")
    return rank


def survivor_of_a_dead_peer(rank: int, world: int, backend: str, net: str | None, timeout_s: float) -> dict:
    """Rank 1's collective partner dies after one all_reduce; rank 0 reports what its next all_reduce raised.

    Rank 1 forks the process that joins the group, and waits for it: the launcher sees rank 1
    finish normally, so it keeps rank 0 alive and hears what rank 0 observed (a rank that
    dies is otherwise noticed first, and the others are killed before they can answer).
    """
    import time

    if rank == 1:
        pid = os.fork()
        if pid:
            return {"child_exit": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}
        try:
            _group_member(rank, world, backend, net, timeout_s)
        finally:
            os._exit(3)  # the peer dies: no teardown, its sockets close with the process
    _group_member(rank, world, backend, net, timeout_s)
    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 20))
    except Exception as exc:  # noqa: BLE001 - what the survivor sees is the result
        return {"raised": type(exc).__name__, "is_runtime_error": isinstance(exc, RuntimeError),
                "message": str(exc)[:500], "seconds": time.monotonic() - t0}
    return {"raised": None, "seconds": time.monotonic() - t0}


def _group_member(rank: int, world: int, backend: str, net: str | None, timeout_s: float) -> None:
    """Join the group and complete one all_reduce with every peer."""
    import torch
    import torch.distributed as dist

    if backend == "gradwire":
        import gradwire

        gradwire.configure(net)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    t = torch.ones(8)
    dist.all_reduce(t)
    assert t[0].item() == world


def environment_seen(rank: int, world: int, names: tuple[str, ...]) -> dict:
    """What a rank sees: the named variables, torch's thread count and distributed debug level."""
    import torch
    import torch.distributed as dist

    return {"env": {n: os.environ.get(n) for n in names}, "threads": torch.get_num_threads(),
            "debug": str(dist.get_debug_level())}


def random_state(rank: int, world: int) -> tuple[int, float]:
    """torch's initial seed in this rank and one draw from the global generator."""
    import torch

    return torch.initial_seed(), float(torch.rand(1))
