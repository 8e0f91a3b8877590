"""Per-op compute of the user's own run (``gradwire profile --ops``): what ``device=profile:DIR`` replays.

An :class:`OpRecorder` is a torch dispatch mode entered on the training
thread (torch hands it to autograd's threads too, so a GPU's backward is
seen). It times a window of optimizer steps, op by op:

1. the first ``skip`` optimizer steps (2) run unrecorded (DDP rebuilds its
   buckets in the second, allocators warm up), then ``steps`` steps are timed,
   every other one (timed, untimed, timed...: a host whose load changes
   changes both alike); in a timed step each op's time is read on the run's
   own clock: wall time on the realtime clock and on a GPU, the thread's CPU
   time on the simulated clock with ``device=host`` (what that clock charges,
   and what other processes on the host do not inflate); on CUDA each op is
   synchronised before and after (so its time is its kernels', not its
   launch's); ops of the backend's own
   work (:meth:`SimClock.in_backend`) are not the rank's compute and are
   skipped;
2. per op key (:func:`gradwire.device.op_key`): calls, seconds, and the op's
   roofline time on the recorded device's kind (``cpu-core`` on a CPU), whose
   ratio prices the ops a replay meets that the recording does not hold;
3. between timed steps the recorder leaves the dispatch stack, and the
   untimed steps run as the script runs them: their median (:mod:`.steps`)
   is the recorded step, whose compute less the timed steps' median op time
   is the framework's time between ops (:func:`merge`).

:func:`merge` turns the ranks' records into one device's recording
(:func:`gradwire.device.recorded.write_recording`). Trap: timing every op
adds Python overhead between the ops of a timed step; that is why the timed
steps are not the recorded step.
"""
from __future__ import annotations

import platform
import re
import statistics
import time
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from gradwire.backend.simclock import SIMCLOCK
from gradwire.device import DEVICES, model_signature, op_cost, op_key, op_seconds
from gradwire.device.recorded import on_first_model_forward

__all__ = ["OpRecorder", "device_of", "merge"]


def device_of(cuda: bool) -> dict[str, str]:
    """The device the rank computed on: ``{"name", "kind", "description", "base"}``.

    ``name`` is what ``profile:DIR@NAME`` selects: ``cpu``, or the GPU's
    name in lowercase with dashes (``nvidia-h100-80gb-hbm3``); ``base`` is the
    roofline of its kind that prices ops the recording does not hold.
    """
    if cuda:
        full = torch.cuda.get_device_name()
        name = re.sub(r"[^a-z0-9.]+", "-", full.lower()).strip("-")[:64] or "cuda"
        base = next((d for d in ("h100", "a100", "v100", "t4") if d in name), "a100")
        return {"name": name, "kind": "cuda", "description": full, "base": base}
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"name": "cpu", "kind": "cpu", "description": f"{model} ({cores} cores)", "base": "cpu-core"}


