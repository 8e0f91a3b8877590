"""Measure what the step model needs of a host: its compute, its real collectives, each exchange's CPU work.

:func:`calibrate` starts the job's ranks on this machine (``world`` of them,
as the training would) and measures, in every rank at once (so that the
cores are as busy as in training):

1. the reference step: the bundled model trained for a few epochs with
   ``sync`` on the ``local`` network (every all_reduce answered on the rank,
   :mod:`gradwire.backend.local`), the time each step computes, as a
   comparison's compute-only run measures it (the mean step of an epoch,
   each of its steps the median over epochs); and, apart, the shares of
   forward, backward and optimizer in a plain step of the model;
2. the real collectives (:class:`~gradwire.predict.host.Floors`): every op
   the exchanges use, at a few sizes, on the ``gradwire`` backend over
   ``loopback`` (nothing modelled, so an op takes what the host makes it
   take), each call after a stretch of compute as in a step: the median wall
   seconds per call, and the median CPU seconds it takes from its rank;
3. each exchange's CPU stages: a compressor's with
   :func:`gradwire.predict.codec.codec_cost`, a hook's
   (:class:`~gradwire.strategies.ExchangeModel`) with
   :func:`gradwire.predict.codec.stage_seconds` at each bucket it will
   price, and one pass over a bucket's memory (a copy);
4. each strategy's exchanges as they run: a short training of the model
   under the strategy on ``loopback``, recorded as ``gradwire profile``
   records a job (:mod:`gradwire.predict.measure`), gives per bucket the
   hook's time, each real collective's duration, the callbacks between
   them and the decode (:class:`~gradwire.predict.timeline.MeasuredExchange`):
   what the exchange costs on this host besides the network, thread
   hand-offs and the ranks' meeting included, which the stages of point 3
   alone do not see. (Back to back, the real collectives of point 2 would
   find gloo's threads awake and their buffers in cache and take half the
   time they take after a backward.) The whole recorded step is
   kept (:class:`~gradwire.predict.timeline.StepProfile`: forward, backward
   and the buckets' ready times as they ran, the optimizer, the mean step):
   the replay of that run is fitted to it (:func:`gradwire.predict.calibrated`,
   backward stretched), so that CPU work the exchange's figures do not show
   (the strategy's own work outside its hook, its slow steps) is priced too.

Figures are the mean over the ranks. A strategy's run is at one pace
throughout: :meth:`Calibration.profile` scales it to the compute asked for.
:meth:`Calibration.scaled` moves the other figures to the pace the host had
elsewhere: a comparison divides its compute-only run's compute (each seed's,
taken as :func:`reference_step` takes the reference's) by the reference step
and scales every figure by that, so that CPU work measured here, at one
moment of a shared machine's load, is priced at the pace of the runs it is
set beside. Every figure is a median (of calls, of steps, of each step's
place in an epoch): the work itself, with as little of another job's
preemption as it can; but a strategy's own step is its runs' mean, as a
comparison's time is (a strategy's slow steps are its cost). Nothing is
fitted to a run on the networks predicted:
the calibration's runs have no network at all.

Trap: on a machine other jobs share, a calibration under a load the runs
did not see is only as right as that scaling; the load is recorded with it.
"""
from __future__ import annotations

import datetime
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from gradwire.predict.codec import BucketKey, CodecCost, HookCost, Line, codec_cost, stage_seconds
from gradwire.predict.host import Floors, Host
from gradwire.predict.timeline import StepProfile

__all__ = ["Calibration", "FLOOR_SIZES", "calibrate", "reference_step"]

