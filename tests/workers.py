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
