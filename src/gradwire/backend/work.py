"""One op in flight: its completion, its failure, its timeout, and the Work torch sees.

An op completes exactly once, at ``max(modelled completion, real end of the
inner op)`` (realtime clock) or when the inner op ends (simulated clock: the
rank's clock moves to the modelled completion where the rank observes it,
simclock.py). It fails when the inner op fails, or when the
simulated network would need longer than the op's timeout.

Traps:
- DDP's reducer reads a comm future in C++. ``torch.futures.Future.set_exception``
  does not mark a C++ error: it stores the exception as the future's *value*
  and installs a Python unwrap function that raises it, which only Python
  callers run. The reducer then took the exception object for the bucket's
  tensors and crashed the process (SIGSEGV inside backward) when a peer died.
  The future handed out is therefore the ``then`` of a private one: a callback
  that raises turns into a real C++ error, which the reducer rethrows as a
  Python RuntimeError. Callers of ``Work.wait()`` get the original exception.
- Timeouts follow what a real backend does (NCCL's watchdog, gloo's
  ``Timed out waiting``): the clock runs from the op's issue, so time queued
  behind earlier ops on the link counts. An op whose modelled completion lies
  past ``issue + timeout`` fails with :class:`torch.distributed.DistBackendError`
  at ``issue + timeout`` (realtime), or at once (simulated clock); the ranks
  price the op identically, so they all raise on the same op. A wait with a
  timeout (``work.wait(timeout=...)``) raises once that much time passed
  without completion (realtime: wall time; simulated: simulated time first,
  then wall time for an inner op that is really late), and leaves the op in
  flight, as gloo does.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.futures import Future

from gradwire.backend.accounting import LEDGER, OpRecord
from gradwire.backend.completer import CLOCK, COMPLETER, run_guarded
from gradwire.backend.simclock import SIMCLOCK, Tag

__all__ = ["CoalescedWork", "DELIVERIES", "GradwireWork", "Pending", "WAITERS", "close_threads", "seconds_of",
           "translate"]

_LOG = logging.getLogger("gradwire")


class _Failed:
    """The value a private future carries when the op failed (see module doc)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _unwrap(source: Future) -> Any:
    """Callback of the public future: pass the value on, or raise the op's error as a C++ error."""
    value = source.value()
    if isinstance(value, _Failed):
        raise value.error.with_traceback(None)
    return value


