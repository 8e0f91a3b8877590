"""Profile communication of a training job: what the network cost, what stayed exposed.

A :class:`ProfileSession` brackets a region of a rank's work. On exit it reads
the backend's counters and event log, and the windows in which its thread
waited:

- per op type: calls, payload bytes, wire bytes, modelled seconds (from the
  backend's ledger, the same counters ``gradwire.stats()`` reports);
- communication time: how long at least one collective of this rank was in
  flight (issue to completion, overlaps counted once), from the event log;
- exposed communication: how long the thread that entered the session was
  blocked waiting for a collective (:mod:`gradwire.profile.waits`: its
  ``Work.wait`` and future waits, and DDP's wait at the end of backward),
  counted only while a collective was in flight. So exposed <= communication,
  and neither a busy machine (a thread waiting for a core) nor waiting for the
  other ranks to start counts as communication. The rest of the region is
  compute;
- optionally torch.profiler's events, merged with the simulated network's
  events into one Chrome/Perfetto trace (one timeline, Unix-time based);
- per training step: forward, backward, each DDP bucket's size and ready
  time, the optimizer (:mod:`gradwire.profile.steps`), for ``gradwire predict``;
- with ``ops`` steps, each op's compute on the rank's device over a window
  of that many optimizer steps (:mod:`gradwire.profile.ops`: what
  ``device=profile:DIR`` replays on the simulated clock);
- where the rank computed (:func:`host`): its host, the CPU cores it may
  use, and whether it used CUDA, so that ``gradwire predict`` knows when the
  ranks of a CPU job shared cores (their compute then ran slower than it
  would with a core, or a device, each).

Times are on gradwire's clock (:func:`gradwire.clock`): wall time on the
realtime clock; on the virtual clock they include the simulated waiting.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gradwire
from gradwire.backend import condition_events
from gradwire.backend.accounting import LEDGER
from gradwire.backend.completer import CLOCK
from gradwire.exchange.chooser import trace_events as auto_trace_events
from gradwire.profile.ops import OpRecorder
from gradwire.profile.steps import HookRecorder, steps
from gradwire.profile.waits import WaitRecorder, length, overlap, union

__all__ = ["ProfileResult", "ProfileSession", "communication", "exposed_by_op", "profile", "merge_traces"]


@dataclass
class ProfileResult:
    """What one rank's profiled region cost."""

    rank: int
    wall_seconds: float
    """length of the profiled region"""
    comm_seconds: float
    """time with at least one collective of this rank in flight"""
    exposed_seconds: float
    """time the training thread was blocked on a collective in flight (<= comm_seconds)"""
    #: per op type and "total": calls, payload_bytes, sent_bytes, wire_bytes, model_seconds, ...
    ops: dict[str, dict[str, float]] = field(default_factory=dict)
    #: per training step: forward, backward, DDP buckets, optimizer (:func:`gradwire.profile.steps.steps`)
    steps: list[dict[str, Any]] = field(default_factory=list)
    #: the strategy of each DDP comm hook registered in the region (:func:`gradwire.profile.steps.strategy_label`)
    hooks: list[str] = field(default_factory=list)
    #: where the rank computed (:func:`host`)
    host: dict[str, Any] = field(default_factory=dict)
    #: per-op compute of a window of steps (:meth:`gradwire.profile.ops.OpRecorder.summary`); None: not recorded
    op_record: dict[str, Any] | None = None

    @property
    def hidden_seconds(self) -> float:
        """communication that ran while the training thread computed"""
        return self.comm_seconds - self.exposed_seconds

    @property
    def compute_seconds(self) -> float:
        """the region less exposed communication"""
        return self.wall_seconds - self.exposed_seconds

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hidden_seconds"] = self.hidden_seconds
        d["compute_seconds"] = self.compute_seconds
        return d


class ProfileSession:
    """Context manager: ``with gradwire.profile.profile(trace="t.json") as s: train()``.

    Args:
        trace: write a Chrome trace here on exit (the network's events, plus
            torch.profiler's when ``torch_profiler`` is true).
        torch_profiler: also run torch.profiler (CPU activities) in the region.
        ops: time every op of this many optimizer steps (after the first two),
            :mod:`gradwire.profile.ops`; 0: none.
    """

    def __init__(self, trace: str | Path | None = None, torch_profiler: bool = False, ops: int = 0) -> None:
        self.trace = Path(trace) if trace else None
        self.torch_profiler = torch_profiler
        self.ops = ops
        self._ops: OpRecorder | None = None
        self.result: ProfileResult | None = None
        self._prof: Any = None
        self._waits: WaitRecorder | None = None
        self._hooks: HookRecorder | None = None
        self._start = 0.0

    def __enter__(self) -> "ProfileSession":
        gradwire.reset_stats()
        if self.torch_profiler:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            self._prof = torch_profile(activities=[ProfilerActivity.CPU])
            self._prof.__enter__()
        self._waits = WaitRecorder().start()  # watches the thread that enters: the training thread
        self._hooks = HookRecorder().start()
        if self.ops:
            self._ops = OpRecorder(self.ops).start()
        self._start = CLOCK.now()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> ProfileResult:
        """End the region (idempotent) and return its result."""
        if self.result is not None:
            return self.result
        if self._waits is None:
            raise RuntimeError("stop() before the session started; use it as `with ProfileSession(): ...`")
        end = CLOCK.now()
        if self._ops is not None:
            self._ops.stop()
        self._waits.stop()
        hooks = self._hooks
        if hooks is not None:
            hooks.stop()
        comm, exposed = communication(self._start, end, gradwire.events(), self._waits.windows)
        torch_trace: dict | None = None
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            tmp = Path(f"/tmp/gradwire-torchprof-{LEDGER.rank}-{time.time_ns()}.json")
            self._prof.export_chrome_trace(str(tmp))
            torch_trace = json.loads(tmp.read_text())
            tmp.unlink(missing_ok=True)
        ops = gradwire.stats().as_dict()
        for op, seconds in exposed_by_op(self._start, end, gradwire.events(), self._waits.windows).items():
            if op in ops:
                ops[op]["exposed_seconds"] = seconds
        if "total" in ops:
            ops["total"]["exposed_seconds"] = exposed
        self.result = ProfileResult(LEDGER.rank, end - self._start, comm, exposed, ops, host=host())
        if hooks is not None:
            self.result.steps = steps(self._waits.backwards, hooks.optimizer, hooks.buckets, gradwire.events(),
                                      self._waits.windows, hooks.closures, hooks.forwards)
            self.result.hooks = hooks.hooks
        if self._ops is not None:
            self.result.op_record = self._ops.summary()
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            self.trace.write_text(json.dumps(merge_traces(LEDGER.trace_events() + condition_events() + auto_trace_events(LEDGER.rank),
                                                         torch_trace)))
        return self.result


profile = ProfileSession


def host() -> dict[str, Any]:
    """Where this process computes: ``{"hostname", "cores", "cuda"}``.

    ``cores``: the CPU cores its affinity mask allows (what the ranks of one
    host share); ``cuda``: whether it initialised CUDA (then its compute ran
    on a device, not on those cores).
    """
    import socket

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"hostname": socket.gethostname(), "cores": cores, "cuda": bool(torch.cuda.is_initialized())}


def communication(start: float, end: float, events: list[Any], waits: list[tuple[float, float]]) -> tuple[float, float]:
    """(communication, exposed) seconds of the region ``[start, end]``.

    Communication: the union of the ops' ``[issued, completed]`` spans.
    Exposed: the part of it during which the thread was in one of ``waits``.
    """

    def clip(spans: Any) -> list[tuple[float, float]]:
        return union((max(a, start), min(b, end)) for a, b in spans)

    in_flight = clip((e.issued, e.completed or end) for e in events)
    return length(in_flight), overlap(in_flight, clip(waits))


def exposed_by_op(start: float, end: float, events: list[Any], waits: list[tuple[float, float]]) -> dict[str, float]:
    """Per op type: how long the thread waited while an op of that type was in flight.

    As :func:`communication`'s exposed time, restricted to one op type's
    spans; where ops of two types overlap, the wait counts for both.
    """
    def clip(spans: Any) -> list[tuple[float, float]]:
        return union((max(a, start), min(b, end)) for a, b in spans)

    waited = clip(waits)
    by_op: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        by_op.setdefault(e.op, []).append((e.issued, e.completed or end))
    return {op: overlap(clip(spans), waited) for op, spans in by_op.items()}


def merge_traces(network_events: list[dict], torch_trace: dict | None) -> dict:
    """One Chrome trace from the network's events (Unix µs) and a torch.profiler trace.

    torch.profiler (Kineto) writes ``ts`` relative to ``baseTimeNanoseconds``;
    the network's events are absolute Unix microseconds. Shift ours onto
    torch's base so both land on one timeline.
    """
    if torch_trace is None:
        return {"traceEvents": network_events, "displayTimeUnit": "ms"}
    base_us = torch_trace.get("baseTimeNanoseconds", 0) / 1e3
    pid = os.getpid()  # torch.profiler names processes by pid: put the network beside them
    shifted = [dict(e, pid=pid, **({"ts": e["ts"] - base_us} if "ts" in e else {})) for e in network_events]
    merged = dict(torch_trace)
    merged["traceEvents"] = list(torch_trace.get("traceEvents", [])) + shifted
    return merged
