"""The simulated cluster clock (``clock=sim``): each rank's time on the cluster the user describes.

Nothing here reads the wall clock. A rank's time moves in two ways only:

1. **Compute** advances it through a device model (:mod:`gradwire.device`):
   a roofline device prices every tensor op the rank's threads run (a
   dispatch mode counts each op's FLOPs and bytes); ``host`` charges the
   thread's own CPU time (``x F`` scaled). The backend's own work (the
   wrapper, the real inner collective, its threads) is never charged: each
   backend entry pauses the meter.
2. **Communication** moves it when the rank *observes* a completion: the op
   starts on its link at the instant the last rank of the group issued it
   (the ranks agree on it through a one-number MAX all_reduce on a gloo
   group of their own), queues behind earlier ops on the link, and ends when
   the network model says; the rank's clock becomes ``max(clock, end)`` at
   the observation, so compute placed between issue and observation
   overlaps the transfer.

Where a completion is observed (each op carries a *tag* that says where):

- ``Work.wait()``: that op.
- The end of the backward pass in which the rank's main thread issued it:
  DDP waits there for every bucket's future (``finalize_backward`` is an
  autograd final callback queued before the first bucket launches; ours is
  queued at the first launch, so it runs after DDP's waits). Ops issued from
  callbacks of such an op (a compressed exchange's later rounds, PowerSGD's
  second all_reduce) inherit its tag.
- ``detached()``: a strategy that exchanges in the background (``delayed``)
  issues inside it and calls :meth:`SimClock.observe` where it waits.
- Any other op (a loop's ``async_op=True`` whose future it waits on) is
  observed by ``Work.wait()``, or, once it really completed, at a
  strategy's wait (:meth:`SimClock.observe_loose`); a clock reading or
  another op's issue observes nothing (when an op really completes depends
  on this host, and the clock must not). A future's ``wait()`` outside a
  strategy is not seen: the clock then does not include that wait.
- A callback's wait for an op it issued (``get_future().wait()``, as
  PyTorch's PowerSGD hook waits for its P and Q all_reduces): the future a
  callback gets observes its wait (:class:`gradwire.backend.work._WaitedFuture`),
  so the callback's compute after it starts at the op's end.

Callbacks of a completed op run *at the op's end* on the simulated clock,
on a delivery thread or, when chained after the op completed, at once on
the chaining thread (:func:`gradwire.exchange.futures.stage_callbacks_on_the_clock`):
their compute (decompression, PowerSGD's matmuls) is priced there and
moves the end of the tag, not the main thread's clock.

What it does not model: SM contention between collectives and compute on a
GPU, kernel-level overlap inside one op, memory limits, the host's own
Python overhead beyond the per-op cost of the device.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

from gradwire.device import DeviceSpec, RooflineMode

__all__ = ["SIMCLOCK", "SimClock", "Tag", "TIME_ENV"]

#: set to 1: a script's own ``time.perf_counter()`` and ``time.time()`` read the simulated clock on its main thread
TIME_ENV = "GRADWIRE_SIM_TIME"
_REAL_PERF_COUNTER = time.perf_counter
_REAL_TIME = time.time


class Tag:
    """Where a set of ops is observed; ``end`` is the latest simulated instant any of them (or their callbacks) reached."""

    __slots__ = ("end", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.end = 0.0

    def reach(self, t: float) -> None:
        if t > self.end:
            self.end = t

    def __repr__(self) -> str:
        return f"Tag({self.name}, end={self.end:.6f})"


class _Thread(threading.local):
    """What the clock keeps per thread."""

    #: depth of backend calls: the backend's own work is never charged
    paused: int = 0
    #: the simulated instant this (delivery) thread computes at, and the tag it computes for; None: the main timeline
    context: float | None = None
    tag: Tag | None = None
    #: the tag of a strategy's background launches (:meth:`SimClock.detached`)
    detached: Tag | None = None
    #: this thread's roofline dispatch mode, entered once
    mode: Any = None
    #: thread CPU time at the last charge (``host`` devices)
    cpu_mark: float = 0.0


class SimClock:
    """This process's (this rank's) simulated clock; :data:`SIMCLOCK` is the one the backend uses."""

    def __init__(self) -> None:
        self.enabled = False
        self.device: DeviceSpec | None = None
        self._lock = threading.RLock()
        self._t = 0.0
        #: charges of the main timeline not yet added (roofline ops from any non-delivery thread)
        self._pending = 0.0
        self._tls = _Thread()
        self._main: int | None = None
        #: the tag of each backward pass (by autograd graph task) that issued ops
        self._backward: dict[int, Tag] = {}
        #: ops in no backward and no background launch, observed by a wait once they really ended: (pending, end)
        self._loose: list[tuple[Any, float]] = []
        #: seconds the main clock jumped to a completion: communication not hidden behind compute
        self.exposed = 0.0
        #: compute charges are multiplied by this: a straggler's factor, times a ``step:TIME`` device's scale
        self._scale = 1.0
        self._straggler = 1.0
        #: simulated instants futures completed at (stamp); weak, so that a future's instant dies with it (an id
        #: would be reused by a later future, of a later training too, and hand it a stale instant)
        self._stamps: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()
        #: seconds of compute charged to the main timeline, and at the last step mark
        self.computed = 0.0
        self._marks: list[float] = []
        #: a recorded device's check of the model at its first forward (:meth:`_check_model_once`)
        self._model_hook: Any = None
        #: a recorded device's per-step compute factors: the optimizer step hook that moves them on (:meth:`replay_steps`)
        self._step_hook: Any = None

    # ---- lifecycle --------------------------------------------------------
    def enable(self, device: DeviceSpec) -> None:
        """Start at t = 0 on ``device``, with the calling thread as the rank's main thread."""
        with self._lock:
            self.disable()
            self.enabled, self.device = True, device
            self._t = self._pending = self.exposed = self.computed = 0.0
            self._scale = self._straggler = 1.0
            self._marks = []
            self._main = threading.get_ident()
            self._backward.clear()
            self._loose.clear()
            self._stamps.clear()
            self._enter_meter()
            if device.kind == "recorded":
                self._check_model_once(device)
            if os.environ.get(TIME_ENV) == "1":
                self._patch_time()

    def disable(self) -> None:
        with self._lock:
            if self.enabled and self._main == threading.get_ident():
                self._leave_meter()
            self.enabled = False
            time.perf_counter, time.time = _REAL_PERF_COUNTER, _REAL_TIME
            if self._model_hook is not None:
                self._model_hook.remove()
                self._model_hook = None
            if self._step_hook is not None:
                self._step_hook.remove()
                self._step_hook = None

    def _patch_time(self) -> None:
        """Opt-in (``GRADWIRE_SIM_TIME=1``): the main thread's ``time.perf_counter()`` and ``time.time()`` read
        this clock (from the instant it started), so the throughput a script logs itself is the cluster's.
        Other threads (the backend's, the inner group's) keep the real clocks."""
        perf0, unix0, main = _REAL_PERF_COUNTER(), _REAL_TIME(), self._main

        def perf_counter() -> float:
            return perf0 + self.now() if self.enabled and threading.get_ident() == main else _REAL_PERF_COUNTER()

        def wall() -> float:
            return unix0 + self.now() if self.enabled and threading.get_ident() == main else _REAL_TIME()

        time.perf_counter, time.time = perf_counter, wall

    def _enter_meter(self) -> None:
        tls = self._tls
        assert self.device is not None
        if self.device.device is not None and self.device.kind != "host" and tls.mode is None:
            tls.mode = RooflineMode(self.device.device, self._charge, self._paused, self.device.recording)
            tls.mode.__enter__()
        tls.cpu_mark = time.thread_time()

    def _check_model_once(self, device: DeviceSpec) -> None:
        """A recorded device (``profile:DIR``): refuse another model than the recorded one at its first forward.

        The first module whose forward runs with grad enabled and parameters is the model (a DDP wrapper's
        ``module.`` prefix is dropped); its signature must be the recording's (ValueError in one line).
        """
        from gradwire.device.recorded import model_signature, on_first_model_forward

        self._model_hook = on_first_model_forward(
            lambda module: device.recording.check_model(model_signature(module.named_parameters())))

    def _leave_meter(self) -> None:
        tls = self._tls
        if tls.mode is not None:
            mode, tls.mode = tls.mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - another mode was pushed above ours: leave the stack as it is
                pass

    # ---- metering ----------------------------------------------------------
    def _paused(self) -> bool:
        return self._tls.paused > 0

    def delivering_now(self) -> bool:
        """Whether this thread runs callbacks of an op (or a chain's stage) at an instant of its own."""
        return self.enabled and self._tls.context is not None

    def in_backend(self) -> bool:
        """Whether this thread runs the backend's own work now (on either clock): not the rank's compute."""
        return self._tls.paused > 0

    def _charge(self, seconds: float) -> None:
        tls = self._tls
        seconds *= self._scale
        if tls.context is not None:
            tls.context += seconds
            if tls.tag is not None:  # at once: a future a callback completes wakes its waiter before we return
                tls.tag.reach(tls.context)
        else:
            self._pending += seconds
            self.computed += seconds

    def _host_charge(self) -> None:
        """``host``: the thread CPU time since the last mark, scaled, charged to this thread's timeline."""
        if self.device is None or self.device.kind != "host":
            return
        tls = self._tls
        if tls.context is None and threading.get_ident() != self._main:
            return  # a thread of the backend's or the inner group's: not the rank's compute
        cpu = time.thread_time()
        self._charge((cpu - tls.cpu_mark) * self.device.factor)
        tls.cpu_mark = cpu

    @contextmanager
    def backend_work(self) -> Iterator[None]:
        """The backend's own work: not the cluster's, never charged."""
        tls = self._tls
        if tls.paused == 0:
            self._host_charge()
        tls.paused += 1
        try:
            yield
        finally:
            tls.paused -= 1
            if tls.paused == 0:
                tls.cpu_mark = time.thread_time()

    def slow_down(self, factor: float) -> None:
        """This rank computes ``factor`` times slower (a straggler, ``straggler=R:compute=F``)."""
        self._straggler = factor
        self._scale *= factor

    def replay_steps(self, rank: int) -> None:
        """A recorded device (``profile:DIR``): this rank computes as the recorded rank ``rank`` did, step by step.

        Its compute in its n-th optimizer step (0-based, counted by a
        ``torch.optim`` step post hook) is multiplied by the recording's
        ``factor(rank, n)`` (:mod:`gradwire.device.recorded`, point 4), on top
        of a straggler's factor. Nothing for another device or a recording
        without factors. Trap: a script with two optimizers counts both.
        """
        from torch.optim.optimizer import register_optimizer_step_post_hook

        device = self.device
        if not self.enabled or device is None or device.kind != "recorded" or not device.recording.factors:
            return
        recording, done = device.recording, [0]

        def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.enabled and self.device is device:
                done[0] += 1
                self._scale = self._straggler * recording.factor(rank, done[0])

        with self._lock:
            self._scale = self._straggler * recording.factor(rank, 0)
            if self._step_hook is not None:
                self._step_hook.remove()
            self._step_hook = register_optimizer_step_post_hook(after_step)

    def mark_step(self) -> None:
        """A training step ended. A ``step:TIME`` device scales compute after the second step (the first
        holds one-off work: DDP's bucket rebuild, lazy allocations) so that a step's compute takes TIME."""
        device = self.device
        if not self.enabled or device is None or device.kind != "step" or len(self._marks) >= 2:
            return
        self.now()
        self._marks.append(self.computed)
        if len(self._marks) == 2:
            step = self._marks[1] - self._marks[0]
            if step > 0:
                self._scale = self._straggler * device.step_seconds / (step / self._scale)

    # ---- the main timeline -------------------------------------------------
    def now(self, observe: bool = False) -> float:
        """This thread's simulated instant: the main timeline, or a delivery thread's context.

        ``observe``: first take the completions of loose ops that really ended (a collective's issue, a
        strategy's wait); a reading alone, or a point-to-point op's issue, does not (an isend that ended
        meanwhile still overlaps the recv issued next).
        """
        tls = self._tls
        if tls.paused == 0:
            self._host_charge()
        if tls.context is not None:
            return tls.context
        with self._lock:
            self._t += self._pending
            self._pending = 0.0
            if observe and threading.get_ident() == self._main:
                self._observe_loose()
            return self._t

    def _advance(self, t: float) -> None:
        """The main clock to at least ``t`` (a completion observed); the jump counts as exposed."""
        with self._lock:
            self._t += self._pending
            self._pending = 0.0
            if t > self._t:
                self.exposed += t - self._t
                self._t = t

    def observe_loose(self) -> None:
        """The rank waited for something: take the completions of loose ops that really ended."""
        if threading.get_ident() == self._main:
            self.now(observe=True)

    def _observe_loose(self) -> None:
        if not self._loose:
            return
        keep = []
        for pending, end in self._loose:
            if not pending.finished:
                keep.append((pending, end))
            elif pending.error is None and not pending.observed:  # a failure or a wait took its own instant
                self._advance(end)
        self._loose = keep

    # ---- tags and observation ----------------------------------------------
    def tag_for_issue(self) -> Tag | None:
        """The tag of an op issued now in this thread (module doc); None: observed loosely."""
        tls = self._tls
        if tls.tag is not None:  # a callback of an op: its tag
            return tls.tag
        if tls.detached is not None:
            return tls.detached
        import torch

        task = torch._C._current_graph_task_id()
        if task == -1:
            return None
        tag = self._backward.get(task)
        if tag is None:
            tag = self._backward[task] = Tag(f"backward {task}")
            engine = torch.autograd.Variable._execution_engine
            try:
                # DDP queues its wait for the buckets (finalize_backward) when the last bucket is ready, after
                # this first launch: observe from a callback queued from ours, which runs after DDP's
                engine.queue_callback(lambda: engine.queue_callback(lambda: self._end_of_backward(task)))
            except RuntimeError:  # not on the autograd thread after all: observe it with the loose ones
                del self._backward[task]
                return None
        return tag

    def _end_of_backward(self, task: int) -> None:
        tag = self._backward.pop(task, None)
        if tag is not None:
            self.observe(tag)

    def issued(self, pending: Any, tag: Tag | None, end: float) -> None:
        """Remember an op that ends at ``end``: on its tag, or among the loose ones."""
        if tag is not None:
            tag.reach(end)
        else:
            with self._lock:
                self._loose.append((pending, end))

    def observe(self, tag: Tag) -> None:
        """The rank has waited for every op of ``tag``: its clock moves to their end."""
        self._advance(tag.end)

    def observe_op(self, end: float) -> None:
        """The rank waited for one op (``Work.wait()``) that ends at ``end``."""
        tls = self._tls
        if tls.context is not None:
            tls.context = max(tls.context, end)
            if tls.tag is not None:
                tls.tag.reach(tls.context)
            return
        self._advance(end)

    @contextmanager
    def detached(self, name: str = "background") -> Iterator[Tag]:
        """Ops issued inside (and their callbacks' ops) are observed only by :meth:`observe` on the yielded tag."""
        tls = self._tls
        tag, outer = Tag(name), tls.detached
        tls.detached = tag
        try:
            yield tag
        finally:
            tls.detached = outer

    # ---- stages of a chain (gradwire.exchange.futures) ---------------------
    def stamp(self, future: Any, at: float | None = None) -> None:
        """Remember the simulated instant ``future`` completes at (default: this thread's now)."""
        if not self.enabled:
            return
        t = self.now() if at is None else at
        with self._lock:
            self._stamps[future] = t

    def instant_of(self, future: Any) -> float | None:
        """The instant :meth:`stamp` gave ``future`` (None: not stamped)."""
        if not self.enabled:
            return None
        with self._lock:
            return self._stamps.get(future)

    def chain_tag(self) -> Tag | None:
        """The tag a stage chained now belongs to: this thread's context's, or what an op issued now would get."""
        tls = self._tls
        return tls.tag if tls.context is not None else self.tag_for_issue()

    @contextmanager
    def at(self, t: float, tag: Tag | None) -> Iterator[None]:
        """Run a chain's stage at ``t`` on the communication side (never the main timeline): its compute
        moves its tag's end, its ops are issued at ``t`` plus that compute.

        A stage runs inline in the thread that chains it when its input is done already, else later on a
        delivery thread; which one depends on this host's timing. Pricing it at
        ``max(when it was chained, when its input completed)`` in both cases keeps the clock deterministic.
        """
        tls = self._tls
        if not self.enabled:
            yield
            return
        if tls.context is None:
            with self.delivering(t, tag):
                yield
            return
        # nested in another op's delivery: this stage's time and tag, then that delivery's again
        saved = (tls.context, tls.tag)
        tls.context, tls.tag = max(tls.context, t), tag
        try:
            yield
        finally:
            end = tls.context
            if tag is not None:
                tag.reach(end)
            tls.context, tls.tag = max(saved[0], end) if saved[1] is tag else saved[0], saved[1]

    @contextmanager
    def delivering(self, at: float, tag: Tag | None) -> Iterator[None]:
        """Run an op's callbacks on this (delivery) thread at its end ``at``; their compute moves the tag's end."""
        tls = self._tls
        if tls.paused == 0:  # run inline on the training thread (a stage chained on a done future): its time so far
            self._host_charge()
        saved = (tls.context, tls.tag, tls.paused)
        tls.context, tls.tag, tls.paused = at, tag, 0
        try:
            if tls.mode is None:
                self._enter_meter()
            tls.cpu_mark = time.thread_time()
            yield
        finally:
            self._host_charge()
            end = tls.context
            tls.context, tls.tag, tls.paused = saved
            if tag is not None:
                tag.reach(end)


SIMCLOCK = SimClock()