def seconds_of(timeout: Any) -> float | None:
    """A timeout in seconds; None for "no timeout" (None, zero or negative, torch's kNoTimeout/kUnset)."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return seconds if seconds > 0 else None


class Pending:
    """One op in flight: completes exactly once, from whichever path gets there first.

    Two paths lead to completion. A blocking call (``asyncOp=False``, what
    ``dist.all_reduce(t)`` sends) waits on the inner work in the caller's
    thread and completes inline; that avoids a hand-off to gloo's callback
    thread, which costs more than the rest of the wrapper on small messages.
    An async call, or anyone asking for the future, chains a callback on the
    inner future, and the completer thread finishes it at the modelled time.

    ``lock`` guards the state only, never a wait: the inline path claims the
    op under it, then waits for the inner op and sleeps the modelled time
    without it, so that another thread asking for the future (or settling a
    timeout) is not held up until the op ends.
    """

    __slots__ = ("event", "sent_bytes", "inner", "post", "simulated", "backend", "timeout", "cause", "source", "future",
                 "lock", "inline", "finished", "value", "error", "tag", "observed")

    def __init__(self, event: OpRecord, sent_bytes: int, inner: Any, post: Callable[[], Any] | None, simulated: bool,
                 backend: str, timeout: float, cause: str = "", tag: Tag | None = None) -> None:
        self.event = event
        self.sent_bytes = sent_bytes
        self.inner = inner
        self.post = post
        #: on the simulated clock: completes when the inner op does, at the modelled instant of that clock
        self.simulated = simulated
        #: where the rank observes this op's completion on the simulated clock (simclock.py)
        self.tag = tag
        #: the rank waited for it (``Work.wait()``): the simulated clock took its end there
        self.observed = False
        self.backend = backend
        #: seconds from issue after which the op fails (the group's or the op's timeout)
        self.timeout = timeout
        #: what on the network holds the op up, in words (an outage of the schedule), for its timeout's message
        self.cause = cause
        self.source: Future | None = None
        self.future: Future | None = None
        self.lock = threading.Lock()
        #: a caller's thread took the inline path: it completes the op, a future made meanwhile only listens
        self.inline = False
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    # ---- the future path ------------------------------------------------
    def chain(self) -> Future:
        """The op's public future, created on first use."""
        deliver = attach = False
        with self.lock:
            if self.future is None:
                self.source = Future()
                self.future = self.source.then(_unwrap)
                if self.simulated:  # a chain's stage on it starts no earlier than the op's end
                    SIMCLOCK.stamp(self.future, self.event.modelled_done)
                # completed already: hand over the outcome; being completed inline: that
                # thread delivers; else follow the inner op
                deliver, attach = self.finished, not self.finished and not self.inline
            future = self.future
        # outside the lock: user callbacks run on delivery, and an inner op that is
        # already done runs _on_inner in this thread, which settles under the lock
        if deliver:
            self._deliver()
        elif attach:
            _future_of(self.inner).then(self._on_inner)
        return future

    def _deliver(self) -> None:
        assert self.source is not None
        self.source.set_result(_Failed(self.error) if self.error is not None else self.value)

    def _on_inner(self, inner_future: Future) -> None:
        # drop the inner work: it holds the future that holds this callback, a
        # cycle that would leave gloo's objects to the cyclic GC (see shutdown)
        self.inner = None
        try:
            value = inner_future.value()
        except Exception as exc:  # noqa: BLE001 - the caller must see it
            held = self._held_until()
            if held > time.perf_counter():
                COMPLETER.at(held, lambda: DELIVERIES.submit(self._failed, exc, on_error=self._failed), self._failed)
                return
            self._settle(None, self._fail(exc))
            return
        device = _cuda_device(value)
        if device is not None:
            # A CUDA work's future completes when its kernels (or gloo's copies back
            # to the device) are queued, not done; this callback runs on a stream
            # that waits for them. Our future carries no CUDA events, so its users
            # would read the tensors early: mark that stream's end here and wait for
            # it on a helper thread (never on this one: for nccl it is the caller's).
            with torch.cuda.device(device):
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(device))
            WAITERS.submit(self._after_device, done, value)
            return
        self._complete(value)

    def _after_device(self, done: Any, value: Any) -> None:
        try:
            done.synchronize()
        except Exception as exc:  # noqa: BLE001
            self._settle(None, self._fail(exc))
            return
        self._complete(value)

    def _outcome(self, inner_value: Any) -> Any:
        return self.post() if self.post is not None else inner_value

    def _complete(self, inner_value: Any) -> None:
        try:
            value = self._outcome(inner_value)
            device = _cuda_device(value) if self.post is not None else None
            if device is not None:  # the post-processing kernels (AVG's divide, a staged recv's copy)
                torch.cuda.current_stream(device).synchronize()
        except Exception as exc:  # noqa: BLE001
            self._settle(None, self._fail(exc))
            return
        e = self.event
        e.inner_done = e.modelled_done if self.simulated else CLOCK.now()
        if self._late():
            at = e.issued + self.timeout
            if self.simulated or at <= time.perf_counter():
                self._time_out()
            else:
                COMPLETER.at(at, lambda: DELIVERIES.submit(self._time_out, on_error=self._failed), self._failed)
            return
        done = e.modelled_done
        if self.simulated:
            # callbacks are user code (they may wait on another op): off the inner backend's thread, run at the
            # op's simulated end, their compute charged there (simclock.py)
            DELIVERIES.submit(self._finish_at_end, value, on_error=self._failed)
        elif done <= time.perf_counter():
            self._finish(value)
        else:
            # the completer thread only hands over: user callbacks that wait on another op
            # (PyTorch's PowerSGD hook does) run on a delivery thread, never on the thread
            # that must complete that op. Either hand-off failing fails this op, not the thread.
            COMPLETER.at(done, lambda: DELIVERIES.submit(self._finish, value, on_error=self._failed), self._failed)

    def _finish(self, value: Any) -> None:
        self._record()
        self._settle(value, None)

    def _finish_at_end(self, value: Any) -> None:
        with SIMCLOCK.delivering(self.event.modelled_done, self.tag):
            self._finish(value)

    def _time_out(self) -> None:
        self._settle(None, self._fail(self.timeout_error()))

    def _failed(self, exc: BaseException) -> None:
        """A completion step raised (a hand-off, the accounting): the op fails with that error."""
        if not self.finished:
            self._settle(None, self._fail(exc))

    def _settle(self, value: Any, error: BaseException | None) -> None:
        with self.lock:
            if self.finished:  # exactly once: a late failure of a step after the outcome changes nothing
                return
            self.value, self.error, self.finished = value, error, True
            source = self.source
        if source is not None:
            self._deliver()

    # ---- accounting -----------------------------------------------------
    def _record(self) -> None:
        e = self.event
        e.completed = CLOCK.now()
        LEDGER.record(e, self.sent_bytes, e.inner_done - e.issued)

    def _fail(self, exc: BaseException) -> BaseException:
        """Record the failed op; return the error the caller should see (unsupported ops translated).

        An op that the simulated network would finish only past its timeout
        fails with that timeout's error (chained from the inner one) when the
        inner op fails at its own timeout: the inner group has the same
        timeout, and a peer held by the simulated network (an outage) leaves
        this rank's real collective waiting just as long. Which of the two
        fires first is a race; the cause the caller needs is the network's.
        """
        exc = translate(exc, self.event.op, self.backend)
        e = self.event
        # "at its own timeout": the inner op was issued just after this one, so its timeout ends a little later;
        # 50 ms of slack takes a clock read a little early, and an earlier failure (a dead peer) stays its own
        if self._late() and not isinstance(exc, NotImplementedError) and (
                self.simulated or CLOCK.now() >= e.issued + self.timeout - 0.05):
            timed_out = self.timeout_error()
            timed_out.__cause__ = exc
            exc = timed_out
        e.error = f"{type(exc).__name__}: {exc}"
        if not e.inner_done:
            e.inner_done = CLOCK.now()
        self._record()
        return exc

    def _held_until(self) -> float:
        """Until when a failure of the inner op stays unseen: an outage's op, until its timeout (realtime clock).

        During an outage no packet arrives, a peer's close included: a peer
        that met the same outage a little earlier times out first, ends, and
        its inner connection closes; this rank still hears nothing before its
        own timeout and then fails with it (chained from the inner error), as
        on the real network. 0: no hold (a failure is seen when it happens).
        """
        if self.simulated or not self.cause or not self._late():
            return 0.0
        return self.event.issued + self.timeout

    def _late(self) -> bool:
        """Would the simulated network finish this op only after its timeout?"""
        return self.event.modelled_done > self.event.issued + self.timeout

    def timeout_error(self) -> BaseException:
        e = self.event
        queued = e.started - e.issued
        behind = f" after {queued:.3f} s queued behind earlier ops" if queued > 5e-4 else ""
        return dist.DistBackendError(
            f"gradwire: {e.op} of {e.payload_bytes} bytes (group {e.group}, seq {e.seq}) timed out: the simulated "
            f"network needs {e.model_seconds:.3f} s for it{behind}"
            f"{' (' + self.cause + ')' if self.cause else ''}, past the timeout of {self.timeout:g} s "
            f"(Timeout(ms)={round(self.timeout * 1000)}). Pass a longer timeout to init_process_group or "
            f"new_group, or simulate a faster network."
        )

    # ---- the inline path ------------------------------------------------
    def wait_inline(self) -> None:
        """Block until done in this thread; raise the op's error."""
        with self.lock:
            chained = self.future
            run = chained is None and not self.finished and not self.inline
            if run:
                self.inline = True
        if run:
            self._run_inline()
        elif not self.finished:  # a future follows the op, or another thread completes it inline
            try:
                self.chain().wait()
            except Exception:
                if self.error is not None:
                    raise self.error from None
                raise
        if self.error is not None:
            raise self.error

    def _run_inline(self) -> None:
        """Wait for the inner work and the modelled time, holding no lock (this thread claimed the op)."""
        try:
            inner, self.inner = self.inner, None
            inner.wait()
            # the outputs, for a future asked for later (the inner work's future value; None where it has none)
            value = self._outcome(None) if self.post is not None else _value_of(inner)
        except Exception as exc:
            time.sleep(max(0.0, self._held_until() - time.perf_counter()))
            error = self._fail(exc)
            self._settle(None, error)
            if error is exc:
                raise
            raise error from exc
        e = self.event
        e.inner_done = e.modelled_done if self.simulated else CLOCK.now()
        if self._late():
            if not self.simulated:
                time.sleep(max(0.0, e.issued + self.timeout - time.perf_counter()))
            self._settle(None, self._fail(self.timeout_error()))
            return
        if not self.simulated:
            lag = e.modelled_done - time.perf_counter()
            if lag > 0:
                time.sleep(lag)
        self._record()
        self._settle(value, None)

    def wait_for(self, limit: float) -> None:
        """Block at most ``limit`` seconds (simulated ones on the simulated clock); raise if the op is not done by then."""
        e = self.event
        if self.simulated and not self.finished:
            # when would the op end in simulated time: its completion, or its timeout failure
            end = min(e.modelled_done, e.issued + self.timeout)
            now = CLOCK.now()
            if end > now + limit:
                CLOCK.advance_to(now + limit)
                raise self._wait_timeout(limit, e.modelled_done - now)
        future = self.chain()
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(limit):
            raise self._wait_timeout(limit, e.modelled_done - CLOCK.now())
        if self.error is not None:
            raise self.error

    def _wait_timeout(self, limit: float, remaining: float) -> BaseException:
        e = self.event
        left = f"; the simulated network delivers it in {remaining:.3f} s" if remaining > 0 else ""
        return dist.DistBackendError(
            f"gradwire: {e.op} of {e.payload_bytes} bytes (group {e.group}, seq {e.seq}) did not complete within "
            f"wait(timeout={limit:g} s){left} (modelled time {e.model_seconds:.3f} s). The op is still in flight."
        )


