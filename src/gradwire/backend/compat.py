"""Where torch.distributed accepts a feature only by its backend's name.

``dist.monitored_barrier`` raises "monitored_barrier is only implemented for
GLOO backend" for every group whose backend name is not ``gloo``, before it
looks at the group. A ``gradwire`` group runs every op on an inner gloo group,
which implements the monitored barrier, so the name check is the only thing
in the way. :func:`install` wraps torch's function once: a ``gradwire`` group
takes the barrier itself (:meth:`GradwireProcessGroup.monitored_barrier`),
every other group goes to torch's own function unchanged.
"""
from __future__ import annotations

import functools
import warnings
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d_py

__all__ = ["install"]


def install() -> None:
    """Route ``dist.monitored_barrier`` on ``gradwire`` groups to the group (idempotent)."""
    original = c10d_py.monitored_barrier
    if getattr(original, "_gradwire", False):
        return

    @functools.wraps(original)
    def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        from gradwire.backend.process_group import GradwireProcessGroup

        pg = group
        if pg is None and dist.is_initialized():
            pg = c10d_py._get_default_group()
        if not isinstance(pg, GradwireProcessGroup):
            return original(group, timeout, wait_all_ranks)
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            warnings.warn(f"Please specify timeout arg as a timedelta. Converting current value of {timeout} "
                          "assuming it represents seconds", stacklevel=2)
            timeout = timedelta(seconds=timeout)
        if timeout is not None:
            c10d_py._check_valid_timeout(timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks)

    monitored_barrier._gradwire = True  # type: ignore[attr-defined]
    c10d_py.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier
