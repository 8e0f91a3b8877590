"""The devices a simulated cluster computes on, and the device grammar.

A :class:`Device` prices compute on the simulated clock (``clock=sim``). Three
kinds:

- a **roofline** device (a name from :data:`DEVICES`, or a custom
  ``TFLOPS/GBps`` pair): every tensor op the rank runs is priced from what it
  does, never from how long this host took (:mod:`gradwire.device.roofline`).
  Deterministic: the same script gives the same time on any host, busy or not.
- ``host``: this rank's own thread CPU time, scaled by a factor
  (``host:x0.1`` = a device ten times faster). CPU time, not wall time, so
  other processes on the host do not inflate it; it still moves with the
  host's speed.
- ``step:TIME``: a roofline device (``cpu-core``) scaled so that one training
  step's compute takes ``TIME``, what the user measured on their own device.
  It needs a step to scale: a training loop that marks its steps (compare's
  bundled models and ``compare -- CMD`` do).

Grammar (``device=`` in a network spec, or ``--device``)::

    device := NAME | NAME ":x" FACTOR | TFLOPS "/" GBPS | "host" [":x" FACTOR] | "step:" TIME
            | "profile:" DIR ["@" DEVICE]

e.g. ``a100``, ``h100:x2``, ``19.5/1555``,
``host``, ``host:x0.1``, ``step:35ms``, ``profile:prof@cpu``. The CLI also
takes the forms ``19.5,1555`` and ``step=35ms``. Kinds with a prefix
(``step:``, ``profile:``) are found in :data:`SPEC_KINDS`, where a module
registers its own (:mod:`gradwire.device.recorded` registers ``profile:``, a
device recorded by ``gradwire profile --ops``).

The figures of the named devices are the vendors' datasheet peaks (dense, no
sparsity): NVIDIA T4, V100 SXM2, A100 SXM4 80GB and H100 SXM5 datasheets; the
CPU core is one AVX2/FMA core at 2.5 GHz (two 256-bit FMA units: 32 fp32
FLOP per cycle, Intel's optimization reference manual) with a core's share of
a server socket's memory bandwidth. What a real kernel reaches is a share of
the peak: :attr:`Device.efficiency` (compute) and
:attr:`Device.memory_efficiency`, assumptions stated here rather than
measured, and :attr:`Device.op_overhead`, the fixed cost of launching one op
(the framework's dispatch; a kernel launch on a GPU).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable


__all__ = ["DEVICES", "SPEC_KINDS", "Device", "DeviceSpec", "parse_device", "register_spec_kind"]


@dataclass(frozen=True)
class Device:
    """A roofline device: peak compute per dtype, memory bandwidth, achieved shares and per-op cost."""

    name: str
    fp32_flops: float
    """peak fp32 FLOP/s on the general-purpose units"""
    half_flops: float
    """peak fp16/bf16 FLOP/s of matrix ops (tensor cores on a GPU; the fp32 rate on a CPU)"""
    memory_bandwidth: float
    """bytes/s"""
    efficiency: float = 0.6
    """share of the compute peak a matrix op reaches"""
    memory_efficiency: float = 0.7
    """share of the memory bandwidth a memory-bound op reaches"""
    op_overhead: float = 5e-6
    """seconds of fixed cost per op (dispatch, kernel launch)"""
    source: str = ""
    """where the peak figures come from"""

    def __post_init__(self) -> None:
        for field_name in ("fp32_flops", "half_flops", "memory_bandwidth"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"device {self.name}: {field_name} must be a positive finite number, got {value!r}")
        for field_name in ("efficiency", "memory_efficiency"):
            value = getattr(self, field_name)
            if not 0 < value <= 1:
                raise ValueError(f"device {self.name}: {field_name} must be in (0, 1], got {value!r}")
        if not (math.isfinite(self.op_overhead) and self.op_overhead >= 0):
            raise ValueError(f"device {self.name}: op_overhead must be >= 0 seconds, got {self.op_overhead!r}")

    def slowed(self, factor: float) -> "Device":
        """This device with every op taking ``factor`` times as long (``a100:x2``: half the speed)."""
        return replace(self, name=f"{self.name}:x{factor:g}", fp32_flops=self.fp32_flops / factor,
                       half_flops=self.half_flops / factor, memory_bandwidth=self.memory_bandwidth / factor,
                       op_overhead=self.op_overhead * factor)

    def describe(self) -> str:
        return (f"{self.name} ({self.fp32_flops / 1e12:g} TFLOP/s fp32, {self.half_flops / 1e12:g} fp16/bf16, "
                f"{self.memory_bandwidth / 1e9:g} GB/s)")


#: named devices (datasheet peaks; see the module doc)
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("cpu-core", 80e9, 80e9, 10e9, efficiency=0.5, memory_efficiency=0.7, op_overhead=3e-6,
           source="one AVX2/FMA core at 2.5 GHz: 2 x 256-bit FMA = 32 fp32 FLOP/cycle; ~10 GB/s of memory per core"),
    Device("t4", 8.1e12, 65e12, 320e9, source="NVIDIA T4 datasheet: 8.1 TFLOPS fp32, 65 fp16 tensor, 320 GB/s"),
    Device("v100", 15.7e12, 125e12, 900e9,
           source="NVIDIA V100 SXM2 datasheet: 15.7 TFLOPS fp32, 125 fp16 tensor, 900 GB/s HBM2"),
    Device("a100", 19.5e12, 312e12, 2039e9,
           source="NVIDIA A100 SXM4 80GB datasheet: 19.5 TFLOPS fp32, 312 bf16/fp16 tensor (dense), 2039 GB/s"),
    Device("h100", 67e12, 989e12, 3350e9,
           source="NVIDIA H100 SXM5 datasheet: 67 TFLOPS fp32, 989 bf16/fp16 tensor (dense), 3.35 TB/s"),
)}

_TIME = re.compile(r"^(?P<value>[0-9.eE+-]+)\s*(?P<unit>us|ms|s)$")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _step_time(text: str) -> float:
    m = _TIME.match(text.strip())
    if m is None:
        raise ValueError(f"a step's time is a number with us, ms or s, got {text!r}")
    return float(m["value"]) * _UNITS[m["unit"]]


#: device kinds written ``PREFIX...`` (``step:35ms``, ``profile:DIR``): prefix -> parser of the whole text
SPEC_KINDS: dict[str, Callable[[str], DeviceSpec]] = {}


def register_spec_kind(prefix: str, parse: Callable[[str], DeviceSpec]) -> None:
    """Register a device kind written ``prefix...`` (lowercase prefix; the parser gets the text as given)."""
    SPEC_KINDS[prefix] = parse


def _parse_step(raw: str) -> DeviceSpec:
    text = raw.strip().lower()
    try:
        seconds = _step_time(text[5:])
    except ValueError as exc:
        raise ValueError(f"device {raw!r}: {exc}; e.g. step:35ms") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"device {raw!r}: the step's time must be positive, e.g. step:35ms")
    return DeviceSpec(f"step:{text[5:]}", "step", DEVICES["cpu-core"], step_seconds=seconds)


_FACTOR = re.compile(r"^(?P<base>[a-z0-9-]+):x(?P<factor>[^:]+)$")
_PAIR = re.compile(r"^(?P<tflops>[0-9.eE+-]+)\s*[/,]\s*(?P<gbps>[0-9.eE+-]+)$")


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed ``device=`` value: which meter prices compute, and how.

    ``kind`` is ``roofline`` (``device`` set), ``host`` (``factor`` scales this
    rank's thread CPU time), ``step`` (``device`` scaled so that a step's
    compute takes ``step_seconds``) or ``recorded`` (``recording`` prices each
    op as the user's own run took it, ``device`` the ops it does not hold).
    """

    text: str
    """the normalized spec string (what travels to other processes)"""
    kind: str
    device: Device | None = None
    factor: float = 1.0
    step_seconds: float = 0.0
    recording: Any = None
    """a :class:`gradwire.device.recorded.Recording` (kind ``recorded``)"""

    def describe(self) -> str:
        """In words, for tables: ``a100 (19.5 TFLOP/s fp32, ...)``, ``this host's CPU time x0.1``."""
        if self.kind == "host":
            return "this host's thread CPU time" + ("" if self.factor == 1 else f" x{self.factor:g}")
        if self.kind == "step":
            return f"a step of {self.step_seconds * 1e3:g} ms (cpu-core roofline, scaled)"
        if self.kind == "recorded":
            return str(self.recording.describe())
        assert self.device is not None
        return self.device.describe()

    def __str__(self) -> str:
        return self.text


