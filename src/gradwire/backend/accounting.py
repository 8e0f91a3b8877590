"""Per-op accounting and the event log of the simulated network.

Every collective the ``gradwire`` backend runs leaves one :class:`OpRecord`
(what, how many bytes, when it was issued, when the link started it, when the
model said it was done, when the real inner collective finished) and adds to
the per-op counters in :class:`OpStats`. Both are per process (per rank) and
thread-safe: completions are recorded on the inner backend's threads.

The event log exports as a Chrome / Perfetto trace (``chrome://tracing``,
https://ui.perfetto.dev): one process per rank, one track per process group.
"""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

__all__ = ["OpRecord", "OpStats", "Stats", "OpAccounts", "LEDGER"]

#: offset that turns ``time.perf_counter()`` into Unix seconds, fixed at import,
#: so traces of several ranks on one machine line up.
_PERF_TO_UNIX = time.time() - time.perf_counter()


@dataclass
class OpStats:
    """Counters for one op type on one rank."""

    calls: int = 0
    #: bytes of the buffers handed to the op (nccl-tests size convention)
    payload_bytes: int = 0
    #: payload bytes this rank sends under the modelled algorithm
    sent_bytes: int = 0
    #: sent bytes plus protocol framing: what a NIC counter would show
    wire_bytes: int = 0
    #: modelled seconds of the op on the network (jitter and loss included)
    model_seconds: float = 0.0
    #: seconds the real inner collective took (issue to its completion)
    inner_seconds: float = 0.0
    #: seconds callers spent blocked in ``Work.wait()`` for this op
    blocked_seconds: float = 0.0

    def add(self, other: "OpStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Stats:
    """A snapshot of the counters of this rank, per op type and in total."""

    ops: dict[str, OpStats] = field(default_factory=dict)

    @property
    def total(self) -> OpStats:
        out = OpStats()
        for s in self.ops.values():
            out.add(s)
        return out

    def as_dict(self) -> dict[str, dict[str, float]]:
        d = {op: asdict(s) for op, s in sorted(self.ops.items())}
        d["total"] = asdict(self.total)
        return d


@dataclass
class OpRecord:
    """One op as the simulated network saw it (times in perf_counter seconds)."""

    op: str
    group: str
    seq: int
    payload_bytes: int
    wire_bytes: int
    algorithm: str
    model_seconds: float
    issued: float
    started: float
    #: when the model says the data arrived (realtime: wall clock; virtual: simulated clock)
    modelled_done: float
    inner_done: float = 0.0
    completed: float = 0.0
    error: str | None = None
    #: whether the op carried floating-point data (gradients); integer ops are bookkeeping, such as the map of
    #: used parameters DDP all-reduces with ``find_unused_parameters=True``
    floating: bool = True


class OpAccounts:
    """Thread-safe counters plus a bounded event log for this process."""

    def __init__(self, max_events: int = 200_000) -> None:
        self._lock = threading.Lock()
        self._ops: dict[str, OpStats] = {}
        self._events: deque[OpRecord] = deque(maxlen=max_events)
        self.rank = 0

    def record(self, event: OpRecord, sent_bytes: int, inner_seconds: float) -> None:
        with self._lock:
            s = self._ops.get(event.op)
            if s is None:
                s = self._ops[event.op] = OpStats()
            s.calls += 1
            s.payload_bytes += event.payload_bytes
            s.sent_bytes += sent_bytes
            s.wire_bytes += event.wire_bytes
            s.model_seconds += event.model_seconds
            s.inner_seconds += inner_seconds
            self._events.append(event)

    def add_blocked(self, op: str, seconds: float) -> None:
        with self._lock:
            self._ops.setdefault(op, OpStats()).blocked_seconds += seconds

    def snapshot(self) -> Stats:
        with self._lock:
            return Stats({op: OpStats(**asdict(s)) for op, s in self._ops.items()})

    def events(self) -> list[OpRecord]:
        with self._lock:
            return list(self._events)

    def reset(self) -> None:
        with self._lock:
            self._ops.clear()
            self._events.clear()

    def trace_events(self, pid: int | None = None) -> list[dict]:
        """Chrome trace events ("X" complete events, microseconds, Unix epoch)."""
        pid = self.rank if pid is None else pid
        out: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid} network"}}]
        for e in self.events():
            end = e.completed or e.modelled_done
            out.append({
                "name": e.op, "cat": "gradwire", "ph": "X", "pid": pid, "tid": f"net:{e.group}",
                "ts": (e.started + _PERF_TO_UNIX) * 1e6, "dur": max(0.0, end - e.started) * 1e6,
                "args": {"seq": e.seq, "bytes": e.payload_bytes, "wire_bytes": e.wire_bytes,
                         "algorithm": e.algorithm, "model_us": e.model_seconds * 1e6,
                         "queued_us": (e.started - e.issued) * 1e6, "error": e.error},
            })
        return out

    def export_trace(self, path: str | Path, extra: Iterable[dict] = ()) -> Path:
        """Write this rank's events as a Chrome/Perfetto trace JSON file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"traceEvents": self.trace_events() + list(extra), "displayTimeUnit": "ms"}))
        return path


#: the ledger of this process; every gradwire process group records here
LEDGER = OpAccounts()
