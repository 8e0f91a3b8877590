"""Step profiles and compression costs priced on a device model: the simulated cluster clock's own prices.

``gradwire compare`` times its trainings on the simulated cluster clock
(:mod:`gradwire.backend.simclock`): each tensor op a rank runs is priced on a
:class:`~gradwire.device.Device` (:mod:`gradwire.device.roofline`), the
network by the network model, and a rank's time moves by the clock's overlap
rules. ``gradwire predict --device NAME`` prices the same steps the same way,
so that the step predict gives for a bundled model on a device and a network
is the step compare measures there:

1. **Compute** (forward, backward and each bucket's ready instant, the
   optimizer, what DDP and the strategy do around them): a short training of
   the model under each strategy, on ``world`` ranks of ``loopback`` on the
   simulated clock with ``device=NAME`` (:func:`priced_net`): every op priced
   on the device, the network free (a loopback op takes no simulated time, and
   the real collective under it is never charged). It is recorded as
   ``gradwire profile`` records a job (:mod:`gradwire.predict.measure`), so
   that each bucket's exchange is cut where the clock cuts it: the hook on the
   training thread (encode: momentum, error feedback, compression), each
   callback between two collectives (a two-phase server step, PowerSGD's next
   round) and the decode after the last, at the instants the clock gave them.
   The figures are the device's, not this host's: the same on a busy host or
   a quiet one, fast or slow.
2. **Compression priced alone** (:func:`priced_codec_cost`,
   :func:`priced_hook_cost`): where the step model prices an exchange that
   was not recorded (another world size's bucket, an ``auto`` candidate),
   each stage of :mod:`gradwire.predict.codec` runs under the device's
   roofline meter instead of a stopwatch: one rule for every compressed byte,
   the clock's.
3. **Overlap**: the replay (:mod:`gradwire.predict.simulate`) follows the
   clock's rules: a collective starts when it is issued and the link is free;
   callbacks run at an op's end on the communication side, not on the
   training thread; backward ends when its compute is done and every bucket's
   exchange (decode included) completed; ``delayed`` waits after the next
   step's backward. No host enters (no real collective floors, no busy
   cores): on the simulated clock the host's own work is never charged.

Trap: the short training runs on this host's CPU (a few seconds per
strategy at two ranks); the figures it yields do not depend on the host, but
the time to get them does. ``device=host`` is not priced here: that is this
host's wall clock, :mod:`gradwire.predict.calibrate`'s path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from gradwire.device import Device, DeviceSpec, RooflineMode, parse_device
from gradwire.predict.codec import BucketKey, CodecCost, HookCost, fitted_cost
from gradwire.predict.timeline import StepProfile

__all__ = ["PRICED_SIZES", "device_of", "priced_codec_cost", "priced_cost", "priced_hook_cost", "priced_net",
           "priced_profiles", "priced_steps", "priced_seconds"]

#: the element counts each compressor's stages are priced at (a line through both: roofline prices are linear in
#: the bytes above the per-op cost)
PRICED_SIZES = (1 << 16, 1 << 20)


def device_of(text: str | DeviceSpec) -> DeviceSpec:
    """``text`` as a device predict can price on: a roofline device (a name, ``TFLOPS/GBps``, ``NAME:xF``).

    Raises:
        ValueError: one line: ``host`` is the calibration's path, ``step:TIME`` needs a training to scale.
    """
    spec = parse_device(text)
    if spec.kind == "host":
        raise ValueError(f"--device {spec.text!r} is this host's clock, not a device model: use --device host "
                         "for this host's wall clock (calibrated), or a device such as cpu-core, a100, 19.5/1555")
    if spec.kind == "step":
        raise ValueError(f"--device {spec.text!r} scales a training that runs; predict prices a device: use a "
                         "named device (cpu-core, t4, v100, a100, h100) or TFLOPS/GBps, e.g. 19.5/1555")
    if spec.kind == "recorded":
        raise ValueError(f"--device {spec.text!r} prices the recorded script's own ops, not a bundled model: run "
                         "that script under gradwire profile --net clock=sim,device=profile:DIR and pass the "
                         "profile with --profile, or name a roofline device (cpu-core, a100, 19.5/1555)")
    return spec


def priced_net(device: str | DeviceSpec) -> str:
    """The network the priced trainings run on: ``loopback`` (free) on the simulated clock with ``device``."""
    return f"loopback,clock=sim,device={device_of(device).text}"


def priced_steps(strategy: str) -> int:
    """Steps of a priced training: the strategy's warm-up, DDP's rebuild and a few steady steps (the clock is
    deterministic: each steady step of a bundled model prices alike)."""
    from gradwire.strategies import parse_strategy

    return parse_strategy(strategy).exchange.warmup_steps + 8


def priced_profiles(strategies: Sequence[str], model: str, world: int, device: str | DeviceSpec,
                    batch_size: int = 32, bucket_cap_mb: float | None = None,
                    steps: int | None = None) -> dict[str, StepProfile]:
    """Each strategy's step of ``model`` on ``world`` ranks, priced on ``device`` (module doc, point 1).

    ``steps``: of each training (default :func:`priced_steps`). The profiles carry the run's own step
    (``loop_seconds``, on the simulated clock) and its network, so :func:`gradwire.predict.calibrated` checks
    the replay against it.
    """
    from gradwire.predict.measure import MeasureConfig, measure_runs, profile_of

    spec = device_of(device)
    net = priced_net(spec)
    configs = [MeasureConfig(s, net, model, steps or priced_steps(s), batch_size, bucket_cap_mb)
               for s in strategies]
    runs = measure_runs(configs, world)
    out = {}
    for s, config, ranks in zip(strategies, configs, runs):
        from gradwire.strategies import parse_strategy

        skip = parse_strategy(s).exchange.warmup_steps + 2  # the warm-up and DDP's rebuild
        prof = profile_of(config, ranks, skip=skip)
        tail = [r["step_seconds"][skip:] for r in ranks]
        loop = sum(sum(t) / len(t) for t in tail) / len(tail)
        # ranks that shared this host's cores computed at the device's speed all the same: the clock prices ops,
        # not this host's time, so nothing is divided by the ranks per core (``shared``)
        notes = tuple(n for n in prof.notes if "ranks per CPU core" not in n)
        out[s] = replace(prof, strategy=s, loop_seconds=loop, shared=1.0, buckets=_with_shapes(prof, model, s, bucket_cap_mb),
                         notes=(*notes, f"priced on {spec.describe()} (simulated cluster clock)"))
    return out


def _with_shapes(prof: StepProfile, model: str, strategy: str, bucket_cap_mb: float | None) -> tuple[Any, ...]:
    """``prof``'s buckets with their parameters' shapes, from the model's layout on the meta device, where their
    sizes agree (a recorded bucket knows only its bytes; PyTorch's PowerSGD prices its parameters' matrices and
    sends its vectors apart)."""
    from gradwire.predict.describe import describe_model
    from gradwire.strategies import parse_strategy

    cap = bucket_cap_mb if bucket_cap_mb is not None else parse_strategy(strategy).exchange.bucket_cap_mb
    try:
        described = describe_model(model, 1.0, cap)
    except ValueError:
        return prof.buckets
    if [b.nbytes for b in prof.buckets] != [b.nbytes for b in described.buckets]:
        return prof.buckets
    return tuple(replace(r, shapes=d.shapes) for r, d in zip(prof.buckets, described.buckets))


class _Meter:
    """Seconds of every op run inside, priced on a device (the clock's roofline meter, in one thread)."""

    def __init__(self, device: Device) -> None:
        self.seconds = 0.0
        self._mode = RooflineMode(device, self._add, lambda: False)

    def _add(self, seconds: float) -> None:
        self.seconds += seconds

    def __call__(self, fn: Callable[[], object]) -> float:
        start = self.seconds
        with self._mode:
            fn()
        return self.seconds - start


def priced_seconds(fn: Callable[[], object], device: str | DeviceSpec) -> float:
    """Seconds ``fn``'s tensor ops take on ``device`` (the roofline, as the clock prices them); pure of time."""
    spec = device_of(device)
    assert spec.device is not None
    with torch.no_grad():
        return _Meter(spec.device)(fn)


@functools.lru_cache(maxsize=64)
def priced_codec_cost(spec: str, device: str) -> CodecCost:
    """``spec``'s stages (:func:`gradwire.predict.codec._stages`) priced on ``device`` at two sizes; a line each.

    The first call of each stage builds state (error feedback's residual, momentum): each is priced on its
    second call, as :func:`gradwire.predict.codec.codec_cost` times it.
    """
    def twice(fn: Callable[[], object]) -> float:
        fn()
        return priced_seconds(fn, device)

    return fitted_cost(spec, "cpu", PRICED_SIZES, twice)


@functools.lru_cache(maxsize=1024)
def _hook_stages(model: Any, numel: int, shapes: tuple[tuple[int, ...], ...], world: int,
                 device: str) -> tuple[float, ...]:
    stages = model.stages(numel, shapes, world, "cpu")
    for stage in stages:  # state built on a first call, as the hook builds it on its first steps
        stage()
    return tuple(priced_seconds(s, device) for s in stages)


@dataclass(frozen=True)
class _PricedHookCost(HookCost):
    """A hook's stages priced on a device at each bucket asked for (once per process)."""

    on: str = "cpu-core"

    def stages(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int) -> tuple[float, ...]:
        key = (numel, tuple(tuple(s) for s in shapes), world)
        found = self.measured.get(key) or _hook_stages(self.model, *key, self.on)
        return tuple(t * self.scale for t in found)


def priced_hook_cost(model: Any, device: str, buckets: Sequence[BucketKey] = ()) -> HookCost:
    """A hook's stages (:class:`~gradwire.strategies.ExchangeModel`) priced on ``device``: at ``buckets`` now,
    at any other bucket when the step model asks for it."""
    measured = {(n, tuple(tuple(s) for s in shapes), w): _hook_stages(model, n, tuple(tuple(s) for s in shapes),
                                                                       w, device) for n, shapes, w in buckets}
    return _PricedHookCost(model, measured=measured, on=device)


def priced_cost(strategy: str, device: str) -> Any:
    """``strategy``'s exchange priced on ``device``: its compressor's lines or its hook's stages (free without)."""
    from gradwire.predict.codec import FREE
    from gradwire.strategies import parse_strategy

    codec = parse_strategy(strategy).exchange.codec
    if codec is None:
        return FREE
    return priced_codec_cost(codec, device) if isinstance(codec, str) else priced_hook_cost(codec, device)
