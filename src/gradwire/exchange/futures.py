"""Future chains that carry failures, and the order in which exchanges issue collectives.

Every stage of an exchange is a callback on a ``torch.futures.Future``. Two
rules keep a failed collective visible (as on plain gloo, where the caller's
``wait()`` raises):

1. A callback reads its input with ``value()``, which re-raises the inner
   failure, so the failure becomes the next future's result. A callback that
   ignores its argument (``fut.then(lambda _: flat)``) would complete with
   the local tensor and training would go on as if the peers had answered:
   :func:`then` never does that.
2. Whoever waits on the last future of a chain sees the first failure.

Ordering (trap): gloo pairs collectives by the order they are issued. An
exchange that issues its second collective from a callback (two-phase, or a
second PowerSGD round) must not race a collective of the next exchange, or
the ranks would pair different collectives. A :class:`Sequencer` hands out
:class:`Turn` objects: exchange ``k+1`` issues only after exchange ``k``
issued its last collective, or failed. A turn is released in one place,
:meth:`Turn.issue`, on the last issue or on any failure.
"""
from __future__ import annotations

import atexit
import functools
import threading
import time
from typing import Any, Callable, TypeVar

import torch
from torch.futures import Future

from gradwire.backend.simclock import SIMCLOCK

__all__ = ["Sequencer", "Turn", "completed", "counted", "drain_at_destroy", "one_bucket_at_a_time",
           "stage_callbacks_on_the_clock", "then", "then_async", "wait_before_exit"]

T = TypeVar("T")


def completed(value: Any) -> Future:
    """A future that already holds ``value``."""
    fut: Future = Future()
    fut.set_result(value)
    return fut


#: callbacks of :func:`then` and :func:`then_async` running now (on the backends' threads), and whether any ran
_running = 0
_ran = False
_running_lock = threading.Lock()
#: the longest the interpreter's exit waits for running callbacks, and the margin after the last one returns
EXIT_WAIT_SECONDS = 10.0
EXIT_MARGIN_SECONDS = 0.05
#: what else the exit waits for first: functions returning futures still in flight (``auto``'s probes)
_pending: list[Callable[[], list[Future]]] = []


def wait_before_exit(pending: Callable[[], list[Future]]) -> None:
    """Have the interpreter's exit also wait for the futures ``pending()`` returns then (:func:`_drain_at_exit`)."""
    _pending.append(pending)


