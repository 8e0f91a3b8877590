"""``AsyncGradientHandler``: overlap gradient averaging with backward, without DDP.

For hand-written loops::

    handler = AsyncGradientHandler(model)        # registers autograd hooks
    handler.attach(optimizer)                    # step() now refuses pending gradients
    loss.backward()                              # all_reduces start as gradients appear
    handler.synchronize()                        # every gradient is averaged now
    optimizer.step()

Algorithm:
1. ``Tensor.register_post_accumulate_grad_hook`` fires when a parameter's
   ``.grad`` is complete for this backward; the hook launches an async
   all_reduce (or a compressed exchange) on that ``.grad`` in place, so the
   earliest gradients (last layers) travel while backward computes the rest.
2. ``synchronize()`` waits for every launch and clears the pending set.
3. A step pre-hook on the optimizer raises ``RuntimeError`` while any launch is
   pending: stepping then would apply a half-averaged or local gradient.

Why not the background thread of the reference article: its thread pops
gradients and all_reduces them while the loop calls ``optimizer.step()``
without waiting, so each rank applies whatever ``.grad`` holds at that
instant (local, averaged, or torn in the middle of the in-place reduction),
parameters drift apart between ranks, and the next ``backward()`` overwrites
gradients the thread is still sending. Two threads issuing collectives also
lose the identical issue order that gloo needs to pair them.

Traps:
- Every rank must produce gradients for the same parameters in the same order
  (same graph; autograd on CPU is deterministic). A parameter without a
  gradient is never launched, on every rank alike.
- Gradient accumulation (two backward passes before ``synchronize``) raises:
  the second accumulation would race the in-flight reduction.
- Do not read or modify ``.grad`` (clipping, logging) before ``synchronize``.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.futures import Future

from gradwire.exchange import CompressionState, Compressor, StateKey

from torch.nn.parallel import DistributedDataParallel as DDP

from .base import CannotApply, DDPAttachment, Strategy

__all__ = ["AsyncGradientHandler", "HandlerStrategy"]


class AsyncGradientHandler:
    """Average each parameter's gradient as soon as autograd produces it.

    Args:
        params: a module or an iterable of parameters (those requiring grad are hooked).
        group: process group (None: default).
        compressor: None for plain all_reduce, or a compressor (name).
        momentum: with a compressor, the momentum kept before compressing
            (then run the optimizer without momentum).

    Every rank applies the same average (the exchange makes no local correction).
    """

    def __init__(self, params: nn.Module | Iterable[nn.Parameter], group: dist.ProcessGroup | None = None,
                 compressor: str | Compressor | None = None, momentum: float = 0.0) -> None:
        if isinstance(params, nn.Module):
            named = [(n, p) for n, p in params.named_parameters() if p.requires_grad]
        else:
            named = [(str(i), p) for i, p in enumerate(params) if p.requires_grad]
        self._names = {id(p): n for n, p in named}
        self._exchange = CompressionState("none" if compressor is None else compressor, group,
                                          momentum=momentum if compressor is not None else 0.0,
                                          local_correction=False)
        self._pending: dict[int, Future] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for _, p in named]
        self._step_hooks: list[Any] = []
        #: seconds spent blocked in synchronize() since the last reset
        self.blocked_seconds = 0.0

    @property
    def exchange(self) -> CompressionState:
        """The exchange every gradient goes through (its momentum, with a compressor)."""
        return self._exchange

    @property
    def pending(self) -> int:
        """How many gradients are still being averaged."""
        return len(self._pending)

    def _ready(self, p: torch.Tensor) -> None:
        key = id(p)
        if key in self._pending:
            raise RuntimeError(
                f"gradient of {self._names[key]!r} was accumulated twice before synchronize(): "
                "call handler.synchronize() after every backward() (gradient accumulation is not supported)"
            )
        assert p.grad is not None
        grad = p.grad
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        self._pending[key] = self._exchange.reduce(grad.view(-1), StateKey.of(self._names[key], grad.numel()))

    def wait_pending(self) -> None:
        """Wait until every gradient launched so far is averaged (the step is not over: see :meth:`synchronize`)."""
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            fut.wait()  # raises when a collective failed

    def synchronize(self) -> float:
        """Wait until every launched gradient is averaged and end the exchange's step; return the seconds waited."""
        t0 = time.perf_counter()
        try:
            self.wait_pending()
        finally:
            self._exchange.end_step()
        waited = time.perf_counter() - t0
        self.blocked_seconds += waited
        return waited

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer.step()`` raise while gradients are pending."""
        self._step_hooks.append(optimizer.register_step_pre_hook(self._check_step))

    def _check_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._pending:
            names = ", ".join(sorted(self._names[k] for k in self._pending)[:3])
            raise RuntimeError(
                f"optimizer.step() called with {len(self._pending)} gradients still being averaged "
                f"({names}, ...): call AsyncGradientHandler.synchronize() before optimizer.step()"
            )

    def remove(self) -> None:
        """Remove the autograd and optimizer hooks (pending gradients are waited for)."""
        self.synchronize()
        for h in self._handles + self._step_hooks:
            h.remove()
        self._handles, self._step_hooks = [], []


class HandlerStrategy(Strategy):
    """The training-loop strategy around :class:`AsyncGradientHandler` (no DDP)."""

    name = "handler"
    #: per-parameter all_reduces from autograd hooks: not DDP's buckets, so predict does not price it
    timing = None

    def __init__(self, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__(compressor, momentum, group)
        self.handler: AsyncGradientHandler | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        module = super().wrap(model)
        self.handler = AsyncGradientHandler(model, self.group, self.compressor,
                                            momentum=self.momentum if self.compressor is not None else 0.0)
        return module

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.handler is not None, "call wrap() first"
        self.handler.attach(optimizer)

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        # DDP's reducer off (as inside ``no_sync()``, for good): it would copy its buckets back into
        # the gradients that the handler's all_reduces are writing in place
        if getattr(ddp, "static_graph", False):
            raise CannotApply("the script builds DDP with static_graph=True, whose reducer must run in every "
                              "backward; handler turns DDP's reducer off and averages from autograd hooks: use "
                              "sync, onebit or delayed, or build DDP without static_graph")
        ddp.require_backward_grad_sync = False
        self.group = self.dedicated_group()
        self.wrap(ddp.module)
        return DDPAttachment(None, None, "per-parameter averages launched from autograd hooks (DDP's own "
                                         "all_reduce off)")

    def scheme_exchange(self) -> CompressionState | None:
        return None if self.handler is None or self.compressor is None else self.handler.exchange

    def check_optimizer(self, optimizer: torch.optim.Optimizer, scheme: bool) -> None:
        super().check_optimizer(optimizer, scheme)
        if scheme and isinstance(optimizer, torch.optim.SGD) and any(g["weight_decay"] for g in optimizer.param_groups):
            raise CannotApply("handler averages each gradient from an autograd hook, where SGD's weight decay "
                              "cannot join the momentum the exchange owns; use weight_decay=0 or a DDP "
                              "strategy (onebit, onebit+delayed)")

    def grads_read(self, scheme: bool) -> None:
        """Clipping reads the averaged gradients: wait for the averages still in flight first."""
        super().grads_read(scheme)
        assert self.handler is not None
        with self.waiting():
            self.handler.wait_pending()

    def grad_scaler(self, scheme: bool) -> None:
        super().grad_scaler(scheme)
        assert self.handler is not None
        with self.waiting():
            self.handler.wait_pending()

    def accumulates(self) -> None:
        raise CannotApply("the script accumulates gradients with DDP.no_sync(); handler averages every "
                          "gradient from an autograd hook as it is produced and turns DDP's reducer off, which "
                          "no_sync() would turn back on: use sync, onebit or delayed")

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.handler is not None, "call wrap() first"
        with self.waiting():
            self.handler.synchronize()
        optimizer.step()
        self.steps += 1
