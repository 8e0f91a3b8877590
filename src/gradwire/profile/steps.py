"""Per training step: forward, backward, each DDP bucket's size and ready time, the optimizer.

What ``gradwire predict --profile`` needs from an unchanged script, recorded
on the thread that trains (the one a :class:`ProfileSession` starts on):

1. Backward: the :class:`~gradwire.profile.waits.WaitRecorder` of the session
   brackets every top-level ``backward()``: its call, the end of its compute
   (an autograd callback queued before DDP's) and its return.
2. The optimizer: torch's global optimizer step hooks stamp every
   outermost ``optimizer.step()`` (pre and post; a step that calls another
   optimizer's step is one step). A closure passed to the step
   (``optimizer.step(closure)``, as Lightning's automatic optimization and
   LBFGS do) is wrapped by the pre-hook, which stamps each of its calls.
3. Buckets: while recording, ``DistributedDataParallel.register_comm_hook``
   wraps the hook it is given. The wrapper stamps each bucket when DDP hands
   it over (its gradients are ready), when the hook returns (the hook's own
   time: compression runs there, on the training thread) and when the hook's
   future completes; its size is the bucket buffer's. A DDP without a comm
   hook runs its built-in all_reduce from C++, where Python sees nothing:
   then every floating-point all_reduce that the backend issued during
   backward's compute is a bucket, ready when it was issued, of its payload's
   size (an integer one is DDP's map of used parameters, with
   ``find_unused_parameters=True``, not a bucket).
4. Collectives: the backend's event log (issue, link start, completion,
   the real inner op's end).
5. The batch: while recording, every training forward of a DDP model (grad
   enabled) stamps the leading dimension of its first tensor argument
   (positional, else by name: the HF Trainer's ``input_ids``; inside a list
   or dict: Lightning's ``[x, y]``): samples per rank per micro-step, for
   throughput in samples/s.

:func:`steps` turns these into one dict per step, every time in seconds
relative to the step's backward call. A step runs from the end of the
previous one (its optimizer step, or its backward if there was none) to the
end of its own optimizer step; the first backward has no previous step and
only starts the series.

A step is an optimizer step. Gradient accumulation runs several backwards per
optimizer step, and only the last one synchronises: the others run under
``DDP.no_sync()`` or with ``require_backward_grad_sync = False`` (the HF
Trainer's ``gradient_accumulation_steps`` and Lightning's
``accumulate_grad_batches`` do the same). A backward with no optimizer step
before the next backward and no gradient exchange in it (no bucket, no
collective issued while it ran) is a micro-step of the step it leads into:
the step's ``micro_steps`` counts its backwards (1 without accumulation) and
``micro_seconds`` holds each earlier micro-step's seconds (from the end of
the one before, or of the previous step, to its backward's return: its
forward and backward). The step's other times are the synchronising
backward's, and ``forward`` runs from the last micro-step's return to it.
A backward that synchronised without an optimizer step after it (a script
that updates its weights by hand) stays a step of its own.

A step with a closure is a step too: its forward and backward run inside
``optimizer.step``. Every backward inside one optimizer step belongs to that
step, however often the closure ran (LBFGS evaluates it several times). What
is approximate there:

- ``forward`` runs from the end of the previous step to the first backward's
  call, as without a closure; it includes the step's own entry before the
  closure (hooks, the closure's ``zero_grad``).
- ``backward`` and the buckets are the first evaluation's.
  ``after_backward`` runs from that backward's return to the return of the
  closure call around it (Lightning clips gradients and runs its hooks there).
- ``optimizer`` is the rest of the step: the update, and for a closure
  called again (LBFGS) its later evaluations (their forward, backward and
  all_reduces) too; ``evaluations`` says how many backwards the step ran.

Trap: a hook registered before recording started (a ``ProfileSession``
entered after the model was wrapped) is not wrapped; the event log then
stands in, which for a compressing hook gives the first collective's issue
time (after compression) as the ready time.
"""
from __future__ import annotations

import bisect
import functools
import threading
from typing import Any, Callable

import torch

from gradwire.backend.completer import CLOCK
from gradwire.backend.simclock import SIMCLOCK

__all__ = ["BucketStamp", "HookRecorder", "batch_of", "steps", "strategy_label"]