class _WaitedFuture(Future):
    """An op's future handed to a callback on the simulated clock: ``wait()`` moves the callback's time to the
    op's end (:meth:`~gradwire.backend.simclock.SimClock.observe_op`).

    A callback that issues a collective and waits for it (PyTorch's PowerSGD
    hook: ``dist.all_reduce(p, async_op=True).get_future().wait()``, then the
    matmuls for ``Q``) computes after the collective on a real cluster; the
    clock cannot see a wait on torch's own future type, so a callback gets
    this one. Only there: a future that reaches DDP's reducer must carry a
    C++ error (module doc), which a Python future cannot.
    """

    def __init__(self, end: float) -> None:
        super().__init__()
        self._end = end

    def wait(self) -> Any:
        value = super().wait()
        SIMCLOCK.observe_op(self._end)
        return value


def _waited(pending: Pending) -> Future:
    """``pending``'s outcome on a :class:`_WaitedFuture`: its value, or its own error (a timeout stays a
    ``DistBackendError``, as ``Work.wait()`` raises it, not the public future's RuntimeError)."""
    end = pending.event.modelled_done
    waited = _WaitedFuture(end)
    SIMCLOCK.stamp(waited, end)

    def settle(done: Future) -> None:
        try:
            waited.set_result(done.value())
        except BaseException as exc:  # noqa: BLE001 - the waiter sees it
            waited.set_exception(pending.error if pending.error is not None else exc)

    pending.chain().add_done_callback(settle)
    return waited


