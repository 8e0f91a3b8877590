"""Profile communication of a training job: what the network cost, what stayed exposed.

A :class:`ProfileSession` brackets a region of a rank's work. On exit it reads
the backend's counters and event log and this thread's CPU time:

- per op type: calls, payload bytes, wire bytes, modelled seconds (from the
  backend's ledger, the same counters ``gradwire.stats()`` reports);
- compute vs exposed communication. The training thread computes or waits;
  waiting on a collective costs no CPU. With one compute thread per rank
  (``OMP_NUM_THREADS=1``, gradwire's launcher default), ``exposed ≈ wall −
  CPU time of the thread``. Trap: on an oversubscribed machine a rank that is
  runnable but not scheduled also looks "exposed"; compare with a run on
  ``loopback`` (see ``gradwire compare``) for a measure free of that;
- optionally torch.profiler's events, merged with the simulated network's
  events into one Chrome/Perfetto trace (one timeline, Unix-time based).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gradwire
from gradwire.backend.accounting import LEDGER

__all__ = ["ProfileResult", "ProfileSession", "profile", "merge_traces"]


@dataclass
class ProfileResult:
    """What one rank's profiled region cost."""

    rank: int
    wall_seconds: float
    cpu_seconds: float
    #: per op type and "total": calls, payload_bytes, sent_bytes, wire_bytes, model_seconds, ...
    ops: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def exposed_seconds(self) -> float:
        return max(0.0, self.wall_seconds - self.cpu_seconds)

    @property
    def compute_seconds(self) -> float:
        return self.wall_seconds - self.exposed_seconds

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exposed_seconds"] = self.exposed_seconds
        d["compute_seconds"] = self.compute_seconds
        return d


class ProfileSession:
    """Context manager: ``with gradwire.profile.profile(trace="t.json") as s: train()``.

    Args:
        trace: write a Chrome trace here on exit (the network's events, plus
            torch.profiler's when ``torch_profiler`` is true).
        torch_profiler: also run torch.profiler (CPU activities) in the region.
    """

    def __init__(self, trace: str | Path | None = None, torch_profiler: bool = False) -> None:
        self.trace = Path(trace) if trace else None
        self.torch_profiler = torch_profiler
        self.result: ProfileResult | None = None
        self._prof: Any = None

    def __enter__(self) -> "ProfileSession":
        gradwire.reset_stats()
        if self.torch_profiler:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            self._prof = torch_profile(activities=[ProfilerActivity.CPU])
            self._prof.__enter__()
        self._wall0 = time.perf_counter()
        self._cpu0 = time.thread_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> ProfileResult:
        """End the region (idempotent) and return its result."""
        if self.result is not None:
            return self.result
        wall = time.perf_counter() - self._wall0
        cpu = time.thread_time() - self._cpu0
        torch_trace: dict | None = None
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            tmp = Path(f"/tmp/gradwire-torchprof-{LEDGER.rank}-{time.time_ns()}.json")
            self._prof.export_chrome_trace(str(tmp))
            torch_trace = json.loads(tmp.read_text())
            tmp.unlink(missing_ok=True)
        self.result = ProfileResult(LEDGER.rank, wall, cpu, gradwire.stats().as_dict())
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            self.trace.write_text(json.dumps(merge_traces(LEDGER.trace_events(), torch_trace)))
        return self.result


profile = ProfileSession


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
