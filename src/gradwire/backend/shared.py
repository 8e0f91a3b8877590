"""A bottleneck that several jobs on one machine share (``link=NAME``): each gets its fair share while others send.

Two gradwire jobs started with the same ``link=NAME`` in their specs sit
behind one simulated switch port. A small file in shared memory
(``/dev/shm/gradwire-link-NAME.json``, else the temporary folder) holds, per
job, the instant until which it has data on the link (the backend's realtime
clock is ``CLOCK_MONOTONIC``, one clock for every process of the machine).
When an op starts, the jobs whose data is still on the link are counted, and
the op is priced on ``bandwidth / (1 + others)``: TCP flows on one
bottleneck converge to equal shares. The op then marks the job busy until
its modelled end.

Traps:
- Shares are taken when an op starts: an op already in flight when another
  job begins keeps its price, so the first op of an overlap finishes early.
  For jobs that keep sending (training, a benchmark loop) every later op
  sees the other and the shares come out equal.
- A job's ranks share one entry (the job's id comes from its store, so all
  its ranks write the same), and entries older than a minute are dropped:
  a killed job does not hold the link for ever.
- Realtime clock only (a virtual clock is each process's own).
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

__all__ = ["SharedLink"]

#: an entry whose busy time is this far in the past belongs to a job that ended
STALE_SECONDS = 60.0


def _folder() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class SharedLink:
    """The shared state of one named link, as seen by one job."""

    def __init__(self, name: str, job: str) -> None:
        self.name = name
        self.job = job
        self.path = _folder() / f"gradwire-link-{name}.json"

    def _update(self, until: float | None, at: float) -> int:
        """Under the file's lock: count the other jobs busy after ``at``; record this job busy until ``until``."""
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                text = f.read()
                try:
                    busy: dict[str, float] = json.loads(text) if text.strip() else {}
                except json.JSONDecodeError:  # a writer died mid-write: start over
                    busy = {}
                now = time.perf_counter()
                busy = {j: t for j, t in busy.items() if t > now - STALE_SECONDS}
                others = sum(1 for j, t in busy.items() if j != self.job and t > at)
                if until is not None:
                    busy[self.job] = max(busy.get(self.job, 0.0), until)
                    f.seek(0)
                    f.truncate()
                    f.write(json.dumps(busy))
                    f.flush()
                return others
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def others(self, at: float) -> int:
        """How many other jobs still have data on the link at ``at`` (the backend's clock)."""
        return self._update(None, at)

    def busy_until(self, until: float) -> None:
        """This job has data on the link until ``until``."""
        self._update(until, until)
