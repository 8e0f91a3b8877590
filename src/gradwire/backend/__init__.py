"""The ``gradwire`` torch.distributed backend and its accounting.

Importing this module registers the backend name ``gradwire`` with
``torch.distributed``; ``gradwire/__init__`` does that on ``import gradwire``.
"""
from __future__ import annotations

import atexit
import logging
import os
import uuid
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from gradwire.backend import compat, names, teardown, work
from gradwire.backend.accounting import LEDGER, OpRecord, OpStats, Stats
from gradwire.backend.completer import CLOCK
from gradwire.backend.simclock import SIMCLOCK
from gradwire.backend.config import ENV_VAR, configure, current_spec
from gradwire.backend.names import is_gradwire, report_as
from gradwire.backend.process_group import GradwireProcessGroup, GradwireWork
from gradwire.device import parse_device
from gradwire.net import NetworkModel
from gradwire.net.spec import resolve_topology

__all__ = [
    "BACKEND_NAME", "ENV_VAR", "condition_events", "Event", "GradwireProcessGroup", "GradwireWork", "OpStats", "Stats",
    "OpRecord",
    "clock", "configure", "current_spec", "events", "export_trace", "group_over", "groups", "is_gradwire", "network",
    "register",
    "report_as", "reset_stats", "stats",
]

#: the name :class:`OpRecord` had before; kept so that ``gradwire.backend.Event`` still works
Event = OpRecord

BACKEND_NAME = "gradwire"
_LOG = logging.getLogger("gradwire")
_model: NetworkModel | None = None
#: the clock's time when the default group was created: t = 0 of a changing network's schedule
_origin = 0.0
#: this job's id, the same on all its ranks (from the store): what a shared link (``link=NAME``) tells jobs apart by
_job = ""
#: this process's live gradwire groups by group id (torch hides the Python object behind its wrapper)
_groups: "weakref.WeakValueDictionary[str, GradwireProcessGroup]" = weakref.WeakValueDictionary()


def _create(opts: Any, _pg_options: Any = None) -> GradwireProcessGroup:
    """Creator called by torch.distributed for the default group and new_group()."""
    global _model, _origin, _job
    global_ranks = list(opts.global_ranks_in_group)
    if not global_ranks or _model is None:  # the default group: (re)build the model
        world = opts.group_size if not global_ranks else dist.get_world_size()
        # topology=auto: nodes and ranks per node of a torchrun launch (GROUP_RANK, LOCAL_WORLD_SIZE)
        spec = current_spec()
        if spec.unused_by_local() and opts.group_rank == 0:
            _LOG.warning("gradwire: the local network has no links; %s in the spec have no effect",
                         ", ".join(spec.unused_by_local()))
        _model = NetworkModel(resolve_topology(spec, world, os.environ), world)
        if spec.clock == "sim":  # each training starts at t = 0 of its simulated cluster
            device = parse_device(spec.device or "host")
            if device.kind == "recorded":  # a recording of another world size prices other ops: refuse it
                device.recording.check_world(world)
            SIMCLOCK.enable(device)
            rank = opts.group_rank if not global_ranks else dist.get_rank()
            SIMCLOCK.slow_down(_model.compute_factor(rank))
            SIMCLOCK.replay_steps(rank)
        else:
            SIMCLOCK.disable()
        _origin = CLOCK.now()
        if _model.spec.link is not None:
            _job = _job_id(opts.store, opts.group_rank)
        LEDGER.rank = opts.group_rank if not global_ranks else dist.get_rank()
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(minutes=30)
    group = GradwireProcessGroup(opts.store, opts.group_rank, opts.group_size, timeout,
                                 global_ranks, str(opts.group_id), _model, _origin, _job)
    _groups[group.group_id] = group
    return group


def group_over(store: dist.Store, rank: int, size: int, timeout: timedelta, name: str) -> GradwireProcessGroup:
    """A gradwire group of ``size`` ranks that meet through ``store``, on this process's network.

    For libraries that build their process groups themselves, outside
    ``init_process_group`` and ``new_group`` (torchft's replica groups, which
    it rebuilds whenever the quorum changes): the group's ops are priced on
    the network model of this process's default ``gradwire`` group (the
    group's ranks as nodes ``0 .. size - 1`` of it), so their bytes and waits
    are counted and simulated as every other op's.

    Raises:
        RuntimeError: no default ``gradwire`` group in this process (there is no network to price on).
    """
    if _model is None:
        raise RuntimeError("gradwire.backend.group_over needs this process's default group to be a gradwire one "
                           "(init_process_group(\"gradwire\") first): its network prices the new group's ops")
    group = GradwireProcessGroup(store, rank, size, timeout, (), name, _model, _origin, _job)
    _groups[group.group_id] = group
    return group


