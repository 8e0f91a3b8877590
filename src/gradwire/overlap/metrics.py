"""Per-step communication figures from the backend's event log.

- Modelled communication of a step: the sum of ``model_seconds`` of every
  collective *issued* inside the step's window, whenever it completed (a
  ``delayed`` step's all_reduce completes during the next step, but it is this
  step's traffic).
- Exposed communication: measured by the strategy as the time the training
  thread waited (:meth:`gradwire.overlap.Strategy.pop_exposed`); compute is the
  step's wall time minus that.

Windows are ``(start, end)`` in ``gradwire.clock()`` seconds, the clock the
events are stamped with.
"""
from __future__ import annotations

import bisect
from typing import Iterable, Sequence

__all__ = ["step_comm_seconds"]


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
