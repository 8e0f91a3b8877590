"""A :class:`StepProfile` for a model nobody has trained yet: its layout on the meta device, a given compute time.

``--model PKG.MODULE:FACTORY`` (``torchvision.models:resnet50``) or
``--model path/to/file.py:FACTORY`` names a function that builds an
``nn.Module`` with no arguments. It is called under ``torch.device("meta")``:
parameters get shapes and dtypes but no storage, nothing is initialised and
nothing is downloaded, so a 100 B-parameter model costs no memory.

1. Buckets: DDP's own rule (torch 2.13, ``DistributedDataParallel`` with
   ``find_unused_parameters=False``): the first iteration reduces everything
   as one bucket; after it DDP rebuilds the buckets in the order the
   gradients became ready, with ``torch.distributed._compute_bucket_assignment_by_size``
   and the limits ``[first bucket cap, bucket_cap_mb]``. The first bucket's
   cap is ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) when
   ``bucket_cap_mb`` is left to DDP's default (25 MiB), and ``bucket_cap_mb``
   itself when it is given (trap: passing ``bucket_cap_mb=25`` explicitly
   changes the first bucket). The rebuilt buckets are what every step after
   the first uses, so they are the ones modelled. The ready order is taken to
   be the reverse of ``model.parameters()`` (DDP's own assumption before it
   sees a backward; true for models that use their layers in the order they
   define them).
2. Compute: ``--compute-ms`` is the backward time of one step (measured on
   the user's GPU, for example); forward is ``forward_ratio`` times it (half
   by default: backward costs about twice the forward) and the optimizer
   ``optimizer_ms``. Backward time is spread over the parameters by their
   share of the **parameters** (``spread="params"``), or, with an input
   shape, by their layer's share of the forward **FLOPs**
   (``spread="flops"``: ``torch.utils.flop_counter`` on meta tensors, no
   compute runs); a parameter's gradient is ready when backward has gone
   through its layer and every layer after it. A bucket is ready when its
   last gradient is.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gradwire.predict.timeline import Bucket, StepProfile

__all__ = ["DEFAULT_BUCKET_CAP_MB", "bucket_layout", "describe_model", "is_factory", "load_factory"]

#: DDP's default bucket_cap_mb (torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB)
DEFAULT_BUCKET_CAP_MB = 25.0


def is_factory(name: str) -> bool:
    """``PKG.MODULE:FACTORY`` or ``path/file.py:FACTORY`` (a bundled model name has no colon)."""
    return ":" in name


def load_factory(text: str) -> Callable[[], Any]:
    """The callable named by ``PKG.MODULE:FACTORY`` or ``path/to/file.py:FACTORY``.

    Raises:
        ValueError: one line saying what could not be found or imported.
    """
    target, sep, attr = text.rpartition(":")
    form = "write PKG.MODULE:FACTORY (e.g. torchvision.models:resnet50) or path/to/file.py:FACTORY"
    if not sep or not target or not attr:
        raise ValueError(f"--model {text!r}: {form}")
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"--model {text!r}: no such file {target!r}; {form}")
        spec = importlib.util.spec_from_file_location(f"gradwire_model_{abs(hash(str(path.resolve())))}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"--model {text!r}: {target!r} is not a Python file; {form}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - the user's file: report, do not crash
            sys.modules.pop(spec.name, None)
            raise ValueError(f"--model {text!r}: running {target!r} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(f"--model {text!r}: cannot import {target!r} ({exc}); install it or {form}") from None
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"--model {text!r}: importing {target!r} failed: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"--model {text!r}: {target!r} has no attribute {attr!r}")
    if not callable(factory):
        raise ValueError(f"--model {text!r}: {attr!r} is a {type(factory).__name__}, not a function or class")
    return factory


def build_on_meta(factory: Callable[[], Any], what: str) -> nn.Module:
    """``factory()`` under the meta device; an ``nn.Module`` with trainable parameters, or ValueError."""
    try:
        with torch.device("meta"):
            model = factory()
    except Exception as exc:  # noqa: BLE001 - the user's code
        raise ValueError(f"--model {what!r}: building the model on the meta device failed: "
                         f"{type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {what!r}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"--model {what!r} has no trainable parameters: DDP would communicate nothing")
    return model


def bucket_layout(params: Sequence[torch.Tensor], bucket_cap_mb: float | None = None) -> list[list[int]]:
    """DDP's rebuilt buckets as lists of indices into ``params``, in launch order (module doc, point 1)."""
    import torch.distributed as dist

    if bucket_cap_mb is None:
        limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_CAP_MB * 1024 * 1024)]
    else:
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
        limits = [int(bucket_cap_mb * 1024 * 1024)]
    order = list(range(len(params)))[::-1]
    buckets, _ = dist._compute_bucket_assignment_by_size([params[i] for i in order], limits,
                                                         [False] * len(params), order)
    return [list(b) for b in buckets]