def _job_id(store: dist.Store, rank: int) -> str:
    """An id every rank of this job shares: rank 0 draws it, the others read it from the store."""
    if rank == 0:
        store.set("gradwire/job", uuid.uuid4().hex)
    return store.get("gradwire/job").decode()


def register() -> None:
    """Register the ``gradwire`` backend (idempotent), let ``dist.monitored_barrier`` take its groups,
    and keep the new groups of a group that reports another backend's name gradwire groups (names.py)."""
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    compat.install()
    names.install()


def network() -> NetworkModel | None:
    """The network model of the current default ``gradwire`` group, if any."""
    return _model


def groups() -> dict[str, GradwireProcessGroup]:
    """This process's live ``gradwire`` groups by group id, e.g. to read ``cuda_inner``."""
    return dict(_groups)


def stats(reset: bool = False) -> Stats:
    """This rank's counters per op type; ``reset=True`` zeroes them after reading."""
    snap = LEDGER.snapshot()
    if reset:
        LEDGER.reset()
    return snap


def reset_stats() -> None:
    """Zero this rank's counters and event log."""
    LEDGER.reset()


def events() -> list[OpRecord]:
    """This rank's op records, oldest first (the most recent ops, bounded): one :class:`OpRecord` per op.

    These are the ops the backend ran, not the network's changes over time
    (those are :class:`gradwire.net.schedule.NetworkChange`, and the link's
    condition over time is :func:`condition_events`).
    """
    return LEDGER.events()


def export_trace(path: str | Path) -> Path:
    """Write this rank's event log as a Chrome/Perfetto trace JSON (with the link's condition on a changing network)."""
    return LEDGER.export_trace(path, condition_events())


def condition_events(until: float | None = None) -> list[dict[str, Any]]:
    """Chrome trace counter events of the link's condition over time, on a network that changes (else none).

    One "link" counter track per rank: the inter-node bandwidth in Mbit/s (0
    while the link is down) and the latency in ms, a sample at every change
    from the default group's creation until ``until`` (default: now, on the
    backend's clock).
    """
    model = _model
    if model is None or model.schedule is None:
        return []
    from gradwire.backend.accounting import _PERF_TO_UNIX

    end = (CLOCK.now() if until is None else until) - _origin
    out: list[dict[str, Any]] = []
    t = 0.0
    for change, cond in model.schedule.segments(0.0, model.spec.bandwidth):
        rate = 0.0 if cond.down else (model.spec.bandwidth if cond.bandwidth is None else cond.bandwidth)
        latency = model.spec.latency if cond.latency is None else cond.latency
        out.append({"name": "link", "ph": "C", "pid": LEDGER.rank, "ts": (_origin + t + _PERF_TO_UNIX) * 1e6,
                    "args": {"Mbit/s": rate / 1e6, "latency ms": latency * 1e3}})
        if change >= end or len(out) >= 100_000:
            break
        t = change
    return out


def clock() -> float:
    """This rank's clock in seconds: wall time (``time.perf_counter()``), or its simulated cluster time (``clock=sim``).

    On the simulated clock a reading is the rank's time on the cluster it
    simulates: its compute priced on the device, and every completion it has
    observed (:mod:`gradwire.backend.simclock`).
    """
    return CLOCK.observe()


def mark_step() -> None:
    """Tell the simulated clock a training step ended (a ``step:TIME`` device scales compute by the steps)."""
    SIMCLOCK.mark_step()


def exposed() -> float:
    """Seconds this rank's simulated clock has jumped to a completion: communication not hidden behind compute.

    0 on the realtime clock (strategies measure their waits there).
    """
    return SIMCLOCK.exposed if SIMCLOCK.enabled else 0.0


def detached(name: str = "background") -> Any:
    """A context for ops a strategy exchanges in the background: on the simulated clock they are observed
    only where it calls :func:`observe` with the yielded tag (see :mod:`gradwire.backend.simclock`)."""
    return SIMCLOCK.detached(name)


def arrived(tag: Any, future: Any) -> bool:
    """Whether a background op has arrived: on the simulated clock, its end is not after the rank's time;
    on the realtime clock, its future is done."""
    if SIMCLOCK.enabled and tag is not None:
        return bool(tag.end <= SIMCLOCK.now())
    return bool(future.done())


def observe(tag: Any = None) -> None:
    """The rank waited for every op issued under ``tag`` (from :func:`detached`), and for ops that no tag
    names and that really ended; no-op on the realtime clock."""
    if SIMCLOCK.enabled:
        if tag is not None:
            SIMCLOCK.observe(tag)
        SIMCLOCK.observe_loose()


register()
# gloo's workers drop their last works before the interpreter tears down (teardown.py), after the
# backend's own threads stop (they are daemons: none holds up the exit; atexit runs the last registered first)
atexit.register(teardown.settle_at_exit)
atexit.register(work.close_threads)
