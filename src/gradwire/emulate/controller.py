"""Follow a changing network while a run goes on: a thread that applies each change of the timeline at its time.

The pure part, which change at which time, is :mod:`gradwire.emulate.timeline`;
this is the clock and the hands. :class:`Controller` owns one thread and the
netlink sockets it changes the links through (:class:`~gradwire.emulate.netlink.Links`):

1. ``Controller(plan, links)`` and :meth:`Controller.prime`; the runner starts the agents, then
   :meth:`Controller.start` with ``t0``, the monotonic time of the first
   agent's start (the run's ``t = 0``, also given to every agent as
   :data:`T0_ENV`);
2. the thread sleeps until a change is due, applies it, records an
   :class:`Applied` (how late it began, how long it took) and hands it to
   ``on_change``; a change that fails stops the thread, and :attr:`error`
   says which and why (the runner then stops the run);
3. :meth:`close` stops the thread, puts the built network back (rates of
   the plan, ports up: what the job's shutdown sends must get through) and
   closes the sockets; it is idempotent and runs on every way out.

Traps:

- A change is due at ``t0 + at``; applying it takes time: a netlink request
  per tbf port and three per htb port, each encoding its rate tables in
  Python. A 4-port htb change measured 20-50 ms of wall time for 11-17 ms
  of CPU under a 1 Gbit/s stream on a busy 2-core host (the first one 90 ms
  before :meth:`Controller.prime`), and now and then 0.1-0.6 s. The rest is
  waiting: for a core, or for the kernel's rtnl lock, which every qdisc and
  link change on the host takes, other namespaces' too (a higher priority
  for the thread did not shorten it). The ports
  change one after the other within that time; changes that come faster
  fall behind, and :attr:`Applied.late` shows by how much.
- The thread must not exist while an agent is being started: the agents'
  start forks this process and runs Python between fork and exec
  (:func:`gradwire.emulate.agents.start_agent`). :meth:`start` comes after.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from gradwire.emulate.plan import EmulationPlan, Port, RateLimit
from gradwire.emulate.timeline import Change, changes, restore

__all__ = ["Applied", "Controller", "LinkControl", "T0_ENV", "apply"]

#: the agents' environment: ``time.monotonic()`` of the run's t = 0 (CLOCK_MONOTONIC is one clock for the whole host)
T0_ENV = "GRADWIRE_EMULATE_T0"


class LinkControl(Protocol):
    """What the controller changes (:class:`gradwire.emulate.netlink.Links`, or a recorder in tests)."""

    def set_rate(self, port: Port, rate: RateLimit) -> None: ...

    def set_up(self, up: bool) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Applied:
    """One change as it happened."""

    change: Change
    began: float
    """seconds since t0 when applying it began"""
    seconds: float
    """how long applying it took"""

    @property
    def late(self) -> float:
        """How long after its time applying it began."""
        return self.began - self.change.at

    def describe(self, plan: EmulationPlan) -> str:
        return f"{self.change.describe(plan)} (applied at {self.began:.3f}s, in {self.seconds * 1e3:.1f} ms)"


def apply(links: LinkControl, plan: EmulationPlan, change: Change) -> None:
    """Make ``change`` on ``links``: down first, then the rates, then up (so no packet meets an old rate)."""
    if change.up is False:
        links.set_up(False)
    for index, rate in change.rates:
        links.set_rate(plan.ports[index], rate)
    if change.up is True:
        links.set_up(True)


class Controller:
    """The thread that follows ``plan``'s schedule on ``links`` (module doc)."""

    def __init__(self, plan: EmulationPlan, links: LinkControl,
                 on_change: Callable[[Applied], None] | None = None) -> None:
        self.plan = plan
        self.links = links
        self.on_change = on_change
        self.applied: list[Applied] = []
        """every change made, in order"""
        self.error: str | None = None
        """why the schedule stopped being followed, or None"""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._restored = False

    def prime(self) -> None:
        """Make the change back to the built network once, before the job starts.

        It changes nothing on the links, proves that the kernel takes a
        change in place before anything depends on it, and warms pyroute2's
        message encoders: a first htb change measured 90 ms, the next ones 35.
        """
        apply(self.links, self.plan, restore(self.plan))

    def start(self, t0: float) -> None:
        """Follow the schedule from ``t0`` (``time.monotonic()`` of t = 0) in a thread of this object's own."""
        self._t0 = t0
        self._thread = threading.Thread(target=self._follow, name="gradwire-emulate-schedule", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        for change in changes(self.plan):
            if self._stop.wait(max(self._t0 + change.at - time.monotonic(), 0.0)):
                return
            began = time.monotonic()
            try:
                apply(self.links, self.plan, change)
            except Exception as exc:  # noqa: BLE001 - any failure of the kernel stops the schedule, said once
                self.error = f"{change.describe(self.plan)} failed: {type(exc).__name__}: {exc}"
                return
            done = Applied(change, began - self._t0, time.monotonic() - began)
            self.applied.append(done)
            if self.on_change is not None:
                self.on_change(done)

    def close(self) -> None:
        """Stop the thread, restore the built network if anything changed, close the sockets (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if (self.applied or self.error) and not self._restored:
                self._restored = True  # once: a second close (after a signal cut the first) only closes
                apply(self.links, self.plan, restore(self.plan))
        finally:
            self.links.close()