class GradwireWork(dist._Work):
    """A Work that completes when the simulated network delivers the data."""

    def __init__(self, pending: Pending, op: str, source_of: Callable[[], int] | None = None) -> None:
        super().__init__()
        self._pending = pending
        self._op = op
        self._source_of = source_of

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the op; ``timeout`` (a timedelta) bounds the wait and raises past it, as gloo's does."""
        t0 = time.perf_counter()
        limit = seconds_of(timeout)
        pending = self._pending
        pending.observed = True
        try:
            with SIMCLOCK.backend_work():
                if limit is None:
                    pending.wait_inline()
                else:
                    pending.wait_for(limit)
            if pending.simulated:  # the rank observes the completion: its clock moves to the op's end
                SIMCLOCK.observe_op(pending.event.modelled_done)
        except Exception:
            if pending.simulated and pending.finished and pending._late():  # the op's timeout: seen at its deadline
                SIMCLOCK.observe_op(pending.event.issued + pending.timeout)
            raise
        finally:
            LEDGER.add_blocked(self._op, time.perf_counter() - t0)
        return True

    def get_future(self) -> Future:
        pending = self._pending
        if pending.simulated and SIMCLOCK.delivering_now():
            return _waited(pending)
        return pending.chain()

    def is_completed(self) -> bool:
        p = self._pending
        return p.finished

    def is_success(self) -> bool:
        return self._pending.finished and self._pending.error is None

    def exception(self) -> BaseException | None:
        return self._pending.error if self._pending.finished else None

    def result(self) -> Any:
        self.wait()
        return self._pending.value

    def _source_rank(self) -> int:
        """The group rank a receive from any source got its data from (``dist.recv(t)`` without ``src``)."""
        if self._source_of is None:
            raise RuntimeError("sourceRank() may only be called on work objects that correspond to a recv or "
                               "recv-from-any call.")
        return self._source_of()

    source_rank = _source_rank