_TIMEOUT = datetime.timedelta(seconds=300)
#: bytes the real collectives are timed at (their nccl-tests sizes)
FLOOR_SIZES = (4 << 10, 64 << 10, 512 << 10, 4 << 20)
#: the ops the exchanges issue
_OPS = ("all_reduce", "all_to_all", "all_gather")
#: untimed and timed calls per op and size
_WARM, _TIMED = 3, 15


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` measured (module doc); figures in seconds."""

    world: int
    host: Host
    compute: float
    """the reference step's compute: mean seconds per step of ``sync`` on ``local``"""
    full: float
    """the reference step's compute with a full batch (an epoch's last batch is partial)"""
    shares: tuple[float, float, float]
    """forward, backward and optimizer, as shares of a plain step of the model"""
    codecs: Mapping[str, CodecCost] = field(default_factory=dict)
    """each compressor's stages, by its spec"""
    hooks: Mapping[str, HookCost] = field(default_factory=dict)
    """each hook's stages at the buckets asked for, by the hook's name"""
    profiles: Mapping[str, StepProfile] = field(default_factory=dict)
    """each strategy's step as it ran on loopback (:mod:`gradwire.predict.recorded`): its compute, its
    buckets and their exchanges, its mean step past the warm-up (``loop_seconds``); at its own pace"""
    load: tuple[float, ...] = ()
    """the host's 1, 5 and 15 minute load average when it ended"""
    scale: float = 1.0
    """the factor :meth:`scaled` multiplied the figures by (not the strategies' runs)"""

    def scaled(self, factor: float) -> "Calibration":
        """Every CPU figure times ``factor`` (module doc); the reference step too. The strategies' own
        runs keep their pace: :meth:`profile` sets each to the pace asked for."""
        return replace(self, host=self.host.scaled(factor), compute=self.compute * factor, full=self.full * factor,
                       codecs={k: c.scaled(factor) for k, c in self.codecs.items()},
                       hooks={k: h.scaled(factor) for k, h in self.hooks.items()}, scale=self.scale * factor)

    def profile(self, strategy: str, compute: float) -> StepProfile | None:
        """``strategy``'s run on loopback at the pace of a step that computes ``compute`` seconds (None: not run).

        A run is internally at one pace: scaled so that its own compute is
        ``compute``, another job's load that slowed the whole run leaves it,
        while what the strategy costs beside its compute stays. Trap: a
        strategy whose exchanges overlap its compute on busy cores
        (``delayed``) computed slower for them, which is its cost, not the
        pace: it is set to the pace of the runs beside it whose exchanges
        block (the median of their compute), which ran minutes from it with
        real collectives as it did; the reference run (no collective at all,
        and the first of the calibration) only where no such run was made.
        """
        found = self.profiles.get(strategy)
        if found is None:
            return None
        own = found.compute_seconds  # at the calibration's pace
        if self.host.busy_cores and _overlapped(strategy):
            blocking = [p.compute_seconds for name, p in self.profiles.items() if not _overlapped(name)]
            own = statistics.median(blocking) if blocking else self.compute / self.scale
        return found.scaled(compute / own)

    def cost_for(self, codec: Any) -> Any:
        """The measured CPU cost of a codec (a compressor's spec or a hook's model); free for None."""
        from gradwire.predict.codec import FREE

        if codec is None:
            return FREE
        if isinstance(codec, str):
            return self.codecs.get(codec) or codec_cost(codec)
        return self.hooks.get(codec.name) or HookCost(codec)

    def as_dict(self) -> dict[str, Any]:
        return {"world": self.world, "compute": self.compute, "full": self.full, "shares": list(self.shares),
                "busy_cores": self.host.busy_cores, "floors": self.host.floors.as_dict(),
                "work": self.host.work.as_dict(),
                "copy": [self.host.copy.fixed, self.host.copy.per_element],
                "codecs": {k: {**{s: [getattr(c, s).fixed, getattr(c, s).per_element]
                                  for s in ("encode", "serve", "decode", "per_rank")},
                               "wide": [[line.fixed, line.per_element] for line in c.wide]}
                           for k, c in self.codecs.items()},
                "hooks": {k: [{"numel": key[0], "shapes": [list(s) for s in key[1]], "world": key[2],
                               "stages": [t * h.scale for t in v]} for key, v in h.measured.items()]
                          for k, h in self.hooks.items()},
                "profiles": {k: p.as_dict() for k, p in self.profiles.items()},
                "load": list(self.load)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], hook_models: Sequence[Any] = ()) -> "Calibration":
        """The inverse of :meth:`as_dict`, unscaled (a comparison's ``results.json`` keeps it under
        ``predicted.calibration``, with the factor it priced it at as ``scale``: apply it with :meth:`scaled`).

        ``hook_models``: the :class:`~gradwire.strategies.ExchangeModel` of each hook whose stages it holds
        (a hook is saved by its name only); a hook not among them is left out.
        """
        models = {m.name: m for m in hook_models}
        lines = ("encode", "serve", "decode", "per_rank")
        hooks = {name: HookCost(models[name], measured={
                     (int(e["numel"]), tuple(tuple(int(x) for x in s) for s in e["shapes"]), int(e["world"])):
                     tuple(float(t) for t in e["stages"]) for e in entries})
                 for name, entries in d.get("hooks", {}).items() if name in models}
        host = Host(Floors.from_dict(d["floors"]), Floors.from_dict(d["work"]), Line(*d["copy"]),
                    bool(d["busy_cores"]))
        return cls(int(d["world"]), host, float(d["compute"]), float(d["full"]),
                   (d["shares"][0], d["shares"][1], d["shares"][2]),
                   {k: CodecCost(Line(*c["encode"]), Line(*c["serve"]), Line(*c["decode"]), Line(*c["per_rank"]),
                                 tuple(Line(*w) for w in c.get("wide", ()))) for k, c in d.get("codecs", {}).items()},
                   hooks, {k: StepProfile.from_dict(p) for k, p in d.get("profiles", {}).items()},
                   tuple(d.get("load", ())))


def _overlapped(strategy: str) -> bool:
    """Whether ``strategy``'s exchanges run while the next step computes (``delayed``)."""
    from gradwire.strategies import Timing, parse_strategy

    return parse_strategy(strategy).timing is Timing.NEXT_STEP


@dataclass(frozen=True)
class _Request:
    model: str
    batch_size: int
    codecs: tuple[str, ...]
    hooks: tuple[tuple[Any, tuple[BucketKey, ...]], ...]
    epochs: int
    strategies: tuple[str, ...] = ()
    steps: int = 40


#: seconds of compute before each timed collective (a step's backward, shortened)
_COMPUTE_GAP = 0.004


def _time_op(op: str, nbytes: int, world: int) -> tuple[float, float]:
    """Median seconds per call of ``op`` at ``nbytes`` (nccl-tests convention), each after some compute,
    and the median CPU seconds the call took from this rank (every thread of the process, the kernel's too).

    Back to back, a collective finds gloo's threads awake and its buffers in
    cache and takes half what it takes after a backward; the ranks compute
    for :data:`_COMPUTE_GAP` before each call, as before a step's exchange.
    The caller only waits meanwhile: the CPU time is the collective's.
    """
    import torch
    import torch.distributed as dist

    a = torch.randn(192, 192)

    def compute() -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < _COMPUTE_GAP:
            a @ a

    if op == "all_reduce":
        x = torch.ones(max(1, nbytes // 4))

        def call() -> None:
            dist.all_reduce(x, async_op=True).wait()
    elif op == "all_to_all":
        send = torch.zeros(max(world, nbytes // world * world), dtype=torch.uint8)
        recv = torch.empty_like(send)

        def call() -> None:
            dist.all_to_all_single(recv, send, async_op=True).wait()
    else:
        row = torch.zeros(max(1, nbytes // world), dtype=torch.uint8)
        rows = list(torch.empty(world, row.numel(), dtype=torch.uint8).unbind(0))

        def call() -> None:
            dist.all_gather(rows, row, async_op=True).wait()
    times, cpu = [], []
    for i in range(_WARM + _TIMED):
        compute()
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        if i >= _WARM:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def reference_step(steps: Sequence[float], per_epoch: int) -> tuple[float, float]:
    """The mean step of an epoch, and its typical full step: each of its places the median over the epochs
    after the first.

    An epoch's steps differ (its last batch is partial: the full step is the
    median of the places); a moment of another job's load lengthens one step
    of one epoch: the median of each place leaves that out, as the medians
    of the other figures do.
    """
    epochs = [steps[i:i + per_epoch] for i in range(per_epoch, len(steps) - per_epoch + 1, per_epoch)]
    if not epochs:
        return statistics.fmean(steps), statistics.median(steps)
    places = [statistics.median(col) for col in zip(*epochs)]
    return statistics.fmean(places), statistics.median(places)


def _shares(model: str, batch_size: int) -> tuple[float, float, float]:
    """Forward, backward and optimizer shares of a plain step of ``model`` (medians of a few steps)."""
    import torch
    from torch import nn

    from gradwire.train.data import load_digits
    from gradwire.train.models import build_model

    data = load_digits()
    net = build_model(model, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = data.x_train[:batch_size], data.y_train[:batch_size]
    parts: list[tuple[float, float, float]] = []
    for _ in range(12):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        parts.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    f, b, o = (statistics.median(p[i] for p in parts[2:]) for i in range(3))
    total = f + b + o
    return f / total, b / total, o / total


def _copy_line() -> Line:
    """One pass over ``n`` fp32 elements (``copy_``), fitted through two sizes."""
    import torch

    small, large = 1 << 16, 1 << 21
    out = []
    for n in (small, large):
        x, y = torch.randn(n), torch.empty(n)
        times = []
        for i in range(20):
            t0 = time.perf_counter()
            y.copy_(x)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return Line.fit(small, out[0], large, out[1])


def _rank(rank: int, world: int, request: _Request) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import gradwire
    from gradwire.net import NetSpec
    from gradwire.strategies import parse_strategy
    from gradwire.predict.measure import MeasureConfig, run_recorded
    from gradwire.train.loop import TrainConfig, train_rank

    torch.set_num_threads(1)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=_TIMEOUT)
    out: dict[str, Any] = {}
    gradwire.configure("local")
    dist.init_process_group("gradwire", store=dist.PrefixStore("calibrate/local/", store), rank=rank,
                            world_size=world, timeout=_TIMEOUT)
    run = train_rank(TrainConfig(strategy=parse_strategy("sync"), net=NetSpec.of("local"), model=request.model,
                                 epochs=request.epochs,
                                 batch_size=request.batch_size))
    out["compute"], out["full"] = reference_step(run.step_compute, len(run.step_compute) // request.epochs)
    dist.destroy_process_group()
    gradwire.configure("loopback")
    dist.init_process_group("gradwire", store=dist.PrefixStore("calibrate/loopback/", store), rank=rank,
                            world_size=world, timeout=_TIMEOUT)
    for _ in range(2):  # the first pass sets up each op's buffers and gloo's pairs: the second is timed
        out["floors"] = {op: [(n, _time_op(op, n, world)) for n in FLOOR_SIZES] for op in _OPS}
    dist.barrier()
    dist.destroy_process_group()
    out["runs"] = {}
    for i, strategy in enumerate(request.strategies):
        dist.init_process_group("gradwire", store=dist.PrefixStore(f"calibrate/run{i}/", store), rank=rank,
                                world_size=world, timeout=_TIMEOUT)
        out["runs"][strategy] = run_recorded(rank, world, MeasureConfig(strategy, "loopback", request.model,
                                                                    request.steps, request.batch_size))
        dist.destroy_process_group()
    out["shares"] = _shares(request.model, request.batch_size)
    out["copy"] = _copy_line()
    out["codecs"] = {spec: codec_cost(spec) for spec in request.codecs}
    out["hooks"] = {model.name: {key: stage_seconds(model, *key) for key in keys} for model, keys in request.hooks}
    return out


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values)


def calibrate(model: str, batch_size: int, world: int, codecs: Sequence[str] = (),
              hooks: Mapping[Any, Sequence[BucketKey]] | None = None, strategies: Sequence[str] = (),
              busy_cores: bool | None = None, epochs: int = 4, steps: int = 40,
              timeout: float = 600.0) -> Calibration:
    """Measure this host for ``world`` ranks training bundled ``model`` at ``batch_size`` (module doc).

    ``codecs``: compressor specs to time; ``hooks``: hook models
    (:class:`~gradwire.strategies.ExchangeModel`) and the buckets to time each
    at; ``strategies``: the DDP strategies whose exchanges to record, in a
    run of ``steps`` steps each (past their warm-up). ``busy_cores``:
    whether every core runs a rank (default: when the ranks are at least as
    many as the cores this process may use).
    """
    from gradwire.strategies import parse_strategy
    from gradwire.predict.measure import MeasureConfig, profile_of

    from gradwire.launch import spawn
    from gradwire.train.loop import CPU_ONLY

    warmups = {s: parse_strategy(s).exchange.warmup_steps for s in strategies}
    request = _Request(model, batch_size, tuple(dict.fromkeys(codecs)),
                       tuple((m, tuple(dict.fromkeys(keys))) for m, keys in (hooks or {}).items()), epochs,
                       tuple(dict.fromkeys(strategies)), max([steps, *(w + 20 for w in warmups.values())]))
    ranks = spawn(_rank, world, (request,), timeout=timeout, env=CPU_ONLY)
    floors, work = (Floors({op: [(n, _mean([r["floors"][op][i][1][k] for r in ranks])) for i, n in enumerate(FLOOR_SIZES)]
                            for op in _OPS}) for k in (0, 1))
    copy = Line(_mean([r["copy"].fixed for r in ranks]), _mean([r["copy"].per_element for r in ranks]))
    shares = tuple(_mean([r["shares"][i] for r in ranks]) for i in range(3))
    codec_costs = {spec: _mean_cost([r["codecs"][spec] for r in ranks]) for spec in request.codecs}
    hook_costs = {m.name: HookCost(m, measured={key: tuple(_mean(v) for v in zip(*(r["hooks"][m.name][key]
                                                                                  for r in ranks)))
                                                for key in keys})
                  for m, keys in request.hooks}
    profiles = {}
    for s in request.strategies:  # the steps after the warm-up (and DDP's rebuild)
        skip = max(3, warmups[s] + 2)
        try:
            prof = profile_of(MeasureConfig(s, "loopback", model, request.steps, batch_size),
                              [r["runs"][s] for r in ranks], skip=skip)
        except ValueError:  # no DDP bucket in its steps: nothing per bucket to keep
            continue
        mean_step = _mean([_mean(r["runs"][s]["step_seconds"][skip:]) for r in ranks])
        profiles[s] = replace(prof, strategy=s, loop_seconds=mean_step)
    if busy_cores is None:
        busy_cores = world >= len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else False
    return Calibration(world, Host(floors, work, copy, busy_cores), _mean([r["compute"] for r in ranks]),
                       _mean([r["full"] for r in ranks]), (shares[0], shares[1], shares[2]), codec_costs, hook_costs,
                       profiles, tuple(round(x, 2) for x in os.getloadavg()))


def _mean_cost(costs: Sequence[CodecCost]) -> CodecCost:
    def line(name: str) -> Line:
        return Line(_mean([getattr(c, name).fixed for c in costs]), _mean([getattr(c, name).per_element for c in costs]))

    def wide(i: int) -> Line:
        return Line(_mean([c.wide[i].fixed for c in costs]), _mean([c.wide[i].per_element for c in costs]))

    two_phase = all(len(c.wide) == 3 for c in costs)
    return CodecCost(line("encode"), line("serve"), line("decode"), line("per_rank"),
                     tuple(wide(i) for i in range(3)) if two_phase else ())
