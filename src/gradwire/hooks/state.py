"""``CompressionState``: the state object of :func:`gradwire.hooks.compression_hook`.

Why plain gradient error feedback fails with momentum: EF (``C(g + e)``, the
dropped part re-sent later) repays every coordinate's compression error one or
more steps late. Seen from the "virtual" model ``x~ = x - lr * mean_i e_i``
(which follows exact momentum SGD), every rank evaluates its gradient at a
point displaced by ``lr * mean_i e_i``: a delayed gradient. Heavy-ball
momentum with a delayed gradient is stable only for much smaller steps (the
quadratic analysis in :mod:`gradwire.overlap.delayed`), so accuracy swings:
0.49 on the digits CNN with the optimiser's momentum; 0.87 (onebit) and 0.87
(topk:0.01) with the momentum in the hook and EF on it, vs 0.956 uncompressed.

The scheme (momentum in the hook, EF on the momentum, local correction):

1. The hook keeps a momentum buffer per bucket: ``m = beta m + g``.
2. ``c = m + e`` (error feedback), ``Δ = C(c)``, ``e' = c - Δ``; the exchange
   returns ``avg = mean_i Δ_i`` (two-phase: re-compressed by the chunk's
   server with its residual ``s``).
3. Local correction: rank ``i`` applies ``u_i = avg + (e'_i - e_i)`` and, on
   the chunk it serves, ``+ world * (s' - s)``. Then ``mean_i u_i == mean_i
   m_i`` exactly: the mean model is uncompressed momentum SGD, and rank ``i``
   sits at ``lr * (mean_j e_j - e_i)`` from it (bounded, never accumulating:
   ``sum_t u_i = sum_t avg + e_i``). The displacements average to zero over
   the ranks, so their first-order effect on the mean gradient cancels, where
   plain EF displaces every rank by the same ``lr * mean e``. This is the
   synchronous analogue of ``delayed``'s ``v_t + avg_{t-1} - v_{t-1}``: a
   rank's own fresh vector enters at once, the compressed consensus carries
   the rest. The optimiser runs WITHOUT momentum (``SGD(momentum=0)``).
   ``local_correction=False`` applies ``avg`` on every rank (identical
   models, the old behaviour); ``signum`` (a vote, not an average) and
   unbiased compressors (no EF) never correct.

Measured (digits CNN, 4 ranks, lr 0.05, 8 epochs, seeds 0-2; details in
benchmarks/results/compress_accuracy.md): onebit 0.875 -> 0.938, topk:0.01
0.871 -> 0.936, powersgd:4 0.375 -> 0.929 (none 0.956). Tried and worse here:
EF21 (Richtárik et al., 2021) on the hook's momentum, seed 0: onebit 0.49,
topk 0.83 -- the tracked estimate lags the momentum and oscillates as well.

Trap: with local correction the ranks' parameters differ (by ``lr`` times
their residual differences); average the parameters once at the end (or use
``local_correction=False``) when identical replicas matter.

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
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from gradwire.compress import Compressor, ErrorFeedback, Pattern, get_compressor
from gradwire.compress.twophase import chunk_bounds, chunk_granule

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
        local_correction: apply this rank's own compression error at once
            (``avg + e_new - e_old``, see the module doc); None: on where error
            feedback is on and the exchange averages (all but ``signum``).
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
        "local_correction",
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
        local_correction: bool | None = None,
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
        if local_correction is None:
            local_correction = error_feedback is not None and self.compressor.averages
        if local_correction and (error_feedback is None or not self.compressor.averages):
            raise ValueError("local_correction needs error feedback and an exchange that averages "
                             f"({self.compressor.name}: error_feedback={error_feedback is not None}, "
                             f"averages={self.compressor.averages})")
        self.local_correction = bool(local_correction)
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
        #: per-parameter pieces of state (by store name) between a bucket rebuild and their new bucket
        self._orphans: dict[int, dict[str, Tensor]] = {}
        log.info(
            "compression hook: compressor=%s error_feedback=%s momentum=%s warmup_iters=%d min_compress_numel=%d",
            self.compressor.name, type(self.error_feedback).__name__ if self.error_feedback else None, self.momentum, self.warmup_iters,
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

    def _stores(self) -> list[tuple[str, Any, Any]]:
        """(name, get(key), set(key, tensor)) of every per-bucket, per-element state."""
        stores: list[tuple[str, Any, Any]] = [("momentum", self.momentum_buffers.get, self.momentum_buffers.__setitem__)]
        ef = self.error_feedback
        if ef is not None:
            stores.append(("residual", ef.residual, ef.set_residual))
        return stores

    def _release_all(self) -> None:
        """Cut every bucket's per-element state into per-parameter pieces."""
        stores = self._stores()
        for key, ids in self.param_ids.items():
            sizes = [math.prod(shape) for shape in self.layouts[key]]
            flats = {name: get(key) for name, get, _ in stores}
            offset = 0
            for pid, n in zip(ids, sizes):
                self._orphans[pid] = {name: flat[offset:offset + n].clone() for name, flat in flats.items()
                                      if flat is not None and flat.numel() == sum(sizes)}
                offset += n
            self._forget(key)
        self.param_ids.clear()
        self.layouts.clear()

    def _adopt(self, key: int, params: list[Tensor]) -> None:
        """Assemble bucket ``key``'s state from the pieces of its parameters (zeros where none)."""
        pieces = [self._orphans.pop(id(p), {}) for p in params]
        for name, _, put in self._stores():
            if all(name not in piece for piece in pieces):
                continue
            put(key, torch.cat([piece[name] if name in piece
                                else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                                for piece, p in zip(pieces, params)]))

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

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size) in the state's group; (0, 1) without a process group."""
        if not dist.is_available() or not dist.is_initialized():
            return 0, 1
        return dist.get_rank(self.process_group), dist.get_world_size(self.process_group)

    def corrector(self, key: int, numel: int) -> Callable[[Tensor], Tensor]:
        """Call before the exchange: the returned function adds this rank's change of residuals to the average.

        ``avg + (e_new - e_old)`` for the worker residual, and, on the chunk
        this rank serves in the two-phase exchange, ``world * (s_new - s_old)``
        for the server residual: the mean over ranks of what they apply is
        then exactly the mean of the uncompressed momenta (module doc).
        """
        ef = self.error_feedback
        assert ef is not None, "local correction needs error feedback"
        rank, world = self.rank_world()
        start, count = chunk_bounds(numel, world, chunk_granule(self.compressor))[rank]
        two_phase = self.compressor.pattern is Pattern.TWO_PHASE and count > 0
        worker_old = _snapshot(ef.residual(key), numel)
        server_old = _snapshot(ef.residual(("server", key)), count) if two_phase else None

        def correct(average: Tensor) -> Tensor:
            _add_change(average, ef.residual(key), worker_old, 1.0)
            if two_phase:
                _add_change(average[start : start + count], ef.residual(("server", key)), server_old, float(world))
            return average

        return correct

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


def _snapshot(residual: Tensor | None, numel: int) -> Tensor | None:
    return residual.clone() if residual is not None and residual.numel() == numel else None


def _add_change(out: Tensor, new: Tensor | None, old: Tensor | None, alpha: float) -> None:
    """``out += alpha * (new - old)``; a missing (or reset, re-shaped) residual counts as zero."""
    if new is not None and new.numel() == out.numel():
        out.add_(new.view(out.shape), alpha=alpha)
    if old is not None and old.numel() == out.numel():
        out.sub_(old.view(out.shape), alpha=alpha)