class BucketStamp:
    """One bucket as the wrapped comm hook saw it."""

    __slots__ = ("index", "nbytes", "element_size", "called", "returned", "done")

    def __init__(self, index: int, nbytes: int, element_size: int, called: float, returned: float) -> None:
        self.index, self.nbytes, self.element_size = index, nbytes, element_size
        self.called, self.returned = called, returned
        self.done: float | None = None


_lock = threading.Lock()
_active: list["HookRecorder"] = []
_original_register: Callable[..., Any] | None = None
_original_forward: Callable[..., Any] | None = None


class HookRecorder:
    """Records optimizer steps and wrapped comm hooks on one thread (module doc, points 2 and 3)."""

    def __init__(self, thread: int | None = None) -> None:
        self.thread = threading.get_ident() if thread is None else thread
        self.optimizer: list[tuple[float, float]] = []
        #: every call of a closure passed to an outermost optimizer step: (call, return)
        self.closures: list[tuple[float, float]] = []
        self._depth = 0  # optimizer steps in progress on the thread (one step may call another's)
        self.buckets: list[BucketStamp] = []
        #: strategy label of each hook registered while recording (:func:`strategy_label`)
        self.hooks: list[str] = []
        #: every training forward of a DDP model on the thread: (call, samples in its batch)
        self.forwards: list[tuple[float, int]] = []
        self._handles: list[Any] = []
        self._pre: float | None = None

    def start(self) -> "HookRecorder":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step)]
        with _lock:
            if not _active:
                _patch()
            _active.append(self)
        return self

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        with _lock:
            if self in _active:
                _active.remove(self)
                if not _active:
                    _unpatch()

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if threading.get_ident() != self.thread:
            return None
        self._depth += 1
        if self._depth > 1:
            return None
        self._pre = CLOCK.now()
        # the closure, positional (``step(closure)``) or by name (Lightning's ``step(closure=...)``)
        if args and callable(args[0]):
            return (self._stamped(args[0]), *args[1:]), kwargs
        if callable(kwargs.get("closure")):
            return args, dict(kwargs, closure=self._stamped(kwargs["closure"]))
        return None

    def _stamped(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        @functools.wraps(closure)
        def stamped() -> Any:
            called = CLOCK.now()
            try:
                return closure()
            finally:
                self.closures.append((called, CLOCK.now()))

        return stamped

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != self.thread or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._pre is not None:
            self.optimizer.append((self._pre, CLOCK.now()))
            self._pre = None


def strategy_label(hook: Any, state: Any) -> str:
    """A strategy name for a DDP comm hook and its state, as ``gradwire predict`` names strategies.

    ``sync`` for the built-in and PyTorch's allreduce hook, the compressor's
    name for gradwire's compression hook, ``delayed`` (``C+delayed``),
    ``torch-fp16``, ``torch-powersgd:R``; ``hook:NAME`` for any other hook.
    """
    name = getattr(hook, "__name__", type(hook).__name__)
    if name == "_timed_hook" and hasattr(state, "hook"):  # gradwire's sync strategy times the hook it wraps
        return strategy_label(state.hook, state.state)
    compressor = getattr(getattr(state, "compressor", None), "name", None)
    if name == "allreduce_hook":
        return "sync"
    if name == "compression_hook" and compressor:
        return compressor
    if name.lstrip("_") == "delayed_hook":
        return f"{compressor}+delayed" if compressor else "delayed"
    if name == "fp16_compress_hook":
        return "torch-fp16"
    if name == "powerSGD_hook" and hasattr(state, "matrix_approximation_rank"):
        return f"torch-powersgd:{state.matrix_approximation_rank}"
    return f"hook:{name}"


def _recorders() -> list[HookRecorder]:
    me = threading.get_ident()
    return [r for r in list(_active) if r.thread == me]


def _wrap(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)  # DDP checks the hook's signature and name (bf16 on CPU) through __wrapped__
    def recorded(state: Any, bucket: Any) -> Any:
        recorders = _recorders()
        if not recorders:
            return hook(state, bucket)
        called = CLOCK.now()
        fut = hook(state, bucket)
        returned = CLOCK.now()
        buf = bucket.buffer()
        stamp = BucketStamp(bucket.index(), buf.numel() * buf.element_size(), buf.element_size(), called, returned)
        for r in recorders:
            r.buckets.append(stamp)

        def done(f: torch.futures.Future) -> Any:
            # on the simulated clock a future of the backend's or of an exchange's chain carries its instant: a
            # future that completed before this callback was attached runs it at once, in this thread, whose
            # reading is the training thread's, not the completion's
            at = SIMCLOCK.instant_of(fut)
            stamp.done = CLOCK.now() if at is None else at
            return f.value()

        return fut.then(done)

    return recorded


def batch_of(args: tuple, kwargs: dict[str, Any]) -> int | None:
    """Samples in a forward's batch: the leading dimension of its first tensor argument (positional, else by
    name; inside a list, tuple or dict too: Lightning hands its module the batch as ``[x, y]``), None when it
    has none."""
    pending: list[Any] = [*args, *kwargs.values()]
    while pending:
        value = pending.pop(0)
        if isinstance(value, torch.Tensor):
            return int(value.shape[0]) if value.dim() else None
        if isinstance(value, (list, tuple)):
            pending[:0] = list(value)
        elif isinstance(value, dict):
            pending[:0] = list(value.values())
    return None


def _patch() -> None:
    global _original_register, _original_forward
    from torch.nn.parallel import DistributedDataParallel as DDP

    original = DDP.__dict__["register_comm_hook"]
    _original_register = original

    def register_comm_hook(self: Any, state: object, hook: Callable) -> None:
        for r in _recorders():
            r.hooks.append(strategy_label(hook, state))
        return original(self, state, _wrap(hook))

    register_comm_hook.__doc__ = original.__doc__
    setattr(DDP, "register_comm_hook", register_comm_hook)

    real_forward = _original_forward = DDP.__dict__["forward"]

    @functools.wraps(real_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorders = _recorders()
        if recorders and torch.is_grad_enabled():  # a training forward (an evaluation's is no micro-step)
            n = batch_of(args, kwargs)
            if n is not None:
                for r in recorders:
                    r.forwards.append((CLOCK.now(), n))
        return real_forward(self, *args, **kwargs)

    setattr(DDP, "forward", forward)


def _unpatch() -> None:
    global _original_register, _original_forward
    from torch.nn.parallel import DistributedDataParallel as DDP

    if _original_register is not None:
        setattr(DDP, "register_comm_hook", _original_register)
        _original_register = None
    if _original_forward is not None:
        setattr(DDP, "forward", _original_forward)
        _original_forward = None


def _between(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of ``spans`` inside ``[lo, hi]``."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)


def steps(backwards: list[tuple[float, float, float]], optimizer: list[tuple[float, float]],
          buckets: list[BucketStamp], events: list[Any], waits: list[tuple[float, float]],
          closures: list[tuple[float, float]] | None = None,
          forwards: list[tuple[float, int]] | None = None) -> list[dict[str, Any]]:
    """One dict per step (module doc); times relative to the step's synchronising backward call.

    Keys: ``forward``, ``backward`` (compute), ``backward_wait`` (compute end
    to return), ``after_backward`` (return to the optimizer), ``waited``
    (the training thread's waits for communication in ``after_backward``),
    ``optimizer``, ``step`` (the whole step), ``evaluations`` (backwards in
    the step: more than one where a closure ran several times),
    ``micro_steps`` (backward passes of the step, its micro-steps of
    gradient accumulation and the synchronising one), ``micro_seconds`` (the
    seconds of each micro-step before the synchronising one), ``batch`` (samples
    of the synchronising micro-step's forward, from ``forwards``: (call,
    samples) of each DDP forward; None: not seen), ``origin``
    (the backward call itself, on the backend's clock: what the step's times
    are relative to, so that two steps' times can be set on one line), ``buckets``
    (index, nbytes, element_size, ready, hook, done) and ``collectives`` (op,
    group, seq, nbytes, issued, started, completed, inner).
    """
    out: list[dict[str, Any]] = []
    events = sorted(events, key=lambda e: e.issued)

    marks = sorted([s.called for s in buckets] + [e.issued for e in events])

    def synced(bw: _Backward) -> bool:  # a bucket handed over or a collective issued while it ran
        return bisect.bisect_right(marks, bw[2]) > bisect.bisect_left(marks, bw[0])

    units = _accumulated(_units(sorted(backwards), sorted(optimizer), sorted(closures or [])), synced)
    prev_end: float | None = None
    for k, (micro, (first, opt, after, evaluations)) in enumerate(units):
        b0, computed, returned = first
        nxt = (units[k + 1][0] or [units[k + 1][1][0]])[0][0] if k + 1 < len(units) else float("inf")
        end = opt[1] if opt else returned
        start = micro[0][0] if micro else b0
        if prev_end is None or prev_end > start:
            prev_end = end
            continue
        micro_seconds, lead = [], prev_end
        for bw in micro:
            micro_seconds.append(bw[2] - lead)
            lead = bw[2]
        mine = [s for s in buckets if b0 <= s.called <= computed]
        if mine:
            rows = [{"index": s.index, "nbytes": s.nbytes, "element_size": s.element_size, "ready": s.called - b0,
                     "hook": s.returned - s.called, "done": None if s.done is None else s.done - b0} for s in mine]
        else:  # DDP's built-in all_reduce: issued when the bucket is ready
            rows = [{"index": i, "nbytes": e.payload_bytes, "element_size": 4, "ready": e.issued - b0, "hook": 0.0,
                     "done": (e.completed - b0) if e.completed else None}
                    for i, e in enumerate(e for e in events
                                          if e.op == "all_reduce" and e.floating and b0 <= e.issued <= computed)]
        colls = [{"op": e.op, "group": e.group, "seq": e.seq, "nbytes": e.payload_bytes, "issued": e.issued - b0,
                  "started": e.started - b0, "completed": (e.completed - b0) if e.completed else None,
                  "inner": (e.inner_done - e.issued) if e.inner_done else None}
                 for e in events if b0 <= e.issued < nxt]
        o0, o1 = (after, opt[1]) if opt else (returned, returned)
        batch = next((n for t, n in reversed(forwards or []) if lead <= t <= b0), None)
        out.append({"forward": b0 - lead, "backward": computed - b0, "backward_wait": returned - computed,
                    "after_backward": o0 - returned, "waited": _between(waits, returned, o0),
                    "optimizer": o1 - o0, "step": end - prev_end, "evaluations": evaluations,
                    "micro_steps": len(micro) + 1, "micro_seconds": micro_seconds, "batch": batch, "origin": b0,
                    "buckets": rows, "collectives": colls})
        prev_end = end
    return out


_Backward = tuple[float, float, float]
_Unit = tuple[_Backward, "tuple[float, float] | None", float, int]


def _accumulated(units: list[_Unit], synced: Callable[[_Backward], bool]) -> list[tuple[list[_Backward], _Unit]]:
    """Each step as (its micro-steps, its synchronising unit): module doc, gradient accumulation.

    A unit without an optimizer step whose backward did not synchronise is a
    micro-step of the next unit; micro-steps with no unit after them (the
    end of the run) are units of their own, as they were.
    """
    out: list[tuple[list[_Backward], _Unit]] = []
    pending: list[_Backward] = []
    for unit in units:
        bw, opt = unit[0], unit[1]
        if opt is None and unit[3] == 1 and not synced(bw):
            pending.append(bw)
            continue
        out.append((pending, unit))
        pending = []
    out += [([], (bw, None, bw[2], 1)) for bw in pending]
    return out


def _units(backwards: list[_Backward], optimizer: list[tuple[float, float]],
           closures: list[tuple[float, float]]) -> list[_Unit]:
    """Each step as (its first backward, its optimizer step, where its optimizer time starts, evaluations).

    A backward inside an optimizer step ran in a closure: every such backward
    of one optimizer step makes one unit, whose optimizer time starts when
    the closure call around its first backward returned. Any other backward
    takes the first optimizer step that starts after it returned and before
    the next backward (none: a step without an optimizer, as before).
    """
    inside: dict[int, list[_Backward]] = {}
    plain: list[_Backward] = []
    for bw in backwards:
        k = next((i for i, (a, b) in enumerate(optimizer) if a <= bw[0] and bw[2] <= b), None)
        if k is None:
            plain.append(bw)
        else:
            inside.setdefault(k, []).append(bw)
    units: list[_Unit] = []
    for k, mine in inside.items():
        b0, _, returned = mine[0]
        after = next((c1 for c0, c1 in closures if c0 <= b0 and returned <= c1), returned)
        units.append((mine[0], optimizer[k], after, len(mine)))
    free = [span for i, span in enumerate(optimizer) if i not in inside]
    starts = sorted([bw[0] for bw in backwards])
    for bw in plain:
        nxt = next((t for t in starts if t > bw[0]), float("inf"))
        opt = next(((a, b) for a, b in free if bw[2] <= a < nxt), None)
        units.append((bw, opt, opt[0] if opt else bw[2], 1))
    return sorted(units, key=lambda u: u[0][0])