def _flop_weights(model: nn.Module, params: Sequence[torch.Tensor], input_shape: tuple[int, ...]) -> list[float]:
    """Each parameter's share of the forward FLOPs of its module (split by element count within the module)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            x = torch.empty(*input_shape)
        with FlopCounterMode(display=False) as counter:
            model(x)
    except Exception as exc:  # noqa: BLE001 - the user's model on a made-up input
        raise ValueError(f"running the model on the meta device with input shape {input_shape} failed: "
                         f"{type(exc).__name__}: {exc}") from None
    totals = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    root = type(model).__name__  # the counter names modules "Root.child.grandchild"

    def counted(name: str) -> int:
        return totals.get(f"{root}.{name}" if name else root, 0)

    index = {id(p): i for i, p in enumerate(params)}
    weights = [0.0] * len(params)
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if id(p) in index]
        if not own:
            continue
        children = sum(counted(f"{name}.{c}" if name else c) for c, _ in module.named_children())
        flops = max(0, counted(name) - children)
        n = sum(p.numel() for p in own)
        for p in own:
            weights[index[id(p)]] = flops * p.numel() / n if n else 0.0
    if sum(weights) <= 0:
        raise ValueError(f"no FLOPs were counted for the model's parameters with input shape {input_shape}")
    return weights


def describe_model(name: str, compute_ms: float, bucket_cap_mb: float | None = None,
                   forward_ratio: float = 0.5, optimizer_ms: float = 0.0,
                   input_shape: tuple[int, ...] | None = None, batch_size: int | None = None) -> StepProfile:
    """The step profile of model ``name`` (a factory, or a bundled name) with ``compute_ms`` of backward.

    Raises:
        ValueError: a bad factory, a model without parameters, a compute time <= 0 (one line each).
    """
    if isinstance(compute_ms, bool) or not isinstance(compute_ms, (int, float)) or not 0 < compute_ms < float("inf"):
        raise ValueError(f"--compute-ms must be a backward time in milliseconds > 0, got {compute_ms!r}")
    if not 0 <= forward_ratio < float("inf") or not 0 <= optimizer_ms < float("inf"):
        raise ValueError("forward_ratio and optimizer_ms must be finite numbers >= 0")
    if is_factory(name):
        factory = load_factory(name)
    else:
        from gradwire.train.models import MODELS

        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}, "
                             "or PKG.MODULE:FACTORY, or path/to/file.py:FACTORY")
        factory = MODELS[name]
    model = build_on_meta(factory, name)
    params = [p for p in model.parameters() if p.requires_grad]
    if input_shape is not None:
        weights = _flop_weights(model, params, (batch_size or 1, *input_shape))
        spread = f"backward spread by forward FLOPs (input {'x'.join(map(str, input_shape))})"
    else:
        weights = [float(p.numel()) for p in params]
        spread = "backward spread by parameter count"
    backward = compute_ms / 1e3
    total = sum(weights)
    ready_at, done = [0.0] * len(params), 0.0
    for i in reversed(range(len(params))):  # backward runs from the last parameter to the first
        done += weights[i]
        ready_at[i] = backward * min(1.0, done / total)
    layout = bucket_layout(params, bucket_cap_mb)
    buckets = tuple(Bucket(sum(params[i].numel() * params[i].element_size() for i in b),
                           max(ready_at[i] for i in b), params[b[0]].element_size(),
                           tuple(tuple(params[i].shape) for i in b)) for b in layout)
    cap = "DDP default (1 MiB first, 25 MiB)" if bucket_cap_mb is None else f"{bucket_cap_mb:g} MiB"
    notes = (f"{sum(p.numel() for p in params):,} parameters in {len(params)} tensors, {len(buckets)} buckets "
             f"(bucket_cap_mb {cap}, DDP's rebuilt buckets)", spread)
    return StepProfile(name, backward * forward_ratio, backward, optimizer_ms / 1e3, buckets, 1, None, None,
                       batch_size, "described", None, notes)
