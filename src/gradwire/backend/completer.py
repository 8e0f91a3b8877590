"""When does a collective complete? Clocks and the completer thread.

Realtime clock: a collective completes at ``max(modelled_done, inner_done)``
in wall time. The waiting never happens in the caller's thread: the inner
collective's future fires a callback, and if the modelled time has not come
yet, one daemon thread per process (:class:`Completer`) completes the op's
future at its deadline. Compute placed between issue and wait therefore
overlaps the simulated transfer, as on a real NIC.

Virtual clock: nothing waits. The simulated clock of this rank is wall time
plus an offset; when an op completes, the offset grows so that the clock shows
at least the op's modelled completion. Communication is therefore never
hidden behind compute in virtual mode (a conservative what-if); realtime mode
is the one that measures overlap.

Point-to-point ops are the exception: a program overlaps ``isend`` with the
``recv`` it issues next (full duplex), and an isend that completes in the
background before that recv is issued must not move the clock under it (the
recv would then start one transfer late). Their completion is *deferred*
(:meth:`Clock.defer`) and applied when the program observes it: waiting on
that op's Work, or reading :func:`gradwire.clock`.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

__all__ = ["Completer", "Clock", "COMPLETER", "CLOCK", "run_guarded"]

_LOG = logging.getLogger("gradwire")


class Clock:
    """This rank's clock: ``time.perf_counter()`` plus the virtual offset."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._deferred = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() + self._offset

    def advance_to(self, t: float) -> None:
        """Make the clock read at least ``t`` from now on (virtual mode)."""
        with self._lock:
            lag = t - (time.perf_counter() + self._offset)
            if lag > 0:
                self._offset += lag

    def defer(self, t: float) -> None:
        """Remember a completion at ``t`` that the program has not observed yet (point-to-point)."""
        with self._lock:
            self._deferred = max(self._deferred, t)

    def observe(self) -> float:
        """Apply every deferred completion; return the clock."""
        with self._lock:
            t, self._deferred = self._deferred, 0.0
        if t:
            self.advance_to(t)
        return self.now()

    def reset(self) -> None:
        with self._lock:
            self._offset = 0.0
            self._deferred = 0.0


class Completer:
    """One daemon thread that runs callbacks at given perf_counter deadlines.

    A callback that raises does not end the thread: its error goes to the
    ``on_error`` given with it (an op's: the op fails with it), and the
    thread goes on with the next deadline. Were the thread to die, every
    later realtime op would wait for a completion that never comes, until
    its timeout. :meth:`close` stops the thread; a later :meth:`at` starts a
    new one.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None], Callable[[BaseException], None] | None]] = []
        self._cv = threading.Condition()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closing = False

    def at(self, deadline: float, fn: Callable[[], None],
           on_error: Callable[[BaseException], None] | None = None) -> None:
        """Run ``fn()`` on the completer thread at ``deadline`` (or just after); ``on_error(exc)`` if it raises."""
        with self._cv:
            if self._thread is None:
                self._closing = False
                self._thread = threading.Thread(target=self._loop, name="gradwire-completer", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (deadline, next(self._ids), fn, on_error))
            self._cv.notify()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread (callbacks still queued are dropped) and wait up to ``timeout`` s for it."""
        with self._cv:
            thread, self._thread = self._thread, None
            self._closing = True
            self._heap.clear()
            self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closing:
                        return
                    if not self._heap:
                        self._cv.wait()
                        continue
                    delay = self._heap[0][0] - time.perf_counter()
                    if delay <= 0:
                        _, _, fn, on_error = heapq.heappop(self._heap)
                        break
                    self._cv.wait(delay)
            run_guarded(fn, on_error)  # outside the lock: it may schedule more


def run_guarded(fn: Callable[[], None], on_error: Callable[[BaseException], None] | None) -> None:
    """``fn()``; its error to ``on_error``, and logged where there is none or that raises too."""
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the thread must live on; the op learns of it through on_error
        try:
            if on_error is None:
                raise
            on_error(exc)
        except BaseException:  # noqa: BLE001
            _LOG.exception("gradwire: a completion callback raised")


COMPLETER = Completer()
CLOCK = Clock()
