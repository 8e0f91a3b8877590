"""Roofline prices of tensor ops: what one op takes on a :class:`~gradwire.device.catalog.Device`.

    seconds(op) = op_overhead + max(flops / (peak(dtype) x efficiency),
                                    bytes / (memory_bandwidth x memory_efficiency))

- ``flops``: torch's own FLOP formulas (``torch.utils.flop_counter``: matmuls,
  convolutions and their backward, attention); every other op counts 0 and is
  priced by its memory traffic.
- ``bytes``: every tensor the op reads and writes, once (inputs + outputs):
  no cache reuse across ops, which is what an eager framework's separate
  kernels do.
- ``peak(dtype)``: fp16/bf16 matrix ops run at the device's tensor-core rate,
  everything else at its fp32 rate (fp64 too: a conservative simplification).

Traps: views (``view``, ``t``, ``expand``...) move no data and cost only the
per-op overhead; an op the counter does not know (a custom kernel) is priced
by its bytes alone, so a compute-bound custom kernel reads fast. The price is
a pure function of the op and its tensors' shapes and dtypes: deterministic.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from gradwire.device.catalog import Device
from gradwire.device.recorded import op_key

__all__ = ["op_seconds", "op_cost", "RooflineMode"]

_HALF = (torch.float16, torch.bfloat16)


def _flop_formulas() -> dict[Any, Callable[..., int]]:
    from torch.utils.flop_counter import flop_registry

    return dict(flop_registry)


_FLOPS = _flop_formulas()
#: ops that move no data: a view of the input
_VIEWS = frozenset(name for name in (
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "as_strided",
    "alias", "detach", "slice", "select", "split", "split_with_sizes", "unbind", "chunk", "narrow", "view_as",
    "_reshape_alias", "unflatten", "flatten", "lift_fresh", "empty", "empty_like", "empty_strided",
))


def op_cost(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[float, int, bool]:
    """``(flops, bytes, half)`` of one aten op call: FLOPs by torch's formulas, bytes of its tensors."""
    packet = getattr(func, "overloadpacket", func)
    if packet.__name__ in _VIEWS:
        return 0.0, 0, False
    flops = 0.0
    formula = _FLOPS.get(packet)
    if formula is not None:
        try:  # torch's registered formulas take the op's own arguments and output (they read the shapes)
            flops = float(formula(*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - a formula that does not fit this overload: price the bytes
            flops = 0.0
    nbytes = 0
    half = False
    leaves, _ = tree_flatten((args, kwargs, out))
    for t in leaves:
        if isinstance(t, torch.Tensor):
            nbytes += t.numel() * t.element_size()
            half = half or t.dtype in _HALF
    return flops, nbytes, half


def op_seconds(device: Device, flops: float, nbytes: int, half: bool) -> float:
    """The roofline time of an op of ``flops`` and ``nbytes`` on ``device`` (module doc)."""
    peak = device.half_flops if half else device.fp32_flops
    compute = flops / (peak * device.efficiency) if flops else 0.0
    memory = nbytes / (device.memory_bandwidth * device.memory_efficiency)
    return device.op_overhead + max(compute, memory)


class RooflineMode(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that prices every op this thread runs on ``device`` and adds it to ``charge``.

    With a ``recording`` (:class:`gradwire.device.recorded.Recording`), an op it
    holds is priced as recorded and ``device`` prices only the others.
    ``charge(seconds)`` is called once per op. While ``paused()`` returns true
    (the backend's own work), ops run unpriced. The mode is thread-local, as
    torch's mode stack is: each thread that computes for the rank enters its own.
    """

    def __init__(self, device: Device, charge: Callable[[float], None], paused: Callable[[], bool],
                 recording: Any = None) -> None:
        super().__init__()
        self.device = device
        self.recording = recording
        #: ops priced from the recording, and on ``device`` (not recorded)
        self.recorded_ops = self.roofline_ops = 0
        self._charge = charge
        self._paused = paused
        self._cache: dict[tuple, tuple[float, bool]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._paused():
            self._charge(self._price(func, args, kwargs, out))
        return out

    def _price(self, func: Any, args: tuple, kwargs: dict, out: Any) -> float:
        key = (func, *(_signature(a) for a in args), *((k, _signature(v)) for k, v in kwargs.items()))
        try:
            hit = self._cache.get(key)
        except TypeError:  # an unhashable argument: price it every time
            key, hit = None, None  # type: ignore[assignment]
        if hit is None:
            seconds = self.recording.price(op_key(func, args, kwargs)) if self.recording is not None else None
            hit = (op_seconds(self.device, *op_cost(func, args, kwargs, out)), False) if seconds is None \
                else (seconds, True)
            if key is not None:
                if len(self._cache) > 65536:
                    self._cache.clear()
                self._cache[key] = hit
        if hit[1]:
            self.recorded_ops += 1
        else:
            self.roofline_ops += 1
        return hit[0]


def _signature(x: Any) -> Any:
    """What an op's price depends on: a tensor's shape and dtype; lists by their items; other values as they are."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(i) for i in x)
    return x
