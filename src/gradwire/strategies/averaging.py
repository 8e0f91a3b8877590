"""Model averaging: ``localsgd:H`` (blocking) and ``async-average:H`` (overlapped).

Both let every rank take local optimizer steps on its own gradients and
average the *parameters* now and then, so they make about H times fewer
collective calls than gradient averaging. Both average the displacement from
a shared anchor (the last average, identical on every rank) rather than the
parameters themselves: ``x = a + mean_i(x_i - a)`` is the plain average, and
with a compressor the small displacement is what gets compressed, with error
feedback keeping what compression dropped for the next round
(Basu et al., 2019, Qsparse-local-SGD). Momentum buffers stay local (as
PyTorch's ``PostLocalSGDOptimizer``); buffers (none in the shipped models) are
not averaged.

``localsgd:H[:warmup=W]`` (Lin et al., 2020, "Don't use large mini-batches,
use local SGD"; W > 0 is post-local SGD):
1. The first W steps average gradients (plain all_reduce, blocking), so every
   rank takes the same step: the early, high-curvature phase is synchronous.
2. After that, local steps; every H-th local step ends with a blocking
   average of the parameters.

``async-average:H``: every H steps, snapshot this rank's displacement
``d_i = x_i - a`` and launch its average in the background; keep training.
At the first step boundary where it has arrived (at the latest before the
next launch), apply it while keeping the local progress made meanwhile:
``x_i <- x_i - d_i + mean(d)``, ``a <- a + mean(d)``. Resetting ``x_i`` to the
average instead would throw away the steps taken while the average travelled.

Both end (``finish``) with an exact, uncompressed average of the parameters,
so every rank evaluates the same model.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.futures import Future

from gradwire import backend
from gradwire.exchange import Compressor, StateKey

from torch.nn.parallel import DistributedDataParallel as DDP

from .base import CannotApply, DDPAttachment, Strategy, Timing, average_parameters, flatten, unflatten_into

__all__ = ["AsyncAverageStrategy", "LocalSGDStrategy"]


class _Averaging(Strategy):
    """Shared anchor bookkeeping of the model-averaging strategies."""

    averages_gradients = False
    compressor_owns_momentum = False

    def __init__(self, period: int, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        if period < 1:
            raise ValueError(f"{self.name}: the averaging period H must be >= 1, got {period}")
        super().__init__(compressor, momentum, group)
        self.period = period
        self._exchange = self.exchange_state(group)
        self._anchor = torch.empty(0)
        #: the simulated clock's tag of the average in flight (Strategy.background)
        self._tag: Any = None
        #: parameter averages launched so far
        self.averages = 0

    def wrap(self, model: nn.Module) -> nn.Module:
        module = super().wrap(model)
        self._anchor = flatten(self.params)
        return module

    def _launch(self) -> tuple[Tensor, Future]:
        """Snapshot the parameters; launch the average of the displacement ``snapshot - anchor``."""
        snapshot = flatten(self.params)
        self.averages += 1
        displacement = snapshot - self._anchor
        with self.background() as self._tag:
            fut = self._exchange.reduce(displacement, StateKey.of("params", displacement.numel()))
        self._exchange.end_step()
        return snapshot, fut

    def _apply(self, snapshot: Tensor, mean: Tensor) -> None:
        """``a <- a + mean``, ``x <- a + (x - snapshot)``.

        Written with the snapshot rather than ``x - d_i + mean`` so that with no
        local progress (localsgd) every rank gets exactly the anchor, bit for bit.
        """
        self._anchor.add_(mean)
        with torch.no_grad():
            progress = flatten(self.params).sub_(snapshot)
            unflatten_into(progress.add_(self._anchor), self.params)

    def _exact_average(self) -> None:
        self._anchor = average_parameters(self.params, self.group)

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        """DDP keeps its model but sends nothing (a no-op hook): gradients stay local, parameters are averaged."""
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        self.group = self.dedicated_group()
        self._exchange = self.exchange_state(self.group)
        self.wrap(ddp.module)  # the anchor (and rank 0's weights, as DDP has done already)
        return DDPAttachment(noop_hook, None, f"local steps, parameters averaged every {self.period} steps")

    @classmethod
    def average_schedule(cls, params: Mapping[str, float]) -> tuple[int, int, bool]:
        """What predict replays: steps between two exchanges, the fragments the model is cut into (each
        exchange moves one), and whether the exchange overlaps the next steps."""
        return int(params["H"]), 1, cls.timing is Timing.AVERAGE_OVERLAPPED

    def grad_scaler(self, scheme: bool) -> None:
        raise CannotApply(f"a GradScaler skips a step on the ranks whose own gradients overflowed; under {self.name} "
                          "each rank steps on its own gradients, so the ranks would disagree on when to average "
                          "(a collective on some ranks only); use bf16 autocast without a scaler, or sync")


class LocalSGDStrategy(_Averaging):
    """Local steps, a blocking parameter average every H steps, optional synchronous warm-up."""

    name = "localsgd"
    timing = Timing.AVERAGE

    def __init__(self, period: int, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None, warmup: int = 0) -> None:
        super().__init__(period, compressor, momentum, group)
        if warmup < 0:
            raise ValueError(f"localsgd: warmup must be >= 0 steps, got {warmup}")
        self.warmup = warmup
        self._local = 0

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.steps < self.warmup:
            grads = self.grads()
            flat = flatten(grads)
            with self.waiting():
                dist.all_reduce(flat, group=self.group)
            unflatten_into(flat.div_(dist.get_world_size(self.group)), grads)
            optimizer.step()
            self.steps += 1
            if self.steps == self.warmup:
                self._anchor = flatten(self.params)
            return
        optimizer.step()
        self.steps += 1
        self._local += 1
        if self._local % self.period == 0:
            snapshot, fut = self._launch()
            with self.waiting(self._tag):
                mean = fut.wait()
            self._apply(snapshot, mean)

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        # Right after an average every rank holds the new anchor already.
        if self._local % self.period != 0:
            self._exact_average()


class AsyncAverageStrategy(_Averaging):
    """Launch a parameter average every H steps; apply it when it arrives, keeping local progress."""

    name = "async-average"
    timing = Timing.AVERAGE_OVERLAPPED

    def __init__(self, period: int, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__(period, compressor, momentum, group)
        self._pending: tuple[Tensor, Future] | None = None
        #: how many steps each applied average spent in flight
        self.lags: list[int] = []
        self._launched_at = 0

    def in_flight(self) -> list[Future]:
        return [] if self._pending is None else [self._pending[1]]

    def _settle(self) -> None:
        assert self._pending is not None
        snapshot, fut = self._pending
        self._pending = None
        with self.waiting(self._tag):
            mean = fut.wait()
        self.lags.append(self.steps - self._launched_at)
        self._apply(snapshot, mean)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()
        self.steps += 1
        if self._pending is not None and backend.arrived(self._tag, self._pending[1]):
            self._settle()
        if self.steps % self.period == 0:
            if self._pending is not None:
                self._settle()
            self._pending = self._launch()
            self._launched_at = self.steps

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        if self._pending is not None:
            self._settle()
        self._exact_average()
