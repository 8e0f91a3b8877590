"""Per-step communication figures from the backend's event log.

- Modelled communication of a step: the sum of ``model_seconds`` of every
  collective *issued* inside the step's window, whenever it completed (a
  ``delayed`` step's averages complete during the next step, but they are this
  step's traffic).
- Exposed communication: the time the training thread waited, as the wait
  windows each strategy records (:meth:`gradwire.strategies.Strategy.pop_waits`).
  :func:`split_exposed` splits it into the part spent waiting for the
  *modelled network* and the rest: the other rank reaching the collective late
  (the real gloo op finished after the modelled time, e.g. under CPU
  contention), compression work in callbacks, thread wake-ups.

Windows and waits are in ``gradwire.clock()`` seconds, the clock the events
are stamped with; strategies stamp waits with ``time.perf_counter()``, which is
that clock on the realtime backend (the one that measures overlap).
"""
from __future__ import annotations

import bisect
from typing import Iterable, Sequence

__all__ = ["network_wait", "split_exposed", "step_comm_seconds"]


def step_comm_seconds(events: Iterable[object], windows: Sequence[tuple[float, float]]) -> tuple[list[float], int]:
    """Sum modelled seconds per window; return (per-window seconds, collectives counted).

    Events outside every window (setup, evaluation, the final drain) are ignored.
    """
    starts = [w[0] for w in windows]
    out = [0.0] * len(windows)
    counted = 0
    for e in events:
        issued = getattr(e, "issued")
        i = bisect.bisect_right(starts, issued) - 1
        if i >= 0 and issued < windows[i][1]:
            out[i] += getattr(e, "model_seconds")
            counted += 1
    return out, counted


def network_wait(start: float, end: float, events: Iterable[object]) -> float:
    """Seconds of the wait ``[start, end]`` during which the network model still carried an awaited op.

    The awaited ops are those that completed inside the wait (an op that
    completed later was not waited for; one that completed before did not
    block). Op ``e`` blocks on the network over ``[e.issued, e.modelled_done]``
    (queueing on the busy link included); the rest of the wait, up to
    ``e.completed``, is the real collective finishing late (the peer) or CPU
    work. Overlapping spans of several ops count once.
    """
    spans = sorted(
        (max(start, getattr(e, "issued")), min(end, getattr(e, "modelled_done")))
        for e in events
        if start < getattr(e, "completed") <= end and not getattr(e, "error", None)
    )
    total, reach = 0.0, start
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            total += b - a
            reach = b
    return total


def split_exposed(events: Iterable[object], waits: Sequence[Sequence[tuple[float, float]]]) -> list[float]:
    """Per step, the seconds its waits spent waiting for the modelled network (:func:`network_wait`).

    ``waits[i]`` holds step i's wait windows. The remainder of a step's exposed
    time (sum of its waits minus this) is the peer or CPU share.
    """
    done = sorted((e for e in events if getattr(e, "completed", 0.0)), key=lambda e: getattr(e, "completed"))
    keys = [getattr(e, "completed") for e in done]
    out = []
    for step_waits in waits:
        total = 0.0
        for start, end in step_waits:
            lo, hi = bisect.bisect_right(keys, start), bisect.bisect_right(keys, end)
            total += network_wait(start, end, done[lo:hi])
        out.append(total)
    return out
