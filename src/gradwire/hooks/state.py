"""``CompressionState``: the state object of :func:`gradwire.hooks.compression_hook`.

Momentum (why ``momentum=`` exists): gradient error feedback in front of a
momentum optimiser fails. The residual of step t is re-sent at step t+1 and
the momentum buffer integrates every injected error with gain 1/(1-beta), so
with 1-bit compression (errors as large as the gradient) the update lags and
oscillates: 0.49 test accuracy vs 0.95 on the digits CNN, measured here. The
scheme that works compresses the *update*, as 1-bit Adam and Signum do
(Zheng et al., 2019, https://arxiv.org/abs/1911.09030; Tang et al., 2021):

1. The hook keeps a local momentum buffer per bucket: ``m = beta m + g``.
2. ``c = m + e`` (error feedback on the update), ``Δ = C(c)``, ``e = c - Δ``.
3. The exchanged average of ``Δ`` is written into the bucket: the optimiser
   must run WITHOUT momentum (``SGD(momentum=0)``), it applies ``lr * Δ``.

Over time the sum of applied updates equals the sum of the momentum updates up
to one residual, which is what momentum SGD applies. Weight decay in the
optimiser then acts without momentum (a small, documented difference).

What limits 1-bit compression here (digits CNN, 4 ranks, lr 0.05, 8 epochs =
96 steps; none reaches 0.967 on seed 0): with sign compression a block's
scale caps how much of a coordinate is sent per step, so the residual of the
largest coordinates grows, inflates the block's scale and the update lags
the momentum; a lagging update inside a momentum loop oscillates (test
accuracy drops for an epoch and recovers). Measured on seed 0: one scale per
bucket 0.59; per-block mean-|x| scales 0.81; per-block RMS scales (the
default) 0.89; plus a 24-step uncompressed warm-up 0.91. Gradient error
feedback with the optimiser's momentum instead: 0.59. Finer blocks alone do
not close the gap (block=8: 0.80), so the lag, not the scale resolution, is
what remains; see benchmarks/results/compress_accuracy.md for all seeds.

Warm-up: the first ``warmup_iters`` steps are reduced uncompressed (the hook's
momentum still runs, so this is exactly momentum SGD), as 1-bit Adam's
full-precision warm-up stage: sign compression of the first, large and fast
changing updates costs the most accuracy. ``"onebit:warmup=50"`` sets it from
the name.

Bucket rebuilds: a new DDP object builds its first-iteration buckets in
reverse parameter order and rebuilds them in gradient-ready order after the
first iteration. Within a process the hook detects the rebuild by parameter
identity and carries each parameter's momentum and worker residual over to
its place in the new buckets (the server residuals, which each rank holds
for one chunk of a bucket, restart from zero). Checkpoints: ``state_dict``
holds the per-bucket residuals and momentum. After a resume only shapes can
be compared: when the resumed DDP's first buckets differ from the saved ones,
their state restarts (a warning), and a reordering of equally shaped
parameters goes unnoticed for that one iteration. A resume is exact when the
first-iteration buckets equal the rebuilt ones (e.g. one parameter per
bucket), as the tests check.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from gradwire.compress import Compressor, ErrorFeedback, get_compressor

from .exchange import Sequencer

__all__ = ["CompressionState"]

log = logging.getLogger(__name__)


class CompressionState:
    """Configuration and per-bucket state for :func:`~gradwire.hooks.compression_hook`.

    Args:
        compressor: a name (``"onebit"``, ``"topk:0.01"``, ...) or a Compressor.
        process_group: group to reduce on; None for the default group.
        error_feedback: True/False, an ``ErrorFeedback`` to use, or None for
            "on when the compressor is biased".
        momentum: 0 to compress gradients; ``beta`` in (0, 1) to let the hook own
            momentum and compress the update (use the optimiser WITHOUT momentum).
        warmup_iters: iterations reduced uncompressed first; None takes the
            compressor's ``warmup`` (``"onebit:warmup=50"``), or 1 when that is 0.
        min_compress_numel: buckets smaller than this are reduced uncompressed.

    Example::

        state = CompressionState("onebit", momentum=0.9)
        ddp.register_comm_hook(state, compression_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.0)
    """

    __slots__ = (
        # tuned
        "compressor",
        "error_feedback",
        "momentum",
        # seldom tuned
        "warmup_iters",
        "min_compress_numel",
        "process_group",
        # internal
        "step",
        "momentum_buffers",
        "layouts",
        "param_ids",
        "sequencer",
        "_orphans",
    )

    def __init__(
        self,
        compressor: str | Compressor = "onebit",
        process_group: dist.ProcessGroup | None = None,
        error_feedback: bool | ErrorFeedback | None = None,
        momentum: float = 0.0,
        warmup_iters: int | None = None,
        min_compress_numel: int = 1024,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1) (0 disables the hook's momentum), got {momentum}")
        if warmup_iters is not None and warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {warmup_iters}")
        if min_compress_numel < 0:
            raise ValueError(f"min_compress_numel must be >= 0, got {min_compress_numel}")
        self.compressor = get_compressor(compressor)
        if warmup_iters is None:
            warmup_iters = self.compressor.warmup or 1
        if error_feedback is None:
            error_feedback = not self.compressor.unbiased
        if isinstance(error_feedback, bool):
            error_feedback = ErrorFeedback() if error_feedback else None
        self.error_feedback: ErrorFeedback | None = error_feedback
        self.momentum = float(momentum)
        self.warmup_iters = int(warmup_iters)
        self.min_compress_numel = int(min_compress_numel)
        self.process_group = process_group
        self.step = 0
        self.momentum_buffers: dict[int, Tensor] = {}
        self.layouts: dict[int, tuple] = {}
        self.param_ids: dict[int, tuple] = {}
        self.sequencer = Sequencer()
        #: per-parameter (momentum, residual) pieces between a bucket rebuild and their new bucket
        self._orphans: dict[int, tuple[Tensor | None, Tensor | None]] = {}
        log.info(
            "compression hook: compressor=%s error_feedback=%s momentum=%s warmup_iters=%d min_compress_numel=%d",
            self.compressor.name, self.error_feedback is not None, self.momentum, self.warmup_iters,
            self.min_compress_numel,
        )

    # -- per-bucket helpers used by the hook ---------------------------------
    def check_layout(self, key: int, params: list[Tensor]) -> None:
        """Follow DDP's bucket rebuild: carry per-parameter state into the new buckets.

        In one process the parameters' identities are compared (a reordering
        of equal shapes is caught) and the state moves with its parameters;
        after ``load_state_dict`` only shapes can be compared and a changed
        bucket restarts (see the module doc).
        """
        shapes = tuple(tuple(p.shape) for p in params)
        ids = tuple(id(p) for p in params)
        old_ids = self.param_ids.get(key)
        if old_ids is not None and old_ids != ids:
            self._release_all()  # the first rebuilt bucket: every old bucket is gone
        elif old_ids is None and self.layouts.get(key, shapes) != shapes:
            log.warning("bucket %d changed its parameters after a resume; its residual and momentum restart", key)
            self._forget(key)
        if key not in self.param_ids and self._orphans:
            self._adopt(key, params)
        self.layouts[key] = shapes
        self.param_ids[key] = ids

    def _forget(self, key: int) -> None:
        self.momentum_buffers.pop(key, None)
        if self.error_feedback is not None:
            self.error_feedback.reset(key)
            self.error_feedback.reset(("server", key))

    def _release_all(self) -> None:
        """Cut every bucket's momentum and worker residual into per-parameter pieces."""
        ef = self.error_feedback
        for key, ids in self.param_ids.items():
            sizes = [math.prod(shape) for shape in self.layouts[key]]
            m = self.momentum_buffers.get(key)
            r = ef.residual(key) if ef is not None else None
            offset = 0
            for pid, n in zip(ids, sizes):
                piece = (None if m is None or m.numel() != sum(sizes) else m[offset:offset + n].clone(),
                         None if r is None or r.numel() != sum(sizes) else r[offset:offset + n].clone())
                self._orphans[pid] = piece
                offset += n
            self._forget(key)
        self.param_ids.clear()
        self.layouts.clear()

    def _adopt(self, key: int, params: list[Tensor]) -> None:
        """Assemble bucket ``key``'s state from the pieces of its parameters (zeros where none)."""
        pieces = [self._orphans.pop(id(p), (None, None)) for p in params]
        for slot, store in ((0, "momentum"), (1, "residual")):
            if all(piece[slot] is None for piece in pieces):
                continue
            flat = torch.cat([piece[slot] if piece[slot] is not None else torch.zeros(p.numel(), dtype=p.dtype)
                              for piece, p in zip(pieces, params)])
            if store == "momentum":
                self.momentum_buffers[key] = flat
            elif self.error_feedback is not None:
                self.error_feedback.set_residual(key, flat)

    def end_step(self) -> None:
        """Advance the step (the hook calls it on the last bucket); pieces nobody adopted are dropped."""
        self.step += 1
        self._orphans.clear()

    def apply_momentum(self, key: int, grad: Tensor) -> None:
        """``m = beta m + g``; ``grad`` is overwritten with ``m``."""
        m = self.momentum_buffers.get(key)
        if m is None or m.shape != grad.shape:
            self.momentum_buffers[key] = grad.clone()
            return
        m.mul_(self.momentum).add_(grad)
        grad.copy_(m)

    def compressing(self, numel: int) -> bool:
        """Whether a bucket of ``numel`` elements is compressed at the current step."""
        return self.step >= self.warmup_iters and numel >= self.min_compress_numel

    # -- checkpoints -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly like an uninterrupted one."""
        return {
            "step": self.step,
            "momentum_buffers": {k: v.clone() for k, v in self.momentum_buffers.items()},
            "layouts": dict(self.layouts),
            "error_feedback": None if self.error_feedback is None else self.error_feedback.state_dict(),
            "compressor": self.compressor.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (the configuration is not part of it)."""
        self.step = int(state["step"])
        self.momentum_buffers = {k: v.clone() for k, v in state["momentum_buffers"].items()}
        self.layouts = dict(state["layouts"])
        self.param_ids = {}
        self._orphans = {}
        if self.error_feedback is not None and state["error_feedback"] is not None:
            self.error_feedback.load_state_dict(state["error_feedback"])
        self.compressor.load_state_dict(state["compressor"])

    # -- pickling without the process group ----------------------------------
    def __getstate__(self) -> dict[str, Any]:
        skip = ("process_group", "sequencer", "param_ids", "_orphans")
        return {s: getattr(self, s) for s in self.__slots__ if s not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self.process_group = None
        self.param_ids = {}
        self._orphans = {}
        self.sequencer = Sequencer()
