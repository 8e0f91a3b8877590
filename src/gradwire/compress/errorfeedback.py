"""Error feedback (EF-SGD): re-inject what compression dropped, keyed per tensor.

Seide et al., 2014; Karimireddy et al., 2019 (https://arxiv.org/abs/1901.09847):

1. ``c = x + e[key]`` (``compensate``; in place, into a buffer the caller owns).
2. The caller compresses ``c`` and decompresses its own payload: ``approx``.
3. ``e[key] = c - approx`` (``update``), so ``c == approx + e[key]`` exactly:
   nothing is lost, only delayed.

Works with any compressor; the hooks also key the server-side residuals of the
two-phase all_reduce here (as ``("server", key)``).

Traps:
- With a momentum optimiser this feeds the error into the momentum's input and
  fails (see :mod:`gradwire.hooks.state`): compress the momentum and apply
  each rank's own residual change locally, as the DDP hook does.
- A residual that became NaN/inf (a bad step) is reset to zero, so one bad
  step does not poison every later one. The bad step itself stays visible in
  that step's result.
- A key whose tensor changed shape starts again from a zero residual.
"""
from __future__ import annotations

from typing import Any, Hashable, Iterator

import torch
from torch import Tensor

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """Residual memory: ``compensate`` before compressing, ``update`` after."""

    def __init__(self) -> None:
        self._residuals: dict[Hashable, Tensor] = {}

    def compensate(self, tensor: Tensor, key: Hashable, inplace: bool = True) -> Tensor:
        """Return ``tensor + residual[key]`` (written into ``tensor`` when ``inplace``)."""
        r = self._residuals.get(key)
        if r is None or r.shape != tensor.shape or r.dtype != tensor.dtype:
            return tensor if inplace else tensor.clone()
        return tensor.add_(r) if inplace else tensor + r

    def update(self, key: Hashable, compensated: Tensor, approx: Tensor) -> Tensor:
        """Store ``compensated - approx`` as the residual of ``key``; returns it."""
        r = self._residuals.get(key)
        if r is None or r.shape != compensated.shape or r.dtype != compensated.dtype:
            r = torch.empty_like(compensated)
            self._residuals[key] = r
        torch.sub(compensated, approx.view(compensated.shape), out=r)  # approx may be r (see workspace)
        if not bool(torch.isfinite(r.sum())) and not bool(torch.isfinite(r).all()):
            r.zero_()
        return r

    def workspace(self, key: Hashable, like: Tensor) -> Tensor:
        """The residual buffer of ``key`` (shaped like ``like``), lent out between ``compensate`` and ``update``.

        Once ``compensate`` has added the residual, its buffer is free until
        ``update`` writes the new one; a caller decodes its approximation into
        it and passes it back as ``approx``, so no bucket-sized tensor is
        allocated per step (``update`` computes ``compensated - approx`` in place).
        """
        r = self._residuals.get(key)
        if r is None or r.shape != like.shape or r.dtype != like.dtype or r.device != like.device:
            r = self._residuals[key] = torch.zeros_like(like)
        return r

    def residual(self, key: Hashable) -> Tensor | None:
        """The current residual of ``key`` (None before the first update)."""
        return self._residuals.get(key)

    def set_residual(self, key: Hashable, residual: Tensor) -> None:
        """Install ``residual`` as the residual of ``key`` (e.g. carried over from another layout)."""
        self._residuals[key] = residual

    def reset(self, key: Hashable | None = None) -> None:
        """Forget one key's residual, or all of them."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._residuals

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._residuals)

    def __len__(self) -> int:
        return len(self._residuals)

    def state_dict(self) -> dict[str, Any]:
        """Residuals by key (copies), for checkpoints."""
        return {"residuals": {k: v.clone() for k, v in self._residuals.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._residuals = {k: v.clone() for k, v in state["residuals"].items()}
