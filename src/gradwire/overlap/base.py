"""What every strategy shares: the loop contract, exposed-time accounting, flat reduction.

The contract a training loop follows (``gradwire.train.loop`` does exactly this)::

    strategy = build_strategy("onebit+delayed", momentum=0.9)
    module = strategy.wrap(model)            # DDP for sync; the model itself otherwise
    opt = SGD(model.parameters(), lr, momentum=strategy.optimizer_momentum)
    strategy.attach(opt)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(module(x), y).backward()
        strategy.step(opt)                   # communicates, then opt.step() (or not)
        waits = strategy.pop_waits()         # (start, end) of every wait of this step
    strategy.finish(opt)                     # drain: every rank ends with the same model

Exposed communication is the time the training thread spent *waiting* for a
collective: everything a strategy waits on goes through :meth:`Strategy.waiting`,
which keeps each wait as a ``(start, end)`` window (``time.perf_counter()``
seconds, the backend's realtime clock). DDP waits inside ``backward()`` in
C++, so ``sync`` records its window differently (see
:mod:`gradwire.overlap.sync`). A wait is not all network: the other rank may
reach the collective late (CPU contention) and compression callbacks take CPU
time; :func:`gradwire.overlap.metrics.split_exposed` splits the windows by
the backend's event log.

Momentum and compression: error feedback feeding a momentum optimizer
collapses training (:mod:`gradwire.hooks.state`). With a compressor, gradient
strategies let their :class:`~gradwire.hooks.CompressionState` keep the
momentum (``m = beta m + g``, compress ``m``) and the optimizer runs without
it: ``optimizer_momentum`` says which.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gradwire.hooks import CompressionState, Compressor, get_compressor

__all__ = ["Strategy", "average_parameters", "broadcast_module", "flatten", "group_timeout", "unflatten_into"]


def flatten(tensors: Sequence[Tensor]) -> Tensor:
    """A new contiguous 1-D copy of ``tensors`` (so later writes to them cannot race a send)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def unflatten_into(flat: Tensor, tensors: Sequence[Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``tensors`` (in place)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


def group_timeout(group: dist.ProcessGroup | None = None) -> timedelta | None:
    """The timeout ``group``'s collectives run under (None when the backend does not say).

    A group made with ``dist.new_group`` and no timeout gets the backend's
    default (30 minutes for gloo), not its parent's: a strategy that makes a
    group of its own passes this on, so a stalled peer fails it as soon as
    it fails the training's group.
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    timeout = getattr(pg, "timeout", None) or getattr(pg, "_timeout", None)
    if isinstance(timeout, timedelta):
        return timeout
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (RuntimeError, AttributeError):
        return None


def average_parameters(params: Sequence[Tensor], group: dist.ProcessGroup | None = None) -> Tensor:
    """Replace ``params`` by their exact (uncompressed, blocking) average over ``group``; return it flat."""
    with torch.no_grad():
        x = flatten(params)
        dist.all_reduce(x, group=group)
        x.div_(dist.get_world_size(group))
        unflatten_into(x, params)
    return x


def broadcast_module(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Give every rank the parameters and buffers of the group's first rank."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


class Strategy:
    """Base class of the strategies; see the module docstring for the loop contract.

    Subclasses set ``name`` and implement :meth:`step`; most override
    :meth:`wrap` and :meth:`finish`.
    """

    name = "base"
    #: whether the strategy communicates gradients (True) or parameters (False)
    averages_gradients = True

    def __init__(self, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        #: the compressor (parsed once, here, when given by name); None: uncompressed
        self.compressor: Compressor | None = None if compressor is None else get_compressor(compressor)
        self.momentum = momentum
        self.group = group
        self.steps = 0
        self._waits: list[tuple[float, float]] = []
        self.params: list[nn.Parameter] = []

    @property
    def optimizer_momentum(self) -> float:
        """Momentum the optimizer should use: 0 when a compressing strategy owns it."""
        if self.compressor is not None and self.averages_gradients:
            return 0.0
        return self.momentum

    def exchange_state(self, group: dist.ProcessGroup | None, momentum: float = 0.0) -> CompressionState:
        """The exchange this strategy averages through: its compressor, or the plain average without one.

        Every rank applies the same average (no local correction): the
        strategies that use it keep identical replicas, or correct locally
        in their own way (``delayed``).
        """
        return CompressionState("none" if self.compressor is None else self.compressor, group,
                                momentum=momentum, local_correction=False)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Prepare ``model`` (identical start on every rank); return the module to call forward on."""
        broadcast_module(model, self.group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        return model

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook into the optimizer (e.g. to refuse a step with gradients in flight)."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Communicate after ``backward()`` and step the optimizer (or deliberately not)."""
        raise NotImplementedError

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        """Wait for what is in flight and leave every rank with the same parameters."""

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the enclosed time as exposed communication (one wait window)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._waits.append((t0, time.perf_counter()))

    def add_wait(self, start: float, end: float) -> None:
        """Record a wait measured elsewhere (``time.perf_counter()`` seconds)."""
        if end > start:
            self._waits.append((start, end))

    def pop_waits(self) -> list[tuple[float, float]]:
        """The wait windows since the last call (the loop calls it once per step)."""
        out, self._waits = self._waits, []
        return out

    def pop_exposed(self) -> float:
        """Seconds waited since the last call (consumes the same windows as :meth:`pop_waits`)."""
        return sum(end - start for start, end in self.pop_waits())

    def grads(self) -> list[Tensor]:
        """This rank's gradients, zeros for parameters that got none (every rank sends the same layout)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        return grads

    def __repr__(self) -> str:
        comp = f"{self.compressor.name}+" if self.compressor is not None else ""
        return f"<strategy {comp}{self.name}>"
