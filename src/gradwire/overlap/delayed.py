"""``delayed`` (stale-by-one gradients) and ``delayed:local=1`` (fresh local, stale average).

``delayed``, step t, after ``backward()``:

1. Copy this rank's gradients into a fresh flat buffer and launch its
   (optionally compressed) all_reduce in the background.
2. Wait for step t-1's average (launched one forward+backward ago, so it has
   normally arrived), write it into ``p.grad`` and step the optimizer.
3. :meth:`DelayedStrategy.finish` waits for the last launch and applies it,
   so no computed gradient is lost.

Step 0 applies nothing (the optimizer does not step): there is no averaged
gradient yet. Applying step 0's *local* gradient instead, as a background
thread that lets ``optimizer.step()`` run before its all_reduce finished does,
would make the ranks' parameters differ from then on; nothing ever brings them
back together, so the ranks train different models. Waiting for step 0's own
average would leave step 1 with nothing to apply. Every rank therefore applies
the same averaged gradients in the same order; the parameters stay identical
on every rank, one step behind their gradients.

Trap (stability): one step of delay shrinks the stable learning rates. On a
quadratic with curvature h, heavy-ball momentum b and delay 1 is stable only
while ``b + lr*h < 1`` (the product of the roots of ``z^2 - (1+b) z + b + lr*h``),
against ``lr*h < 2 (1 + b)`` without delay: with b = 0.9 that is 38 times
smaller. Measured on the digits CNN (lr 0.05, b 0.9): accuracy oscillates.

``delayed:local=1`` keeps sync's stability: step t applies
``g_t(local) + avg_{t-1} - g_{t-1}(local)``: this rank's fresh gradient at once,
and one step later its replacement by the average. The sum of what a rank
applied up to step t is the sum of the averages up to t-1 plus its own latest
gradient, so ranks differ by one local gradient (filtered by momentum) at any
time; ``finish`` applies the last correction and averages the parameters
exactly. On a quadratic where every rank sees the same data this is exactly
synchronous SGD. Momentum stays in the optimizer, so it composes only with
compressors that need no error feedback.

Trap: the buffer is a copy; the next ``backward()`` writes ``p.grad`` while
the all_reduce still reads (and overwrites) the buffer.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from .base import FlatReducer, Strategy, flatten, unflatten_into

__all__ = ["DelayedStrategy", "LOCAL_REFUSES"]

#: compressors that need error feedback with the optimizer's momentum: ``local=1`` refuses them
LOCAL_REFUSES = frozenset({"onebit", "signum", "topk", "powersgd"})


class DelayedStrategy(Strategy):
    """Apply step t-1's averaged gradient at step t while step t's is in flight."""

    name = "delayed"

    def __init__(self, compressor: str | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None, local: int = 0) -> None:
        super().__init__(compressor, momentum, group)
        self.local = bool(local)
        owns_momentum = compressor is not None and not self.local
        self._reducer = FlatReducer(compressor, group, momentum=momentum if owns_momentum else 0.0,
                                    error_feedback=False if self.local else None)
        self._pending: Future | None = None
        self._previous_local: Tensor | None = None
        #: optimizer steps skipped (``delayed``: 1, step 0 has nothing to apply)
        self.skipped = 0

    @property
    def optimizer_momentum(self) -> float:
        return self.momentum if self.local else super().optimizer_momentum

    def _wait(self, fut: Future) -> Tensor:
        with self.waiting():
            return fut.wait()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = self.grads()
        mine = flatten(grads)
        previous, self._pending = self._pending, self._reducer.launch(mine.clone() if self.local else mine)
        self.steps += 1
        if self.local:
            update = mine.clone()
            if previous is not None:
                assert self._previous_local is not None
                update.add_(self._wait(previous)).sub_(self._previous_local)
            self._previous_local = mine
            unflatten_into(update, grads)
            optimizer.step()
        elif previous is None:
            self.skipped += 1
        else:
            unflatten_into(self._wait(previous), grads)
            optimizer.step()

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        if self._pending is None:
            return
        fut, self._pending = self._pending, None
        mean = self._wait(fut)
        if self.local:
            assert self._previous_local is not None
            mean = mean - self._previous_local
        unflatten_into(mean, self.grads())
        optimizer.step()
        if self.local:
            with torch.no_grad():
                x = flatten(self.params)
                dist.all_reduce(x, group=self.group)
                unflatten_into(x.div_(dist.get_world_size(self.group)), self.params)
