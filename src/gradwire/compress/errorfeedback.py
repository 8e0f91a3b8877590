"""Error feedback (EF-SGD): re-inject what compression dropped, keyed per tensor.

Seide et al., 2014; Karimireddy et al., 2019 (https://arxiv.org/abs/1901.09847):

1. ``c = x + e[key]`` (``compensate``; in place, into a buffer the caller owns).
2. The caller compresses ``c`` and decompresses its own payload: ``approx``.
3. ``e[key] = c - approx`` (``update``), so ``c == approx + e[key]`` exactly:
   nothing is lost, only delayed.

Keys are :class:`~gradwire.compress.state.StateKey`: the residual belongs to
the key's segments, so when the same parameters arrive grouped differently
(DDP rebuilt its buckets) the residual follows them. A key with a chunk
holds a server residual of the two-phase exchange. A tensor whose size is
not its key's raises (never a silently fresh residual).

Damped (``keep < 1``, a compressor's ``ef=N`` option: ``keep = N / 100``):
``e[key] = keep * (c - approx)``. What is dropped is then partly lost for
good (the sum of the decoded steps no longer equals the sum of the inputs),
but each step's decoded value carries less of the residual, so it is less
noisy. That pays where the consumer normalises each step per coordinate:
AdamW stepping on a decompressed gradient (under clipping, see
:meth:`gradwire.exchange.OptimizerScheme.release`) reads the residual's
step-to-step change as variance. Measured on the GPT example at 2 ranks
(``benchmarks/onebit_clip_diagnosis.py``): onebit without error feedback
ends closer to sync than with it; ``ef=50`` closer still.

Traps:
- ``keep < 1`` is biased: under plain SGD (or the momentum the exchange
  owns) the lost part is lost for good; keep the default there.
- With a momentum optimiser this feeds the error into the momentum's input and
  fails (see :mod:`gradwire.exchange.state`): compress the momentum and apply
  each rank's own residual change locally, as the DDP hook does.
- A step whose input is not finite must leave the residual as it was: the
  caller says so (``update(..., finite=False)``) and must not have lent the
  buffer (:meth:`workspace`) for that step.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .state import SegmentStore, StateKey

__all__ = ["ErrorFeedback", "is_finite"]


def is_finite(tensor: Tensor) -> bool:
    """Whether every element is finite: one sum, and a full check only when the sum is not finite."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


class ErrorFeedback:
    """Residual memory: ``compensate`` before compressing, ``update`` after."""

    def __init__(self, keep: float = 1.0) -> None:
        if not 0.0 <= keep <= 1.0:
            raise ValueError(f"keep is the share of the residual error feedback keeps, 0 to 1, got {keep}")
        self._store = SegmentStore()
        #: the share of the dropped error kept for the next step (1: error feedback, 0: none)
        self.keep = float(keep)

    def compensate(self, tensor: Tensor, key: StateKey) -> Tensor:
        """Add the residual of ``key`` to ``tensor`` in place (nothing before the first update); return it."""
        key.check(tensor)
        if not self._store.knows(key):
            return tensor
        return tensor.add_(self._store.buffer(key, tensor.reshape(-1)).view(tensor.shape))

    def update(self, key: StateKey, compensated: Tensor, approx: Tensor, finite: bool | None = None) -> Tensor | None:
        """Store ``keep * (compensated - approx)`` as the residual of ``key``; return it.

        ``finite``: whether ``compensated`` is finite, when the caller knows
        (None: checked here). A non-finite step keeps the old residual and
        returns None.
        """
        if finite is None:
            finite = is_finite(compensated)
        if not finite:
            return None
        r = self._store.buffer(key, compensated.reshape(-1))
        torch.sub(compensated.reshape(-1), approx.reshape(-1), out=r)  # approx may be r (see workspace)
        if self.keep != 1.0:
            r.mul_(self.keep)
        return r

    def workspace(self, key: StateKey, like: Tensor) -> Tensor:
        """The residual buffer of ``key``, lent out between ``compensate`` and ``update``.

        Once ``compensate`` has added the residual, its buffer is free until
        ``update`` writes the new one; a caller decodes its approximation into
        it and passes it back as ``approx``, so no bucket-sized tensor is
        allocated per step. Lend it only on a finite step: a skipped update
        would leave the approximation in it.
        """
        buf = self._store.buffer(key, like.reshape(-1))
        return buf if buf.shape == like.shape else buf.view(like.shape)

    def residual(self, key: StateKey) -> Tensor | None:
        """The current residual of ``key`` (None before the first update)."""
        return self._store.get(key)

    def reset(self, key: StateKey | None = None) -> None:
        """Forget one key's residual, or all of them."""
        if key is None:
            self._store.clear()
        else:
            self._store.drop(key)

    def keys(self) -> list[StateKey]:
        """The keys that hold a residual (worker keys, and served chunks)."""
        return list(self._store.keys())

    def __contains__(self, key: StateKey) -> bool:
        return self._store.get(key) is not None

    def __len__(self) -> int:
        return len(self._store)

    def state_dict(self) -> dict[str, Any]:
        """Residuals with their keys (copies, plain types), for checkpoints."""
        return self._store.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._store.load_state_dict(state)