def _factor(text: str, whole: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise ValueError(f"device {whole!r}: the factor after ':x' must be a number, e.g. host:x0.1") from None
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"device {whole!r}: the factor must be a positive finite number, got {text!r}")
    return factor


def parse_device(text: "str | DeviceSpec") -> DeviceSpec:
    """Parse a device (see the module doc); a bad one raises ValueError saying what would be right.

    >>> parse_device("a100").device.name
    'a100'
    >>> parse_device("host:x0.1").factor
    0.1
    >>> parse_device("19.5,1555").text
    '19.5/1555'
    """
    if isinstance(text, DeviceSpec):
        return text
    raw = text
    for prefix, parse in SPEC_KINDS.items():  # before lowercasing: a prefix's body may be a path
        if text.strip().lower().startswith(prefix):
            return parse(raw)
    text = text.strip().lower()
    pair = _PAIR.match(text)
    if pair:
        tflops, gbps = float(pair["tflops"]), float(pair["gbps"])
        if not (math.isfinite(tflops) and tflops > 0 and math.isfinite(gbps) and gbps > 0):
            raise ValueError(f"device {raw!r}: a custom device is TFLOPS/GBps, both positive, e.g. 19.5/1555")
        name = f"{pair['tflops']}/{pair['gbps']}"
        return DeviceSpec(name, "roofline", Device(name, tflops * 1e12, tflops * 1e12, gbps * 1e9))
    base, factor = text, 1.0
    m = _FACTOR.match(text)
    if m:
        base, factor = m["base"], _factor(m["factor"], raw)
    if base == "host":
        return DeviceSpec(text, "host", factor=factor)
    device = DEVICES.get(base)
    if device is None:
        raise ValueError(f"unknown device {raw!r}: use one of {', '.join(DEVICES)}, host, host:xF (a factor), "
                         f"TFLOPS/GBps (e.g. 19.5/1555), step:TIME (e.g. step:35ms) or profile:DIR[@DEVICE]")
    return DeviceSpec(text, "roofline", device.slowed(factor) if factor != 1 else device, factor=factor)


register_spec_kind("step:", _parse_step)
register_spec_kind("step=", _parse_step)
