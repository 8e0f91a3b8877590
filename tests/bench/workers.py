"""Module-level rank functions for the bench tests (spawn pickles them by name)."""
from __future__ import annotations

import datetime


def several_configs_on_gloo(rank: int, world: int, configs: list) -> list:
    """Run each BenchConfig on one gloo group; return every result's wrong count and dtype/redop."""
    import torch.distributed as dist

    from gradwire.bench.driver import run_in_group

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    return [run_in_group(c) for c in configs]
