"""``delayed``: stale-by-one gradients, communication hidden behind a whole step.

Algorithm (step t, after ``backward()``):

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
the same averaged gradients in the same order and the parameters stay
identical on every rank, one step behind their gradients.

Traps:
- The buffer is a copy: the next ``backward()`` writes ``p.grad`` while the
  all_reduce still reads (and overwrites) the buffer.
- Staleness grows with the learning rate's effect per step; one step of delay
  is what momentum SGD tolerates without tuning (see Zheng et al., 2017,
  DC-ASGD, for corrections at larger delays).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.futures import Future

from .base import FlatReducer, Strategy, flatten, unflatten_into

__all__ = ["DelayedStrategy"]


class DelayedStrategy(Strategy):
    """Apply step t-1's averaged gradient at step t while step t's is in flight."""

    name = "delayed"

    def __init__(self, compressor: str | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__(compressor, momentum, group)
        self._reducer = FlatReducer(compressor, group, momentum=momentum if compressor else 0.0)
        self._pending: Future | None = None
        #: optimizer steps skipped (1: step 0 has nothing to apply)
        self.skipped = 0

    def _apply(self, fut: Future, optimizer: torch.optim.Optimizer) -> None:
        with self.waiting():
            flat = fut.wait()
        unflatten_into(flat, self.grads())
        optimizer.step()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        fut = self._reducer.launch(flatten(self.grads()))
        previous, self._pending = self._pending, fut
        self.steps += 1
        if previous is None:
            self.skipped += 1
            return
        self._apply(previous, optimizer)

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        if self._pending is not None:
            fut, self._pending = self._pending, None
            self._apply(fut, optimizer)
