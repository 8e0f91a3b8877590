"""A recorded device: ``profile:DIR[@DEVICE]`` prices a model's ops as that model's own run took them.

``gradwire profile --ops`` times every tensor op of the user's run on the
device it ran on (this host's CPU, or a GPU) and writes one recording per
device under ``DIR/ops/<DEVICE>.json`` (:func:`write_recording`). On the
simulated clock, ``device=profile:DIR`` prices each op of the same model:

1. an op is looked up by its key (:func:`op_key`: the aten overload and its
   arguments' shapes and dtypes, integers as they are, floats as ``f``, so an
   optimizer's changing learning rate is one key); its price is the
   recording's mean seconds for that key;
2. the framework's time between ops (Python, the autograd engine, the
   script's own loop), measured as the recorded step's compute less the sum
   of its ops, is spread evenly over the step's ops as a per-op cost; where
   the ops' sum exceeds the step's compute (a GPU timed op by op, each
   synchronised, loses its launch overlap) every op is scaled down instead;
3. an op the recording does not hold (a compressor's, a strategy's) is priced
   on the roofline of the recorded device's kind (``cpu-core`` for a CPU),
   scaled by the ratio of the recorded ops' time to their roofline time;
4. the recorded ranks did not compute alike: each rank's compute varied from
   step to step and from the other ranks', and at every collective the
   faster ranks waited for the slowest. The recording keeps, per rank, its
   compute in each clean (untimed) step over the recorded compute (what the
   ops' prices add up to; ``step_factors``); the replay multiplies rank r's compute in its n-th
   optimizer step by ``step_factors[r][n % len]`` (:meth:`Recording.factor`),
   so that its ranks differ, and wait for each other, as the recorded ones
   did, deterministically. Without it every rank prices the same ops the
   same in every step and never waits for another (docs/profile.md has
   both replays of the GPT example against its recorded step).

What is checked (:meth:`Recording.check_world`, :meth:`Recording.check_model`,
one line each): the world size and the model's signature (its parameters'
names, shapes and dtypes, hashed) must be the recording's; a device the
folder does not hold, or a missing or corrupt folder, is refused when the
spec is parsed. The batch, the torch version and the device's name are kept
as metadata (a different batch shows as ops the recording does not hold).

Trap: the price is what the op took in the recorded run; an op whose time
depends on its values (sparse, data-dependent) is priced at its mean.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from gradwire.device.catalog import DEVICES, Device, DeviceSpec, register_spec_kind

__all__ = ["FORMAT", "PREFIX", "Recording", "load_recording", "model_signature", "on_first_model_forward", "op_key",
           "parse_recorded", "recorded_devices", "write_recording"]

#: the spec prefix: ``profile:DIR[@DEVICE]``
PREFIX = "profile:"
#: the recording files' format tag
FORMAT = "gradwire-ops/1"
_SUBDIR = "ops"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def op_key(func: Any, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """The key an op is recorded and priced under: ``aten.mm.default(f32[8,64],f32[64,64])``.

    Tensors by dtype and shape (not device: a recording on a GPU prices the
    same model replayed on this host), lists by their items, ints, bools,
    strings and None as they are; a float is ``f`` (a learning rate that
    changes every step must not make every step's update a new op).
    """
    parts = [_part(a) for a in args] + [f"{k}={_part(v)}" for k, v in sorted(kwargs.items())]
    return f"{func}({','.join(parts)})"


def _part(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}[{','.join(str(d) for d in x.shape)}]"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(_part(i) for i in x) + "]"
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return repr(x)
    if isinstance(x, float):
        return "f"
    if isinstance(x, torch.device):
        return "dev"
    if isinstance(x, (torch.dtype, torch.memory_format, torch.layout)):
        return str(x).removeprefix("torch.")
    return type(x).__name__


def model_signature(named: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """``{"hash", "parameters", "tensors"}`` of a model's ``named_parameters()``: names, shapes, dtypes.

    A DDP wrapper's ``module.`` prefix is dropped, so a model hashes the same
    wrapped or not.
    """
    h = hashlib.sha256()
    count = tensors = 0
    for name, p in named:
        name = name.removeprefix("module.")
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        count += p.numel()
        tensors += 1
    return {"hash": h.hexdigest()[:16], "parameters": count, "tensors": tensors}


def on_first_model_forward(callback: Any) -> Any:
    """Call ``callback(module)`` at the first forward of a module with parameters, run with grad enabled.

    That module is the model (a forward hook of the outermost module runs
    before its children's); the hook then removes itself. Returns the
    handle (``handle.remove()`` if no forward came). Trap: a module with
    parameters run with grad before the model (a learned augmentation) is
    taken for it.
    """
    import torch

    def first_forward(module: Any, args: Any) -> None:
        if not torch.is_grad_enabled() or next(module.parameters(), None) is None:
            return
        handle.remove()
        callback(module)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(first_forward)
    return handle


@dataclass(frozen=True)
class Recording:
    """One device's recording (module doc), loaded and checked."""

    path: Path
    """the recording's file"""
    name: str
    """the device's name in the folder: ``cpu``, ``nvidia-h100-80gb-hbm3``"""
    meta: dict[str, Any]
    """world_size, model, batch, torch, device (kind, description), steps, step_seconds, ..."""
    seconds: dict[str, float]
    """mean seconds of each op key"""
    scale: float = 1.0
    """every recorded op's price is multiplied by this (module doc, point 2)"""
    overhead: float = 0.0
    """seconds added to every op: the framework's time between ops, spread"""
    fallback: Device = field(default_factory=lambda: DEVICES["cpu-core"])
    """the roofline that prices an op the recording does not hold (point 3)"""
    factors: dict[int, tuple[float, ...]] = field(default_factory=dict)
    """per rank, its compute in each recorded clean step over the recorded compute (point 4); empty: alike"""

    def factor(self, rank: int, step: int) -> float:
        """The multiplier of rank ``rank``'s compute in its ``step``-th step (0-based; point 4); 1 if not recorded."""
        steps = self.factors.get(rank)
        return steps[step % len(steps)] if steps else 1.0

    def price(self, key: str) -> float | None:
        """Seconds of the op ``key`` on this device; None: not recorded (price it on :attr:`fallback`)."""
        seconds = self.seconds.get(key)
        return None if seconds is None else seconds * self.scale + self.overhead

    def describe(self) -> str:
        d = self.meta.get("device", {})
        return (f"recorded on {d.get('description', self.name)} ({len(self.seconds)} ops, "
                f"step {self.meta.get('step_seconds', 0.0) * 1e3:.2f} ms)")

    def check_world(self, world: int) -> None:
        """Refuse another world size than the recording's (one line, ValueError)."""
        recorded = self.meta.get("world_size")
        if recorded != world:
            raise ValueError(f"device profile:{self.path.parent.parent}@{self.name} was recorded on {recorded} ranks "
                             f"and this job has {world}: record the profile at {world} ranks "
                             f"(gradwire profile --ops) or run on {recorded}")

    def check_model(self, signature: Mapping[str, Any]) -> None:
        """Refuse a model other than the recorded one (:func:`model_signature`)."""
        recorded = self.meta.get("model", {})
        if recorded.get("hash") != signature.get("hash"):
            raise ValueError(
                f"device profile:{self.path.parent.parent}@{self.name} was recorded on another model "
                f"({recorded.get('parameters')} parameters in {recorded.get('tensors')} tensors, signature "
                f"{recorded.get('hash')}; this one: {signature.get('parameters')} in {signature.get('tensors')}, "
                f"{signature.get('hash')}): record this model's profile with gradwire profile --ops")


def recorded_devices(folder: Path) -> list[str]:
    """The devices ``folder`` holds recordings of (sorted)."""
    sub = folder / _SUBDIR
    return sorted(p.stem for p in sub.glob("*.json")) if sub.is_dir() else []


def write_recording(folder: Path, name: str, record: Mapping[str, Any]) -> Path:
    """Write one device's recording as ``folder/ops/<name>.json``; returns its path."""
    if not _NAME.match(name):
        raise ValueError(f"a recorded device's name is lowercase letters, digits, '.', '_' or '-', got {name!r}")
    sub = folder / _SUBDIR
    sub.mkdir(parents=True, exist_ok=True)
    path = sub / f"{name}.json"
    path.write_text(json.dumps(dict(record, format=FORMAT, name=name), indent=1))
    return path


_cache: dict[tuple[str, str, float], Recording] = {}


def load_recording(folder: Path, name: str | None = None) -> Recording:
    """The recording of device ``name`` in ``folder`` (the only one when None); ValueError in one line if not there."""
    if not folder.exists():
        raise ValueError(f"device profile:{folder}: no such folder; record one with gradwire profile --ops --out DIR")
    if not folder.is_dir():
        raise ValueError(f"device profile:{folder}: is not a folder; give the --out folder of gradwire profile --ops")
    held = recorded_devices(folder)
    if not held:
        raise ValueError(f"device profile:{folder}: holds no ops/<device>.json; record one with "
                         "gradwire profile --ops --out DIR")
    if name is None:
        if len(held) > 1:
            raise ValueError(f"device profile:{folder}: holds recordings of {', '.join(held)}; name one, "
                             f"e.g. profile:{folder}@{held[0]}")
        name = held[0]
    if name not in held:
        raise ValueError(f"device profile:{folder}@{name}: the profile holds no recording on {name}; "
                         f"it holds {', '.join(held)}")
    path = folder / _SUBDIR / f"{name}.json"
    key = (str(path), name, path.stat().st_mtime)
    if key not in _cache:
        _cache[key] = _read(path, name)
    return _cache[key]


def _read(path: Path, name: str) -> Recording:
    where = f"device profile:{path.parent.parent}@{name}"
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{where}: {path} is not a JSON recording (corrupt?); record it again with "
                         "gradwire profile --ops") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{where}: {path} is not a {FORMAT} recording; record it again with gradwire profile --ops")
    try:
        seconds = {str(o["key"]): float(o["seconds"]) / int(o["calls"]) for o in data["ops"]}
        world = int(data["world_size"])
        model = data["model"]
        scale, overhead, ratio = float(data["scale"]), float(data["overhead"]), float(data["roofline_ratio"])
        base = DEVICES[data["device"]["base"]]
        factors = {int(r): tuple(float(f) for f in fs) for r, fs in (data.get("step_factors") or {}).items()}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"{where}: {path} lacks ops, world_size, model, scale, overhead, roofline_ratio or "
                         "device.base (corrupt?); record it again with gradwire profile --ops") from None
    bad = [k for k, s in seconds.items() if not (math.isfinite(s) and s >= 0)]
    bad += [str(r) for r, fs in factors.items() if not all(math.isfinite(f) and f > 0 for f in fs)]
    if bad or world < 1 or not isinstance(model, dict) or not all(
            math.isfinite(v) and v > 0 for v in (scale, ratio)) or not (math.isfinite(overhead) and overhead >= 0):
        raise ValueError(f"{where}: {path} holds negative or non-finite times (corrupt?); record it again")
    return Recording(path, name, data, seconds, scale, overhead, base.slowed(ratio) if ratio != 1 else base, factors)


def parse_recorded(raw: str) -> tuple[str, Recording]:
    """``profile:DIR[@DEVICE]`` -> (the normalized spec text, its recording); ValueError in one line."""
    body = raw.strip()[len(PREFIX):]
    folder, sep, name = body.rpartition("@")
    if not sep or "/" in name:  # no @, or an @ inside the path
        folder, name = body, ""
    if not folder:
        raise ValueError(f"device {raw!r}: give the folder of gradwire profile --ops, e.g. profile:prof or "
                         "profile:prof@cpu")
    if "," in folder:
        raise ValueError(f"device {raw!r}: a folder with ',' cannot travel in a network spec; rename or link it")
    path = Path(os.path.abspath(folder))
    recording = load_recording(path, name.lower() or None)
    return f"{PREFIX}{path}@{recording.name}", recording


def _parse(raw: str) -> DeviceSpec:
    text, recording = parse_recorded(raw)
    return DeviceSpec(text, "recorded", recording.fallback, recording=recording)


register_spec_kind(PREFIX, _parse)
