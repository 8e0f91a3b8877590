"""When a training thread waited for communication: the windows it spent blocked.

A rank's training thread computes or waits. Exposed communication is the time
it waited *for a collective*, seen where the wait happens. It is not wall time
minus CPU time: that also counts the time a runnable thread waits for a core,
which on a loaded machine dwarfs the network, and the time spent waiting for
the other ranks at rendezvous. The thread blocks for communication in three
places, all watched while a :class:`WaitRecorder` runs:

1. ``Work.wait()`` of a gradwire op: every blocking ``dist.*`` call (torch
   waits on the Work for ``async_op=False``, from Python, or from C++ through
   the Python override as DDP's initial broadcast does), and a user's
   ``work.wait()``.
2. ``Future.wait()`` and ``torch.futures.wait_all()``: a user waiting on
   ``work.get_future()``, on a ``then`` of it, or on a comm hook's result.
   The C++ class ``torch._C.Future`` is patched: ``then`` returns one of those,
   not the Python subclass.
3. DDP's reducer at the end of backward: it waits in C++ for every bucket's
   future (``finalize_backward``), where Python sees nothing. Backward is
   bracketed instead. When backward starts, a pre-hook on its root node queues
   an autograd engine callback. The engine runs callbacks in the order they
   were queued, once the graph has executed; DDP queues its own (the wait) when
   its last bucket is launched, after ours. So ours stamps the end of
   backward's compute, and from that stamp until ``backward()`` returns the
   thread only waits for the buckets (and copies their results back).

A window is exposed communication only while some collective was in flight
(:func:`overlap` of the windows with the ops' issue-to-completion spans): the
copy after the last bucket, a wake-up that comes late on a busy machine and a
wait on a future that is not a collective's fall outside. Exposed time can
therefore never exceed the communication time, however loaded the machine.

Trap: only the thread that started the recorder is watched; the waits of a
background thread (a handler that runs collectives beside training) hide
nothing from the training thread and are not exposed communication.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Iterable

import torch
from torch.autograd import Variable

from gradwire.backend import GradwireWork
from gradwire.backend.completer import CLOCK

__all__ = ["WaitRecorder", "length", "overlap", "union"]

Span = tuple[float, float]

_lock = threading.Lock()
_active: list["WaitRecorder"] = []
_saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) of every patch in place
_depth = threading.local()  # nesting of backward() calls per thread (reentrant checkpointing)


class WaitRecorder:
    """Collect the windows (in ``gradwire.clock()`` seconds) in which a thread blocked.

    Use as ``with WaitRecorder() as waits: train()``, then read ``waits.windows``.
    Recorders may overlap; the patches are in place while any runs.

    Args:
        thread: the watched thread's ``threading.get_ident()``; default the caller's.
    """

    def __init__(self, thread: int | None = None) -> None:
        self.thread = threading.get_ident() if thread is None else thread
        self.windows: list[Span] = []
        #: every top-level backward() of the thread: (call, end of its compute, return)
        self.backwards: list[tuple[float, float, float]] = []

    def start(self) -> "WaitRecorder":
        with _lock:
            if not _active:
                _patch()
            _active.append(self)
        return self

    def stop(self) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)
                if not _active:
                    _unpatch()

    def __enter__(self) -> "WaitRecorder":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _record(start: float, end: float) -> None:
    me = threading.get_ident()
    for recorder in list(_active):
        if recorder.thread == me:
            recorder.windows.append((start, end))


def _record_backward(start: float, computed: float, end: float) -> None:
    me = threading.get_ident()
    for recorder in list(_active):
        if recorder.thread == me:
            recorder.backwards.append((start, computed, end))


def _watched() -> bool:
    me = threading.get_ident()
    return any(r.thread == me for r in list(_active))


def _timed(wait: Callable[..., Any]) -> Callable[..., Any]:
    """``wait`` that records its window when it runs on a watched thread."""

    @functools.wraps(wait)
    def timed_wait(*args: Any, **kwargs: Any) -> Any:
        if not _watched():
            return wait(*args, **kwargs)
        start = CLOCK.now()
        try:
            return wait(*args, **kwargs)
        finally:
            _record(start, CLOCK.now())

    return timed_wait


def _timed_backward(backward: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd.backward`` that records the window after backward's compute (module doc, point 3)."""

    @functools.wraps(backward)
    def timed_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth or not _watched():  # a nested backward (checkpointing) is compute of the outer one
            return backward(tensors, *args, **kwargs)
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        computed: list[float] = []

        def stamp() -> None:
            computed.append(CLOCK.now())

        def queue_stamp(grad_outputs: Any) -> None:
            if not queued:
                queued.append(True)
                Variable._execution_engine.queue_callback(stamp)

        queued: list[bool] = []
        handles = [t.grad_fn.register_prehook(queue_stamp) for t in roots
                   if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        _depth.n = depth + 1
        begin = CLOCK.now()
        try:
            return backward(tensors, *args, **kwargs)
        finally:
            _depth.n = depth
            end = CLOCK.now()
            for h in handles:
                h.remove()
            if computed:
                _record(computed[0], end)
            _record_backward(begin, computed[0] if computed else end, end)

    return timed_backward


def _targets() -> list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    import torch.autograd
    import torch.futures

    return [
        (GradwireWork, "wait", _timed),
        (torch._C.Future, "wait", _timed),
        (torch.futures, "wait_all", _timed),
        (torch.autograd, "backward", _timed_backward),
    ]


def _patch() -> None:
    for owner, name, wrap in _targets():
        # the raw class attribute, so that putting it back restores a method and not a plain function
        original = owner.__dict__[name]
        _saved.append((owner, name, original))
        setattr(owner, name, wrap(getattr(owner, name)))


def _unpatch() -> None:
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)


# --------------------------------------------------------------------- spans
def union(spans: Iterable[Span]) -> list[Span]:
    """Sorted, disjoint spans covering the same time as ``spans`` (empty spans dropped)."""
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans: Iterable[Span]) -> float:
    """Seconds covered by ``spans`` (overlaps counted once)."""
    return sum(b - a for a, b in union(spans))


def overlap(first: Iterable[Span], second: Iterable[Span]) -> float:
    """Seconds covered by both ``first`` and ``second``: at most ``length`` of either."""
    xs, ys = union(first), union(second)
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if hi > lo:
            total += hi - lo
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total
