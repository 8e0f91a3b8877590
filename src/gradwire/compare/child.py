"""One rank of a script under ``gradwire compare -- CMD``: apply the strategy, time the steps, keep the metrics.

Runs inside the user's processes. The profile's bootstrap calls :func:`start`
right after the script's ``init_process_group`` (already on the ``gradwire``
backend and the run's network) when ``GRADWIRE_STRATEGY`` is set, and
:func:`summary` when it writes the rank's results, at
``destroy_process_group`` or at exit. It:

1. installs the strategy (:func:`gradwire.compare.inject.install`) and writes
   ``status.rank<N>.json`` whenever its status changes, so that a refusal is
   on disk before it is raised;
2. times the steps: a step ends when the optimizer that owns the DDP's
   parameters returns from ``step()``; the first starts at the DDP's first
   forward. A script without such an optimizer has one step per DDP forward;
3. records the exposed communication as ``gradwire profile`` does (a
   :class:`~gradwire.profile.waits.WaitRecorder` on the training thread, the
   windows intersected with the collectives in flight) and the bytes of the
   collectives issued between the first forward and the last step;
4. keeps the training loss it can see: the value of every scalar tensor
   ``.backward()`` is called on (with a ``GradScaler``, the scaled loss),
   averaged per step;
5. takes the script's own :func:`gradwire.report` calls.

Environment (set by the parent, :mod:`gradwire.compare.script`):
``GRADWIRE_STRATEGY``, ``GRADWIRE_ADAM_WARMUP``, ``GRADWIRE_SEED`` (for the
script), and the profile's ``GRADWIRE_NET`` / ``GRADWIRE_PROFILE_DIR``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

import torch

__all__ = ["ADAM_WARMUP_ENV", "RECORD_KEY", "SEED_ENV", "STRATEGY_ENV", "Child", "active", "start", "summary"]

#: where the profile's bootstrap puts :func:`summary` in ``rank<N>.json``
RECORD_KEY = "compare"

STRATEGY_ENV = "GRADWIRE_STRATEGY"
ADAM_WARMUP_ENV = "GRADWIRE_ADAM_WARMUP"
SEED_ENV = "GRADWIRE_SEED"

_child: "Child | None" = None


class Child:
    """The recorder of one rank (see the module doc)."""

    def __init__(self, out: Path, strategy: str, adam_warmup: int) -> None:
        import torch.distributed as dist

        from gradwire.backend.completer import CLOCK
        from gradwire.compare.inject import install
        from gradwire.profile.waits import WaitRecorder

        self.out = out
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.clock = CLOCK
        self.step_ends: list[float] = []
        self.forwards: list[float] = []
        #: (steps done when backward was called, loss value as a detached tensor)
        self.losses: list[tuple[int, torch.Tensor]] = []
        self.reports: list[dict[str, Any]] = []
        self.ended = "running"
        self.error = ""
        self.waits = WaitRecorder().start()
        self.injection = install(strategy, adam_warmup, on_status=self._write_status)
        self.injection.step_listeners.append(self._step_ended)
        self.injection.forward_listeners.append(self._forward)
        self._patch_backward()
        self._patch_excepthook()
        import gradwire._report

        gradwire._report._sink = self._report
        self._write_status(self.injection)

    # -- recording ------------------------------------------------------------------
    def _forward(self) -> None:
        # a training forward only: an evaluation's (Lightning's sanity check before the first step, a
        # validation between epochs) runs without grad and is not a step; timed from it, the first step
        # would carry the evaluation and the data loaders' start
        if torch.is_grad_enabled():
            self.forwards.append(self.clock.now())

    def _step_ended(self) -> None:
        self.step_ends.append(self.clock.now())

    @property
    def steps(self) -> int:
        """Steps done so far (owner steps; DDP forwards when no optimizer owns the DDP)."""
        return len(self.step_ends) if self.step_ends else max(0, len(self.forwards) - 1)

    def _report(self, step: int | None, values: dict[str, float]) -> None:
        self.reports.append({"step": self.steps if step is None else step, "time": self.clock.now(),
                             "values": values})

    def _patch_backward(self) -> None:
        real_backward = torch.Tensor.backward
        child = self
        training_thread = threading.get_ident()

        def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.numel() == 1 and child.forwards and threading.get_ident() == training_thread:
                child.losses.append((child.steps, self.detach().clone().reshape(())))
            return real_backward(self, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]

    def _patch_excepthook(self) -> None:
        real = sys.excepthook
        child = self

        def excepthook(kind: Any, value: Any, tb: Any) -> None:
            child.ended = "uncaught exception"
            child.error = f"{kind.__name__}: {value}"
            real(kind, value, tb)

        sys.excepthook = excepthook

    def _write_status(self, injection: Any) -> None:
        path = self.out / f"status.rank{self.rank}.json"
        path.write_text(json.dumps(injection.record()))

    # -- the summary ------------------------------------------------------------------
    def summary(self, how: str) -> dict[str, Any]:
        """Everything the parent needs from this rank; ``how`` the script ended (destroy_process_group / exit)."""
        import gradwire
        from gradwire.strategies import network_wait
        from gradwire.profile.session import communication

        if self.ended == "running":
            self.ended = how
        self.injection.close()
        self.waits.stop()
        # a step ends when the owner's step returns; without one, where the next forward starts
        ends = list(self.step_ends) if self.step_ends else self.forwards[1:]
        start = self.forwards[0] if self.forwards else None
        out: dict[str, Any] = {"rank": self.rank, "world": self.world, "injection": self.injection.record(),
                               "ended": self.ended, "error": self.error, "steps": len(ends),
                               "timed_by": "optimizer" if self.step_ends else "forward"}
        if start is not None and ends:
            end = ends[-1]
            events = gradwire.events()
            comm, exposed = communication(start, end, events, self.waits.windows)
            network = sum(network_wait(max(a, start), min(b, end), events)
                          for a, b in self.waits.windows if b > start and a < end)
            bounds = [start] + ends
            out.update({
                "start": start, "train_seconds": end - start, "comm_seconds": comm, "exposed_seconds": exposed,
                "exposed_network_seconds": min(network, exposed),
                "step_seconds": [b - a for a, b in zip(bounds, bounds[1:])],
                "wire_bytes": sum(e.wire_bytes for e in events if start <= e.issued <= end),
                "payload_bytes": sum(e.payload_bytes for e in events if start <= e.issued <= end),
                "collectives": sum(1 for e in events if start <= e.issued <= end),
                "step_wire_bytes": _per_step(bounds, [(e.issued, e.wire_bytes) for e in events]),
            })
            out["loss"] = self._loss_curve(bounds)
            out["reports"] = [dict(r, time=r["time"] - start) for r in self.reports]
        else:
            out["reports"] = [dict(r, time=0.0) for r in self.reports]
        return out

    def _loss_curve(self, bounds: list[float]) -> dict[str, list[float]]:
        """The losses seen, averaged per step: ``{"step", "time", "value"}`` lists (time since the first forward)."""
        per_step: dict[int, list[float]] = {}
        for step, value in self.losses:
            per_step.setdefault(step, []).append(float(value))
        steps = sorted(s for s in per_step if s < len(bounds) - 1)
        return {"step": [s + 1 for s in steps], "time": [bounds[s + 1] - bounds[0] for s in steps],
                "value": [statistics.fmean(per_step[s]) for s in steps]}


def _per_step(bounds: list[float], issued: list[tuple[float, float]]) -> list[float]:
    """Bytes put on the wire in each step: ``(issue time, bytes)`` summed into ``bounds[i] <= t < bounds[i + 1]``.

    The last step also takes what was issued at its very end (the averaging
    rounds run inside the optimizer's step, before it returns).
    """
    from bisect import bisect_right

    out = [0.0] * (len(bounds) - 1)
    for t, n in issued:
        if bounds[0] <= t <= bounds[-1]:
            out[min(len(out) - 1, bisect_right(bounds, t) - 1)] += n
    return out


def start(out: Path) -> Child:
    """Start recording in this rank (once); called right after ``init_process_group``."""
    global _child
    if _child is None:
        _child = Child(Path(out), os.environ[STRATEGY_ENV], int(os.environ.get(ADAM_WARMUP_ENV, "0") or 0)
                       or _default_warmup())
    return _child


def _default_warmup() -> int:
    from gradwire.exchange.schemes import DEFAULT_ADAM_WARMUP

    return DEFAULT_ADAM_WARMUP


def active() -> bool:
    """Whether this process records for ``gradwire compare``."""
    return _child is not None


def summary(how: str) -> dict[str, Any] | None:
    """The rank's summary (None outside ``gradwire compare``)."""
    return None if _child is None else _child.summary(how)
