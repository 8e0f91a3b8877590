"""When does a collective complete? Clocks and the completer thread.

Realtime clock: a collective completes at ``max(modelled_done, inner_done)``
in wall time. The waiting never happens in the caller's thread: the inner
collective's future fires a callback, and if the modelled time has not come
yet, one daemon thread per process (:class:`Completer`) completes the op's
future at its deadline. Compute placed between issue and wait therefore
overlaps the simulated transfer, as on a real NIC.

Simulated clock (``clock=sim``): nothing waits and no wall time is read;
:mod:`gradwire.backend.simclock` keeps each rank's time, and :data:`CLOCK`
reads it.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

from gradwire.backend.simclock import SIMCLOCK

__all__ = ["Completer", "Clock", "COMPLETER", "CLOCK", "run_guarded"]

_LOG = logging.getLogger("gradwire")


class Clock:
    """This rank's clock: ``time.perf_counter()`` (realtime), or the simulated cluster clock once enabled.

    On the simulated clock (``clock=sim``, :mod:`gradwire.backend.simclock`) every
    reading is that clock's: code that times with ``CLOCK.now()`` (the
    profiler, compare's child) measures the simulated cluster unchanged.
    """

    def now(self) -> float:
        if SIMCLOCK.enabled:
            return SIMCLOCK.now()
        return time.perf_counter()

    def advance_to(self, t: float) -> None:
        """An observed completion at ``t``: the simulated clock moves there; the wall clock moves by itself."""
        if SIMCLOCK.enabled:
            SIMCLOCK.observe_op(t)

    def observe(self) -> float:
        """The clock's reading, after every completion the rank has observed (what ``gradwire.clock()`` returns)."""
        return self.now()


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