def counted(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, counted in :data:`_running` while it runs (:func:`_drain_at_exit` waits for it)."""
    @functools.wraps(fn)
    def run(*args: Any) -> T:
        global _running, _ran
        with _running_lock:
            _running += 1
            _ran = True
        try:
            return fn(*args)
        finally:
            with _running_lock:
                _running -= 1
    return run


@atexit.register
def _drain_at_exit() -> None:
    """Let the callbacks still running on the backends' threads finish before the interpreter finalizes.

    Trap: a script may leave the training loop, destroy its group and exit
    while a backend thread is still inside the last exchange's callbacks
    (DDP's wait returned as soon as the future it holds completed; the
    callbacks chained behind it run on). A thread that takes the GIL once
    the interpreter finalizes is stopped inside C++ frames that may not be
    unwound, and the process aborts ("terminate called without an active
    exception": about 1 run in 30 of ``benchmarks/auto_link_job.py`` under
    torchrun on gloo, always on such a callback). atexit runs before that:
    wait for the futures registered with :func:`wait_before_exit` and the
    counted callbacks (at most :data:`EXIT_WAIT_SECONDS` in all), then
    :data:`EXIT_MARGIN_SECONDS` for what a returning callback still releases
    under the GIL (its function object, its frames).
    """
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for fut in [f for pending in _pending for f in pending()]:
        while not fut.done() and time.monotonic() < deadline:
            time.sleep(0.001)
    _drain(deadline)


def _drain(deadline: float) -> None:
    """Wait, with the GIL released, until no counted callback runs (at most until ``deadline``), then the margin."""
    if not _ran:
        return
    while _running and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(EXIT_MARGIN_SECONDS)


def drain_at_destroy() -> None:
    """Have ``torch.distributed.destroy_process_group`` first let the callbacks still running finish.

    Trap: on a real backend (plain gloo) an exchange's callbacks run on the
    backend's own thread, and may still run after DDP's wait returned (the
    next exchange's turn, ``auto``'s bookkeeping). When the last reference
    to the group goes (the DDP's reducer, freed as the function that built it
    returns), ``~ProcessGroupGloo`` joins that thread while holding the GIL,
    and the callback, waiting for the GIL, never returns: the rank hangs.
    Waiting for the counted callbacks at ``destroy_process_group`` (the GIL
    released) ends them first. Installed by ``import gradwire``; a script that
    imported ``destroy_process_group`` by name before that calls torch's own.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = dist.destroy_process_group
    if getattr(real, "_drains_gradwire", False):
        return

    @functools.wraps(real)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        _drain(time.monotonic() + EXIT_WAIT_SECONDS)
        return real(*args, **kwargs)

    destroy_process_group._drains_gradwire = True  # type: ignore[attr-defined]
    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group


def _staged(fut: Future, fn: Callable[[Any], T], ended: Callable[[float], None]) -> Callable[[Any], T]:
    """``fn`` as a stage chained on ``fut`` now: on the simulated clock it runs at the later of this instant and
    ``fut``'s completion, whichever thread runs it (:meth:`~gradwire.backend.simclock.SimClock.at`); ``ended``
    gets the instant it ended at."""
    if not SIMCLOCK.enabled:
        return fn
    chained, tag = SIMCLOCK.now(), SIMCLOCK.chain_tag()

    def run(value: Any) -> T:
        done = SIMCLOCK.instant_of(fut)
        with SIMCLOCK.at(chained if done is None else max(chained, done), tag):
            out = fn(value)
            ended(SIMCLOCK.now())
        return out

    return run


def _stamper() -> tuple[Callable[[float], None], Callable[[Future], Future]]:
    """A stage's ``ended`` and the function that names the future it completes (either may come first)."""
    box: list[Future] = []
    ends: list[float] = []

    def ended(t: float) -> None:
        ends.append(t)
        if box:
            SIMCLOCK.stamp(box[0], t)

    def named(out: Future) -> Future:
        box.append(out)
        if ends:
            SIMCLOCK.stamp(out, ends[0])
        return out

    return ended, named


#: torch's own ``Future.then`` (:func:`stage_callbacks_on_the_clock` puts a stage in front of it)
_TORCH_THEN: Callable[[Future, Callable[[Future], Any]], Future] = getattr(
    torch._C.Future.then, "__wrapped__", getattr(torch._C.Future, "then"))


def _then_staged(fut: Future, callback: Callable[[Future], T]) -> Future:
    """``fut.then(callback)`` as a stage of the simulated clock; its result carries the instant it ended at."""
    ended, named = _stamper()
    return named(_TORCH_THEN(fut, _staged(fut, callback, ended)))


def then(fut: Future, fn: Callable[[Any], T]) -> Future:
    """``fut.then`` that hands ``fn`` the value, so a failure of ``fut`` fails the result instead of reaching ``fn``."""
    callback = counted(lambda done: fn(done.value()))
    if not SIMCLOCK.enabled:  # the realtime clock: no instants to keep on a stage of every exchange
        return _TORCH_THEN(fut, callback)
    return _then_staged(fut, callback)


def stage_callbacks_on_the_clock() -> None:
    """Have ``Future.then`` on a future that carries an instant of the simulated clock run its callback there.

    Trap: torch runs a callback on the thread that completes the future, or
    at once on the thread that chains it when the future is done already.
    On the simulated clock a gradwire op's future completes as soon as the
    real inner op does, so which of the two happens depends on this host's
    speed: a PyTorch hook's ``get_future().then(compute_q)`` ran at the op's
    end on a delivery thread on one host and on the training thread, at its
    own instant, on another (and its wait for a further op went unseen
    there). A stage runs at the later of when it was chained and when its
    future completed, on whichever thread (:func:`_staged`), so the clock
    reads the same everywhere. Futures without an instant (the realtime
    clock, anyone else's) keep torch's own ``then``. Installed by ``import
    gradwire``; DDP's reducer chains in C++ and never comes here.
    """
    if getattr(torch._C.Future.then, "_stages_gradwire", False):
        return

    def then_on_the_clock(fut: Future, callback: Callable[[Future], Any]) -> Future:
        if SIMCLOCK.enabled and SIMCLOCK.instant_of(fut) is not None:
            return _then_staged(fut, callback)
        return _TORCH_THEN(fut, callback)

    functools.update_wrapper(then_on_the_clock, _TORCH_THEN)
    then_on_the_clock._stages_gradwire = True  # type: ignore[attr-defined]
    setattr(torch._C.Future, "then", then_on_the_clock)


def then_async(fut: Future, fn: Callable[[Any], Future], on_error: Callable[[], None] | None = None) -> Future:
    """Like :func:`then` for an ``fn`` that returns a Future: the result settles with that future.

    ``on_error`` runs once when ``fut`` fails or ``fn`` raises, before the failure is passed on.
    """
    out: Future = Future()
    ends: list[float] = []
    stage = _staged(fut, fn, ends.append)

    def fail(exc: BaseException) -> None:
        if on_error is not None:
            on_error()
        out.set_exception(exc)

    def settle(inner: Future) -> None:
        done = SIMCLOCK.instant_of(inner)
        if done is None and SIMCLOCK.delivering_now():
            # a future of someone else's (PyTorch's PowerSGD returns a ``then`` of a ``then``) completed in the
            # callback that runs now, at this instant: without it the next stage would start before it
            done = SIMCLOCK.now()
        if ends or done is not None:  # the result is there when the later of the stage and its future is
            SIMCLOCK.stamp(out, max(ends + ([done] if done is not None else [])))
        try:
            out.set_result(inner.value())
        except BaseException as exc:  # noqa: BLE001 - forwarded to the waiter
            out.set_exception(exc)

    def step(done: Future) -> None:
        try:
            inner = stage(done.value())
        except BaseException as exc:  # noqa: BLE001 - forwarded to the waiter
            fail(exc)
            return
        inner.add_done_callback(counted(settle))

    fut.add_done_callback(counted(step))
    return out


class Turn:
    """One exchange's turn to issue collectives (see the module doc)."""

    __slots__ = ("_gate", "_token")

    def __init__(self, gate: Future, token: Future) -> None:
        self._gate = gate
        self._token = token

    def issue(self, launch: Callable[[Any], Future], after: Future | None = None, *, last: bool = True) -> Future:
        """Call ``launch(value of after)`` once ``after`` (default: the previous exchange's last issue) is done.

        ``launch`` issues collectives and returns the future of their
        result. The turn passes to the next exchange after the ``last``
        launch returned, or as soon as anything on the way failed.
        """

        def run(value: Any) -> Future:
            fut = launch(value)
            if last:
                self.release()
            return fut

        return then_async(self._gate if after is None else after, run, on_error=self.release)

    def release(self) -> None:
        """Let the next exchange issue (idempotent)."""
        if not self._token.done():
            SIMCLOCK.stamp(self._token)  # the next exchange issues no earlier than this instant
            try:
                self._token.set_result(None)
            except RuntimeError:  # released from another thread in between
                pass


class Sequencer:
    """Issue collectives in one deterministic order on every rank."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail: Future = completed(None)

    def turn(self) -> Turn:
        """Reserve the next turn: it opens when every earlier turn issued its last collective."""
        gate, token = self._tail, Future()  # type: Future, Future
        self._tail = token
        return Turn(gate, token)


def one_bucket_at_a_time(hook: Callable[[Any, Any], Future]) -> Callable[[Any, Any], Future]:
    """A DDP comm hook that runs ``hook`` on bucket ``k`` only once bucket ``k-1``'s future is done.

    For a hook of someone else's that issues a collective from a completion
    callback (PyTorch's ``powerSGD_hook`` issues its Q all_reduce when the P
    all_reduce completes): that collective races the next bucket's, which DDP
    issues from the backward thread, and the ranks pair different
    collectives (gloo: "Received data size doesn't match expected size").
    On NCCL the race does not happen because a NCCL future completes when
    its kernels are queued, in the issuing thread; on a simulated network
    the completion comes later, from another thread. Running the buckets in
    turn gives every rank the same order, at the price of no overlap
    between buckets of that hook. A failed bucket fails the ones after it.
    """
    lock = threading.Lock()
    tail = [completed(None)]

    @functools.wraps(hook)  # the hook's name and signature: DDP checks them, profiles name the strategy by them
    def run(state: Any, bucket: Any) -> Future:
        with lock:
            out = then_async(tail[0], lambda _: hook(state, bucket))
            tail[0] = out
        return out

    return run
