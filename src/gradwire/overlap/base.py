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
collapses training (DESIGN.md; :mod:`gradwire.hooks.state`). With a compressor,
gradient strategies keep momentum themselves (``m = beta m + g``, compress
``m``) and the optimizer runs without it: ``optimizer_momentum`` says which.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Hashable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.futures import Future

__all__ = [
    "FlatReducer", "LocalMomentum", "Strategy", "average_parameters", "broadcast_module", "flatten",
    "unflatten_into",
]

#: tensors smaller than this are averaged uncompressed (as the DDP hook does)
MIN_COMPRESS_NUMEL = 1024


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


class LocalMomentum:
    """``m[key] = beta * m[key] + x``, then ``x <- m[key]`` (the momentum lives before compression)."""

    def __init__(self, beta: float) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {beta}")
        self.beta = beta
        self.buffers: dict[Hashable, Tensor] = {}

    def apply(self, key: Hashable, x: Tensor) -> None:
        m = self.buffers.get(key)
        if m is None or m.shape != x.shape:
            self.buffers[key] = x.detach().clone()
            return
        m.mul_(self.beta).add_(x)
        x.copy_(m)


class FlatReducer:
    """Average 1-D buffers over a group, asynchronously, optionally compressed.

    Args:
        compressor: None for a plain all_reduce, else a compressor name.
        group: process group (None: default).
        momentum: with a compressor, the local momentum applied before compressing.
        error_feedback: None: on for biased compressors (as ``CompressionState``).

    Every launch goes through one :class:`~gradwire.hooks.Sequencer`: a two-phase
    compressor issues its second collective from a callback, and gloo matches
    collectives by issue order, so launch ``k+1`` must wait for launch ``k``'s
    last issue, or the ranks would pair different collectives.
    """

    def __init__(self, compressor: str | None = None, group: dist.ProcessGroup | None = None,
                 momentum: float = 0.0, error_feedback: bool | None = None) -> None:
        self.group = group
        self.compressor = None
        self.momentum = LocalMomentum(momentum) if momentum else None
        self.error_feedback = None
        self._sequencer = None
        if compressor is not None:
            from gradwire.compress import ErrorFeedback, get_compressor
            from gradwire.hooks import Sequencer

            self.compressor = get_compressor(compressor)
            self._plain = get_compressor("none")
            if error_feedback is None:
                error_feedback = not self.compressor.unbiased
            self.error_feedback = ErrorFeedback() if error_feedback else None
            self._sequencer = Sequencer()

    def launch(self, flat: Tensor, key: Hashable = "flat") -> Future:
        """Start averaging ``flat`` (overwritten in place); the future's value is ``flat``."""
        if self.compressor is None:
            world = dist.get_world_size(self.group)
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            return work.get_future().then(lambda _: flat.div_(world))
        from gradwire.hooks import exchange

        if self.momentum is not None:
            self.momentum.apply(key, flat)
        if flat.numel() < MIN_COMPRESS_NUMEL:
            return exchange(flat, key, self._plain, self.group, None, self._sequencer)
        return exchange(flat, key, self.compressor, self.group, self.error_feedback, self._sequencer)


class Strategy:
    """Base class of the strategies; see the module docstring for the loop contract.

    Subclasses set ``name`` and implement :meth:`step`; most override
    :meth:`wrap` and :meth:`finish`.
    """

    name = "base"
    #: whether the strategy communicates gradients (True) or parameters (False)
    averages_gradients = True

    def __init__(self, compressor: str | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        self.compressor = compressor
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
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.params]

    def __repr__(self) -> str:
        comp = f"{self.compressor}+" if self.compressor else ""
        return f"<strategy {comp}{self.name}>"