class OpRecorder(TorchDispatchMode):
    """Times every op of ``steps`` optimizer steps after ``skip`` (module doc)."""

    def __init__(self, steps: int = 5, skip: int = 2) -> None:
        super().__init__()
        if steps < 1 or skip < 0:
            raise ValueError(f"an op recording needs steps >= 1 and skip >= 0, got {steps} and {skip}")
        self.steps, self.skip = steps, skip
        #: op key -> [calls, seconds, roofline seconds of one call]
        self.table: dict[str, list[float]] = {}
        #: per recorded step: (seconds of its ops, its ops)
        self.per_step: list[tuple[float, int]] = []
        self.signature: dict[str, Any] | None = None
        self.cuda = False
        self.recording = False
        #: the backend clock's time when the last timed step ended; None: fewer steps ran
        self.ended_at: float | None = None
        #: (start, end) of each timed step on the backend's clock: the steps between them are the untimed ones
        self.spans: list[tuple[float, float]] = []
        self._done = 0
        self._sec, self._ops = 0.0, 0
        self._handles: list[Any] = []
        self._entered = False
        #: what an op's time is read from: the run's own clock (wall time, or the thread CPU time of device=host)
        self._timer = time.perf_counter
        self.meter = "wall time"

    def start(self) -> "OpRecorder":
        """Hook the optimizer's steps; the first timed step starts after ``skip`` of them."""
        device = SIMCLOCK.device if SIMCLOCK.enabled else None
        if device is not None and device.kind == "host":  # the clock's own meter: this thread's CPU time
            self._timer, self.meter = time.thread_time, "thread CPU time (clock=sim,device=host)"
        self._handles.append(register_optimizer_step_post_hook(self._after_step))
        self._handles.append(on_first_model_forward(self._model))
        if self.skip == 0:
            self._open()
        return self

    def _model(self, module: Any) -> None:
        self.signature = model_signature(module.named_parameters())

    def stop(self) -> None:
        """Leave the dispatch stack (if still on it) and remove the hooks; idempotent."""
        self.recording = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._leave()

    def _open(self) -> None:
        from gradwire.backend.completer import CLOCK

        self.recording = True
        self._sec, self._ops = 0.0, 0
        self.spans.append((CLOCK.now(), float("inf")))
        self.__enter__()
        self._entered = True

    def _leave(self) -> None:
        if self._entered and _get_current_dispatch_mode() is self:
            self.__exit__(None, None, None)
            self._entered = False

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        from gradwire.backend.completer import CLOCK

        self._done += 1
        if self.recording:  # a timed step ended: the next one runs untimed (leaving the stack: no cost)
            self.per_step.append((self._sec, self._ops))
            self.recording = False
            self.spans[-1] = (self.spans[-1][0], CLOCK.now())
            self._leave()
            if len(self.per_step) >= self.steps:
                self.ended_at = CLOCK.now()
        elif self._done > self.skip and len(self.per_step) < self.steps and (self._done - self.skip) % 2 == 1:
            self._open()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.recording or SIMCLOCK.in_backend():
            return func(*args, **kwargs)
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if cuda:
            self.cuda = True
            torch.cuda.synchronize()
        t0 = self._timer()
        out = func(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        seconds = self._timer() - t0
        key = op_key(func, args, kwargs)
        entry = self.table.get(key)
        if entry is None:
            base = DEVICES["cpu-core" if not cuda else device_of(True)["base"]]
            entry = self.table[key] = [0, 0.0, op_seconds(base, *op_cost(func, args, kwargs, out))]
        entry[0] += 1
        entry[1] += seconds
        self._sec += seconds
        self._ops += 1
        return out

    def summary(self) -> dict[str, Any]:
        """This rank's record: ops, per-step op time, model signature, device, torch, window end."""
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else None
        return {"world_size": world, "ops": {k: {"calls": int(c), "seconds": s, "roofline": r} for k, (c, s, r) in self.table.items()},
                "per_step": [list(p) for p in self.per_step], "model": self.signature,
                "device": device_of(self.cuda), "torch": torch.__version__, "ended_at": self.ended_at, "meter": self.meter,
                "spans": [list(sp) for sp in self.spans]}


def _clean(rank: dict[str, Any]) -> list[dict[str, Any]]:
    """The rank's untimed steps between its timed ones: what its run takes without the recorder, at the same time."""
    spans = rank["op_record"].get("spans") or []
    closed = [(a, b) for a, b in spans if b != float("inf")]
    if len(closed) < 2:
        return []
    lo, hi = closed[0][0], closed[-1][1]
    return [s for s in rank.get("steps", []) if lo < s.get("origin", lo) < hi
            and not any(a <= s["origin"] <= b for a, b in closed)]


def _step_factors(recs: list[dict[str, Any]], clean: list[list[dict[str, Any]]],
                  compute: float) -> tuple[dict[str, list[float]], float]:
    """Each rank's compute in each of its clean steps over the recorded ``compute``, and the steps' spread.

    ``{rank: [factor of clean step 1, 2, ...]}``: a replay multiplies rank r's
    compute in its n-th step by ``factors[r][n % len]``, so that its ranks
    differ step by step as the recorded ones did (the recorded ranks waited
    for each other at every collective by as much). A rank's compute in a step
    is the step less the communication it waited for; over the recording's
    compute (what its ops are scaled to), so that a replayed step computes
    what its recorded one did, not the steps' mean. The spread is the mean
    over the clean steps of the slowest rank's compute less the ranks' mean:
    what a replay whose ranks all compute alike leaves out of the step.
    Empty (and 0) with fewer than two clean steps on any rank.
    """
    if not all(clean):
        return {}, 0.0
    n = min(len(c) for c in clean)
    computes = [[max(s["step"] - s["backward_wait"] - s["waited"], 0.0) for s in c[:n]] for c in clean]
    if compute <= 0:
        return {}, 0.0
    factors = {str(r.get("rank", i)): [x / compute for x in c] for i, (r, c) in enumerate(zip(recs, computes))}
    spread = statistics.fmean(max(col) - statistics.fmean(col) for col in zip(*computes))
    return factors, spread


def merge(ranks: list[dict[str, Any]], net: str) -> dict[str, Any]:
    """One device's recording from the ranks' ``rank*.json`` records (module doc); ValueError if there is none.

    Per op key, calls and seconds are summed over ranks (a replay prices every
    rank alike, at the mean); the ops of a step are the window's median step's.
    The recorded step is each rank's median untimed
    step between its timed ones, averaged over ranks; its compute is the step less the
    communication the rank waited for (``backward_wait`` + ``waited``).
    """
    recs = [r for r in ranks if r.get("op_record")]
    if not recs:
        raise ValueError("no rank recorded ops: did the script call torch.distributed.init_process_group?")
    if not any(r["op_record"]["per_step"] for r in recs):
        raise ValueError("no optimizer step was recorded: --ops needs a script whose optimizer steps "
                         "(torch.optim), and at least 2 + 2 x --ops-steps steps")
    table: dict[str, list[float]] = {}
    for r in recs:
        for key, o in r["op_record"]["ops"].items():
            e = table.setdefault(key, [0, 0.0, o["roofline"]])
            e[0] += o["calls"]
            e[1] += o["seconds"]
    per_step = [p for r in recs for p in r["op_record"]["per_step"]]
    # the median step of the window: a one-off step (DDP's bucket rebuild, a lazy allocation) is not a step
    op_seconds_step = statistics.median(p[0] for p in per_step)
    ops_step = statistics.median(p[1] for p in per_step)
    clean = [_clean(r) for r in recs]
    if all(clean):
        step = statistics.fmean(statistics.median(s["step"] for s in c) for c in clean)
        waited = statistics.fmean(statistics.median(s["backward_wait"] + s["waited"] for s in c) for c in clean)
    else:  # fewer than two timed steps: every step, the timed ones' recorder overhead in them
        window = [s for r in recs for s in r.get("steps", [])]
        step = statistics.median(s["step"] for s in window) if window else op_seconds_step
        waited = statistics.median(s["backward_wait"] + s["waited"] for s in window) if window else 0.0
    compute = max(step - waited, 0.0)
    factors, spread = _step_factors(recs, clean, compute)
    gap = compute - op_seconds_step
    scale, overhead = (1.0, gap / ops_step) if gap >= 0 else (compute / op_seconds_step, 0.0)
    roofline = sum(e[0] * e[2] for e in table.values())
    seconds = sum(e[1] for e in table.values())
    first = recs[0]["op_record"]
    batches = [s.get("batch") for r in recs for s in r.get("steps", []) if s.get("batch")]
    return {
        "device": first["device"], "torch": first["torch"], "meter": first.get("meter", "wall time"), "world_size": first.get("world_size") or len(ranks), "model": first["model"] or {},
        "batch": statistics.median(batches) if batches else None, "net": net,
        "steps_recorded": len(per_step) // len(recs), "clean_steps": min(len(c) for c in clean),
        "step_seconds": step, "compute_seconds": compute, "waited_seconds": waited,
        "op_seconds_per_step": op_seconds_step, "ops_per_step": ops_step, "scale": scale, "overhead": overhead,
        "step_factors": factors, "compute_spread_seconds": spread,
        "roofline_ratio": seconds / roofline if roofline > 0 and seconds > 0 else 1.0,
        "ops": [{"key": k, "calls": int(c), "seconds": s} for k, (c, s, _) in sorted(table.items())],
    }
