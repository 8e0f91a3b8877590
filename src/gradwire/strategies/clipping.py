"""What a script's gradient clipping did, as a value a strategy can apply again to another tensor (pure).

A script clips between ``backward()`` and ``optimizer.step()`` with
``clip_grad_norm_(params, max_norm, norm_type)`` or
``clip_grad_value_(params, clip_value)``. Under ``gradwire compare -- CMD``
(:mod:`gradwire.compare.inject`) the clip is seen as it happens and recorded
as a :class:`GradientClip`; a strategy whose step applies something other
than what ``.grad`` held at the clip (``delayed`` applies an average one step
later) applies the same clip to it (:meth:`GradientClip.apply_`), so the
threshold means what it means under sync: the average is clipped, not only
this rank's gradient.

The arithmetic is torch's own: the total norm of the tensors together
(``torch.nn.utils.get_total_norm``), the factor
``min(1, max_norm / (total + 1e-6))`` (``_clip_grads_with_norm_``), or an
elementwise clamp to ``[-clip_value, clip_value]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["GradientClip", "total_norm"]


def total_norm(tensors: Sequence[Tensor], norm_type: float = 2.0) -> Tensor:
    """The norm of ``tensors`` viewed as one vector, as ``clip_grad_norm_`` computes it."""
    if not tensors:
        return torch.tensor(0.0)
    norms = torch.stack([torch.linalg.vector_norm(t.detach(), norm_type) for t in tensors])
    return torch.linalg.vector_norm(norms, norm_type)


@dataclass(frozen=True)
class GradientClip:
    """One clip of a script's gradients: by their total norm, or by value (exactly one of the two).

    Args:
        max_norm: ``clip_grad_norm_``'s threshold (None: a clip by value).
        norm_type: the norm ``max_norm`` bounds (``inf`` allowed).
        clip_value: ``clip_grad_value_``'s bound (None: a clip by norm).
    """

    max_norm: float | None = None
    norm_type: float = 2.0
    clip_value: float | None = None

    def __post_init__(self) -> None:
        if (self.max_norm is None) == (self.clip_value is None):
            raise ValueError("a GradientClip bounds either the norm (max_norm) or each value (clip_value), "
                             f"got max_norm={self.max_norm}, clip_value={self.clip_value}")

    def factor(self, tensors: Sequence[Tensor]) -> float:
        """The factor a clip by norm multiplies ``tensors`` by (1 when under the threshold, or by value)."""
        if self.max_norm is None:
            return 1.0
        return min(1.0, self.max_norm / (float(total_norm(tensors, self.norm_type)) + 1e-6))

    def apply_(self, tensors: Sequence[Tensor]) -> None:
        """Clip ``tensors`` in place, together, as the script's call clipped its gradients."""
        with torch.no_grad():
            if self.clip_value is not None:
                for t in tensors:
                    t.clamp_(-self.clip_value, self.clip_value)
                return
            c = self.factor(tensors)
            if c < 1.0:
                torch._foreach_mul_(list(tensors), c)

    def describe(self) -> str:
        """A few words: ``norm <= 1 (L2)`` or ``|value| <= 0.5``."""
        if self.max_norm is not None:
            return f"norm <= {self.max_norm:g} (L{self.norm_type:g})"
        return f"|value| <= {self.clip_value:g}"