class CoalescedWork(dist._Work):
    """One Work for the ops of a coalescing block; done when all of them are, failed when any failed."""

    def __init__(self, works: list[GradwireWork]) -> None:
        super().__init__()
        self._works = works

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit = seconds_of(timeout)
        end = None if limit is None else time.perf_counter() + limit
        for w in self._works:
            w.wait(None if end is None else timedelta(seconds=max(end - time.perf_counter(), 1e-3)))
        return True

    def get_future(self) -> Future:
        futures = [w.get_future() for w in self._works]

        def values(_: Future) -> list[Any]:
            out: list[Any] = []
            for f in futures:
                v = f.value()  # raises the first failure
                out.extend(v if isinstance(v, (list, tuple)) else [v])
            return out

        return torch.futures.collect_all(futures).then(values)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self) -> BaseException | None:
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)


def translate(exc: BaseException, op: str, backend: str) -> BaseException:
    """An inner backend's "unsupported" error becomes a NotImplementedError naming op and backend."""
    msg = str(exc).lower()
    if isinstance(exc, RuntimeError) and any(k in msg for k in ("not support", "cannot use", "unsupported")):
        return NotImplementedError(f"gradwire: op '{op}' is not supported by the inner backend {backend}: {exc}")
    return exc


class _Deliveries:
    """Daemon threads that complete ops handed over by the completer; one more whenever none is idle.

    A completion runs the op's future callbacks, which are user code: a
    callback may wait on another gradwire op (PyTorch's ``powerSGD_hook``
    waits on its second all_reduce inside the first one's callback). Were it
    run on the completer thread, that wait would block the one thread that
    completes the awaited op. Here a blocked delivery only holds its own
    thread; the next delivery finds another (started if none is idle), so
    nested waits always make progress. Threads are daemons: a callback
    blocked forever (a dead peer and no timeout) does not hold up the
    interpreter's exit. A delivery that raises goes to its ``on_error`` (the
    op fails with it) and its thread lives on.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., Any], *args: Any,
               on_error: Callable[[BaseException], None] | None = None) -> None:
        """Run ``fn(*args)`` on a delivery thread; ``on_error(exc)`` if it raises."""
        with self._lock:
            start = self._idle == 0
            if start:
                thread = threading.Thread(target=self._work, name="gradwire-delivery", daemon=True)
                self._threads.append(thread)
            else:
                self._idle -= 1  # an idle thread will take it
        self._queue.put((fn, args, on_error))
        if start:
            thread.start()

    def close(self, timeout: float = 1.0) -> None:
        """End the idle threads, and each busy one when its delivery returns; wait up to ``timeout`` s in all."""
        with self._lock:
            threads, self._threads = self._threads, []
            self._idle = 0
        for _ in threads:
            self._queue.put(None)
        end = time.perf_counter() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, end - time.perf_counter()))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, on_error = item
            run_guarded(lambda: fn(*args), on_error)
            with self._lock:
                self._idle += 1


class _Waiters:
    """Threads that wait for inner works (and CUDA events) so that no caller blocks.

    The executor is made once, under a lock, at the first wait; :meth:`close`
    shuts it down, and a later :meth:`submit` makes a new one.
    """

    def __init__(self, workers: int = 4) -> None:
        self._workers = workers
        self._lock = threading.Lock()
        self._executor: Any = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._executor is None:
                from concurrent.futures import ThreadPoolExecutor

                self._executor = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="gradwire-wait")
            executor = self._executor
        executor.submit(fn, *args)

    def close(self) -> None:
        """Shut the threads down; waits still queued are dropped, running ones finish in the background."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


DELIVERIES = _Deliveries()
WAITERS = _Waiters()


def close_threads() -> None:
    """Stop the backend's threads: the completer, the deliveries, the waiters (each starts again when needed)."""
    COMPLETER.close()
    DELIVERIES.close()
    WAITERS.close()


def _value_of(work: Any) -> Any:
    """A finished inner work's outputs, from its future (``Work.result()`` warns that it is deprecated)."""
    try:
        return work.get_future().value()
    except RuntimeError:
        return None


def _cuda_device(value: Any) -> torch.device | None:
    """The GPU of a future's value (a tensor or a list of them), None for host memory"""
    tensors = value if isinstance(value, (list, tuple)) else [value]
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return t.device
    return None


def _future_of(work: Any) -> Future:
    """The inner work's future; for works without one, a thread waits for it."""
    try:
        return work.get_future()
    except RuntimeError:
        fut: Future = Future()

        def wait() -> None:
            try:
                work.wait()
                fut.set_result(None)
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(exc)

        WAITERS.submit(wait)
        return fut
