"""``CompressionState``: the one object that runs a compressed exchange, for every front end.

It owns the compressor, error feedback (worker and server residuals), the
momentum kept before compression, the warm-up and small-tensor cutoff, the
optional local correction, the launch order (:class:`~gradwire.exchange.futures.Sequencer`)
and the exchange patterns (:mod:`gradwire.exchange.patterns`). The DDP hook
(:func:`~gradwire.hooks.compression_hook`), ``delayed``, the
``AsyncGradientHandler`` and the model-averaging strategies all call it.

One exchange (:meth:`CompressionState.reduce`):

1. Momentum (``momentum=beta``): ``m = beta m + g``; the tensor becomes ``m``.
2. Warm-up steps, tensors below ``min_compress_numel`` and integer tensors
   take the plain average (all_reduce). Otherwise:
3. ``c = m + e`` (error feedback), ``Δ = C(c)``, ``e' = c - Δ``; the exchange
   returns ``avg = mean_i Δ_i`` (two-phase: re-compressed by the chunk's
   server with its residual ``s``).
4. Every rank applies ``avg``: the same decoded average, bit for bit, so
   the replicas stay identical after every step (DDP's invariant, which
   evaluating and saving on rank 0 rely on). With the local correction
   (``local_correction=True``, or ``correct=1`` in the compressor's name),
   rank ``i`` applies ``u_i = avg + (e'_i - e_i)`` instead and, on the chunk
   it serves, ``+ world * (s' - s)``.

Why momentum lives here (and the optimiser runs without it): plain error
feedback (``C(g + e)``) repays every coordinate's compression error one or
more steps late. Seen from the "virtual" model ``x~ = x - lr * mean_i e_i``
(which follows exact momentum SGD), every rank evaluates its gradient at a
point displaced by ``lr * mean_i e_i``: a delayed gradient, and heavy-ball
momentum with a delayed gradient is stable only for much smaller steps (the
quadratic analysis in :mod:`gradwire.strategies.delayed`). Training with the
optimiser's momentum behind error feedback collapses (benchmarks/README.md).

The local correction, an option (off by default). With it ``mean_i u_i ==
mean_i m_i`` exactly: the mean model is uncompressed momentum SGD, and rank
``i`` sits at ``lr * (mean_j e_j - e_i)`` from it (bounded, never
accumulating: ``sum_t u_i = sum_t avg + e_i``). The displacements average to
zero over the ranks, so their first-order effect on the mean gradient
cancels, where plain error feedback displaces every rank by the same ``lr *
mean e``. This is the synchronous analogue of ``delayed``'s ``v_t +
avg_{t-1} - v_{t-1}``. A vote (``signum``) and unbiased compressors (no
error feedback) cannot correct. Trap: with it the ranks' parameters differ
(by ``lr`` times their residual differences), so rank 0's evaluation and
checkpoint are of rank 0's replica only, a model loaded before ``DDP(...)``
is overwritten by rank 0's, and ``sync`` averages the parameters once at the
end. Whether it pays (benchmarks/README.md, ``local_correction.py``: the
digits CNN under onebit and topk with momentum SGD, 4 ranks, 5 seeds): early
in training, yes (after 60 steps 14-18 points of test accuracy higher, after
120 steps 2.3), trained to the end, no (after 220 and 720 steps within one
test image). It is off by default because identical replicas are what a
script that evaluates and saves on rank 0 relies on.

Warm-up: the first ``warmup_iters`` steps are reduced uncompressed (the
momentum still runs, so this is exactly momentum SGD), as 1-bit Adam's
full-precision stage: the first, large and fast changing updates cost
sign compression the most. Default: the compressor's ``warmup=N``, else 1
(DDP's first iteration also runs on buckets it rebuilds afterwards).

Fusion (:meth:`CompressionState.reduce_params` with ``last``): a compressed
exchange has a fixed cost per bucket that bytes do not pay for: two
collectives for the two-phase pattern, each with its latency and the
backend's own per-op work, plus the compressor's per-call Python. A model
whose buckets are small (a small model, or ``bucket_cap_mb`` set low) pays
it many times per step, and a compressed step can then be slower than
sync's plain all_reduces. So a compressing step holds floating-point
buckets of fewer than ``fuse_numel`` elements and sends them, in order, as
one tensor once the held ones reach ``fuse_numel`` or the step's last
bucket arrives (Horovod's tensor fusion, for the compressed payload): one
exchange, one compression call. The fused key is the concatenation of the
buckets' keys, so momentum and residuals still belong to each parameter,
and the small-tensor cutoff applies to the fused tensor. Trap: a held
bucket waits for later ones, so the exchange of the first small buckets
no longer overlaps the rest of backward; that is why only buckets below
``fuse_numel`` are held (``fuse_numel=0``: never). Warm-up and
uncompressed steps are not fused (they are DDP's own all_reduces).

Non-finite steps (an fp16 overflow that ``torch.amp.GradScaler`` will skip):
the NaN/inf reaches the result, where the scaler sees it, but the momentum,
the worker residual and the server residual stay as they were, so the next
clean step continues as if the bad one never happened. The decision is each
rank's own (its input, or the chunk it serves): on a step where only some
ranks overflow, the others keep their momentum update. Trap: with a
GradScaler the state sees *scaled* gradients, so after the scaler changes
its scale the momentum and residuals carried over are in the old units for
a while (they decay with ``beta``); a scale that changes seldom
(``growth_interval``) keeps that rare.

State keys (:class:`~gradwire.compress.StateKey`): per-element state
(momentum, worker residual) belongs to named segments. DDP buckets are named
by their parameters, ``"p0"``, ``"p1"``, ... in the order this state first
sees them, which is the order of DDP's first-iteration buckets: the same in
every process that builds the same model. So when DDP rebuilds its buckets
(after the first iteration, in gradient-ready order) each parameter's
momentum and residual move to its new place, and a checkpoint
(:meth:`CompressionState.state_dict`) resumes into a new DDP of the same
model exactly: during the first iteration after ``load_state_dict``, a
bucket whose parameters are those of one or more saved layouts (DDP's first
iteration often puts everything in one large bucket, or the same parameters
in another order) is reduced as those layouts, in the saved order, so the
compressor's blocks and the served chunks are the saved ones; from the next
iteration DDP's rebuilt buckets are the saved layouts again. A first bucket
that splits a saved layout is reduced as it is, with the state carried per
parameter (a warning says so). Server residuals belong to a layout's chunk
and restart when the layout changes. Trap: register the hook before the
first backward (names are given in first-iteration order).

Checkpoints (:meth:`CompressionState.state_dict`): the parameters are the
same on every rank, but the momentum and residuals are each rank's own
(they come from its own gradients). ``state_dict()`` is therefore a
collective (:mod:`gradwire.exchange.checkpoint`): every rank calls it, and
it returns every rank's part, which one rank saves; each rank's
``load_state_dict`` takes its own part. As a user writes it::

    ex = state.state_dict()                  # every rank: gathers the ranks' parts
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "exchange": ex}, path)

    ckpt = torch.load(path, weights_only=True)   # every rank, the one file
    model.load_state_dict(ckpt["model"])         # before DDP(model) or after (ddp.module): the same
    opt.load_state_dict(ckpt["opt"])
    state.load_state_dict(ckpt["exchange"])

The resumed run equals the uninterrupted one bit for bit, the model loaded
before or after ``DDP(...)``, whatever layout DDP's first iteration gives
the buckets: each parameter's momentum and residual follow its name.
Called on rank 0 alone (inside ``if rank == 0:``), ``state_dict()`` raises
:class:`~gradwire.exchange.checkpoint.CheckpointError` after ``timeout``
seconds instead of waiting forever. A file per rank works too
(:meth:`CompressionState.local_state_dict`).

What warns (``RuntimeWarning``, and the log), since training then goes on,
but not as the uninterrupted run would have:

- another world size: each rank starts from the mean of the saved ranks'
  momenta and worker residuals (their average carries over, each rank's own
  share does not) and the server residuals restart;
- another bucket layout (``bucket_cap_mb``, fusion): the state is carried per
  parameter, but the compression blocks and served chunks differ, checked
  once DDP rebuilt its buckets;
- with the local correction on, a rank whose parameters are not the replica
  it saved (each part records a checksum of its rank's parameters): DDP's
  constructor broadcasts rank 0's, so load each rank's model after
  ``DDP(...)`` or build it with ``init_sync=False``;
- a checkpoint written after the first iteration of a DDP, before DDP
  rebuilt its buckets: it cannot know the rebuilt layout the uninterrupted
  run goes on with (write checkpoints after the second iteration or later).

The layouts of the last step are saved too, so that the first resumed
iteration reduces the same tensors even where no per-element state exists
yet (a plain all_reduce of more than two ranks sums in an order that depends
on the layout). The compressor's own state (PowerSGD's warm start, the
random streams of ``qsgd``, ``int8`` and ``terngrad``, ``topk``'s sample
positions) is part of each rank's part.
"""
from __future__ import annotations

import logging
import warnings
import weakref
import zlib
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from gradwire.compress import (AutoCompressor, Compressor, ErrorFeedback, Pattern, SegmentStore, StateKey,
                               get_compressor, is_finite)
from gradwire.compress.none import NoneCompressor
from gradwire.compress.state import rearrange
from gradwire.compress.twophase import chunk_bounds, chunk_granule

from . import patterns
from .checkpoint import GATHER_TIMEOUT, gather_parts, mean_tensors, own_part
from .chooser import AutoChooser
from .futures import Sequencer, counted, then

__all__ = ["FUSE_NUMEL", "MIN_COMPRESS_NUMEL", "CompressionState", "ParamNames", "fuse_layouts", "warmup_steps"]

log = logging.getLogger(__name__)

#: tensors (buckets) smaller than this are averaged uncompressed: a compression round's fixed
#: cost (chunking, packing, a second collective) outweighs the few bytes it saves
MIN_COMPRESS_NUMEL = 1024

#: compressed buckets smaller than this wait and leave with the next ones as one exchange (tensor
#: fusion): 64 Ki elements, 256 KiB of fp32; the default CNN's buckets are all larger
FUSE_NUMEL = 1 << 16


def warmup_steps(compressor: str | Compressor | None) -> int:
    """Steps a :class:`CompressionState` of ``compressor`` reduces uncompressed first by default (module doc).

    The compressor's ``warmup=N``, else 1; 0 without a compressor (nothing to warm up).
    """
    if compressor is None:
        return 0
    c = get_compressor(compressor)
    return 0 if isinstance(c, NoneCompressor) else c.warmup or 1


class ParamNames:
    """Names tensors ``"p0"``, ``"p1"``, ... in the order they are first seen (held weakly).

    A tensor that died and whose ``id`` is reused by a new one gets a new name.
    """

    __slots__ = ("_by_id", "_next")

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, str]] = {}
        self._next = 0

    def name(self, tensor: Tensor) -> str:
        entry = self._by_id.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        name = f"p{self._next}"
        self._next += 1
        self._by_id[id(tensor)] = (weakref.ref(tensor), name)
        return name

    def key(self, tensors: Sequence[Tensor]) -> StateKey:
        """The key of a flat tensor made of ``tensors`` in this order."""
        return StateKey(tuple((self.name(t), t.numel()) for t in tensors))

    def named(self) -> list[tuple[str, Tensor]]:
        """The live tensors with their names, in naming order."""
        alive = [(name, ref()) for ref, name in self._by_id.values()]
        return sorted(((n, t) for n, t in alive if t is not None), key=lambda nt: int(nt[0][1:]))


class CompressionState:
    """Configuration and state of a compressed exchange (see the module doc).

    Args:
        compressor: a name (``"onebit"``, ``"topk:0.01"``, ...) or a Compressor.
        process_group: group to reduce on; None for the default group.
        error_feedback: True/False, an ``ErrorFeedback`` to use, or None for
            "on when the compressor is biased".
        momentum: 0 to compress gradients; ``beta`` in (0, 1) to keep momentum
            here and compress the update (use the optimiser WITHOUT momentum).
        warmup_iters: steps reduced uncompressed first; None takes the
            compressor's ``warmup`` (``"onebit:warmup=50"``), or 1 when that is 0.
        min_compress_numel: tensors smaller than this are reduced uncompressed.
        local_correction: apply this rank's own compression error at once
            (``avg + e_new - e_old``; needs error feedback and an exchange that
            averages). Off by default: every rank applies the same decoded
            average, bit for bit, and the replicas stay identical (DDP's
            invariant). Trap when on: the ranks' parameters differ (module
            doc). None takes the compressor's ``correct=1`` (default off).
        fuse_numel: compressed buckets smaller than this are held and sent
            with the next ones as one exchange (module doc); 0: never; None
            takes the compressor's ``fuse=N``, else :data:`FUSE_NUMEL`.

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
        "fuse_numel",
        "process_group",
        # internal
        "step",
        "momentum_buffers",
        "names",
        "sequencer",
        "_loaded",
        "_layouts",
        "_last_layouts",
        "_resumed",
        "_run_steps",
        "_rebuild_check",
        "_layout_check",
        "_held",
        "auto",
        "_step_futures",
    )

    def __init__(
        self,
        compressor: str | Compressor = "onebit",
        process_group: dist.ProcessGroup | None = None,
        error_feedback: bool | ErrorFeedback | None = None,
        momentum: float = 0.0,
        warmup_iters: int | None = None,
        min_compress_numel: int = MIN_COMPRESS_NUMEL,
        local_correction: bool | None = None,
        fuse_numel: int | None = None,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1) (0 disables the state's momentum), got {momentum}")
        if warmup_iters is not None and warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {warmup_iters}")
        if min_compress_numel < 0:
            raise ValueError(f"min_compress_numel must be >= 0, got {min_compress_numel}")
        if fuse_numel is not None and fuse_numel < 0:
            raise ValueError(f"fuse_numel must be >= 0 (0: never fuse buckets), got {fuse_numel}")
        self.compressor = get_compressor(compressor)
        #: ``auto``: which candidate each exchange uses (None for one fixed compressor)
        self.auto = AutoChooser(self.compressor) if isinstance(self.compressor, AutoCompressor) else None
        if fuse_numel is None:
            fuse_numel = FUSE_NUMEL if self.compressor.fuse is None else self.compressor.fuse
        if warmup_iters is None:
            warmup_iters = max(1, warmup_steps(self.compressor))  # "none" too: DDP's first iteration
        if error_feedback is None:
            error_feedback = not self.compressor.unbiased
        if isinstance(error_feedback, bool):
            error_feedback = ErrorFeedback(keep=self.compressor.ef / 100) if error_feedback else None
        if local_correction is None:
            local_correction = self.compressor.correct
        if local_correction and (error_feedback is None or not self.compressor.averages):
            raise ValueError("local_correction needs error feedback and an exchange that averages "
                             f"({self.compressor.name}: error_feedback={error_feedback is not None}, "
                             f"averages={self.compressor.averages}); leave it off (the default)")
        self.local_correction = bool(local_correction)
        self.error_feedback: ErrorFeedback | None = error_feedback
        self.momentum = float(momentum)
        self.warmup_iters = int(warmup_iters)
        self.min_compress_numel = int(min_compress_numel)
        self.fuse_numel = int(fuse_numel)
        self.process_group = process_group
        self.step = 0
        self.momentum_buffers = SegmentStore()
        self.names = ParamNames()
        self.sequencer = Sequencer()
        #: the layouts restored by load_state_dict, in the order they were used (until the first iteration ends)
        self._loaded: list[StateKey] = []
        #: the keys reduced in this step and in the last complete one, in order (saved in checkpoints)
        self._layouts: dict[StateKey, None] = {}
        self._last_layouts: dict[StateKey, None] = {}
        #: what the checkpoint said about the rank that saved it, checked by the first exchange after a load
        self._resumed: dict[str, Any] | None = None
        #: steps since construction or the last load: DDP rebuilds its buckets after the first
        self._run_steps = 0
        #: the checkpoint was written before its DDP rebuilt the buckets: compare the first two layouts
        self._rebuild_check = False
        #: the saved run's layouts, compared with the resumed run's once DDP rebuilt its buckets
        self._layout_check: list[StateKey] = []
        #: buckets waiting to leave with the next ones as one exchange (fusion, module doc)
        self._held: list[_Held] = []
        #: this step's exchanges (``auto`` times how long the step waits for them)
        self._step_futures: list[Future] = []
        log.debug(
            "compression state: compressor=%s error_feedback=%s momentum=%s warmup_iters=%d min_compress_numel=%d "
            "local_correction=%s", self.compressor.name, self.error_feedback is not None, self.momentum,
            self.warmup_iters, self.min_compress_numel, self.local_correction,
        )

    # -- the exchange ----------------------------------------------------------
    def compressing(self, numel: int) -> bool:
        """Whether a tensor of ``numel`` elements is compressed at the current step."""
        return self.step >= self.warmup_iters and numel >= self.min_compress_numel

    def end_step(self) -> None:
        """Advance the step (once per training step: the DDP hook does it on the last bucket).

        Buckets still held for fusion (a caller that never said which bucket
        was the last) leave now, as one exchange.
        """
        self._flush()
        # auto learns the layouts from the last warm-up step on: its first choice applies from the first
        # compressing step (AutoChooser's module doc, "Scheduling"), which fuses small buckets as warm-up does not
        if self.auto is not None and self.step >= self.warmup_iters - 1:
            layouts = list(self._layouts)
            if self.step < self.warmup_iters and self.fuse_numel > 0:
                layouts = fuse_layouts(layouts, self.fuse_numel)
            self.auto.end_step(self.step, layouts, self.process_group, self._step_futures)
        self._step_futures = []
        self.step += 1
        self._loaded = []
        self._run_steps += 1
        if self._layout_check and self._run_steps == 2:
            saved, self._layout_check = self._layout_check, []
            if fuse_layouts(saved, self.fuse_numel) != fuse_layouts(list(self._layouts), self.fuse_numel):
                self._warn_resume("its bucket layout is not this run's (another bucket_cap_mb, model or DDP "
                                  "setting): the state is carried per parameter, but the compression blocks and "
                                  "served chunks, and so the updates, differ from the uninterrupted run's")
        if self._rebuild_check and self._run_steps == 2:
            self._rebuild_check = False
            if list(self._layouts) != list(self._last_layouts):
                self._warn_resume("it was written after the first iteration of its DDP, before DDP rebuilt its "
                                  "buckets, so the first resumed iteration was reduced in DDP's initial layout "
                                  "where the uninterrupted run used the rebuilt one; checkpoints written after "
                                  "the second iteration or later resume exactly")
        self._last_layouts, self._layouts = self._layouts, {}

    def reduce(self, flat: Tensor, key: StateKey, local: Tensor | None = None) -> Future:
        """Average the 1-D contiguous ``flat`` over the group; the future's value is ``flat``, overwritten.

        Args:
            flat: this rank's tensor (overwritten: first with the momentum,
                then the compensated value, finally the result).
            key: names ``flat``'s elements (momentum and residuals live under it).
            local: receives this rank's own vector after the momentum step (``m``,
                or ``flat`` itself without momentum), before anything is sent.

        Returns:
            A Future whose value is ``flat`` once it holds the average; it
            fails with the error of any collective of the exchange.
        """
        key.check(flat)
        self._layouts[key] = None
        numel = flat.numel()
        compressor = self.compressor
        if self.auto is not None:
            self.auto.begin_exchange(self.sequencer, self.process_group)
            compressor = self.auto.compressor_for(key, flat)
        coding = self.compressing(numel) and flat.is_floating_point() and numel > 0
        compress = coding and not isinstance(compressor, NoneCompressor)
        # auto moving an exchange to none: what error feedback still owes is sent now, exactly
        settle = coding and not compress and self.auto is not None and self._owes(key)
        ef = self.error_feedback if compress or settle else None
        finite = True
        if flat.is_floating_point() and numel and (self.momentum or ef is not None):
            finite = is_finite(flat)
        plain = not compress and not settle
        momentum = bool(self.momentum) and flat.is_floating_point()
        # the plain average's division by the world size is done in the momentum step's last pass (no local copy
        # wants the undivided vector): bit for bit the same values, one pass over the bucket fewer
        divide = self.rank_world()[1] if plain and momentum and local is None else 1
        if momentum:
            self._apply_momentum(key, flat, finite, divide)
        if local is not None:
            local.copy_(flat)
        turn = self.sequencer.turn()
        group = self.process_group
        if plain:
            return self._keep(patterns.average(turn, flat, group, divided=divide != 1))
        if ef is not None:
            ef.compensate(flat, key)
        retired = self._retire_chunks(key, compressor, flat) if self.auto is not None and finite else []
        correct = self._corrector(key, numel, compressor, retired) if self.local_correction else None
        if settle:  # m + e goes out as it is: every residual of this layout is paid and forgotten
            if finite:
                self._forget(key)
            fut = patterns.average(turn, flat, group)
        elif compressor.pattern is Pattern.TWO_PHASE:
            fut = patterns.two_phase(turn, flat, key, compressor, group, ef, finite)
        else:
            update = None if ef is None else (lambda approx: ef.update(key, flat, approx, finite))
            run = patterns.allgather if compressor.pattern is Pattern.ALLGATHER else patterns.allreduce_rounds
            fut = run(turn, flat, key, compressor, group, update)
        return self._keep(fut if correct is None else then(fut, correct))

    def _keep(self, fut: Future) -> Future:
        """``auto`` times a step's exchanges from its end (:meth:`AutoChooser.end_step`): keep them; return ``fut``."""
        if self.auto is not None:
            self._step_futures.append(fut)
        return fut

    def _owes(self, key: StateKey) -> bool:
        """Whether error feedback holds a worker residual of ``key``'s parameters or a served chunk of its layout."""
        ef = self.error_feedback
        if ef is None:
            return False
        return ef.residual(key) is not None or any(k.chunk is not None and k.segments == key.segments
                                                   for k in ef.keys())

    def _retire_chunks(self, key: StateKey, compressor: Compressor, flat: Tensor) -> list[tuple[tuple[int, int], Tensor]]:
        """Pay in the server residuals of ``key``'s layout that ``compressor`` does not serve; return them.

        ``auto`` moved the exchange to another pattern or granule: what rank
        ``i``'s server withheld from everyone on its chunk (``s_i``) goes into
        this exchange (``world * s_i`` added to the chunk, so the average
        carries ``s_i``), and the local correction takes rank ``i``'s own
        displacement back (``world * (0 - s_i)``, see :meth:`_corrector`).
        """
        ef = self.error_feedback
        if ef is None:
            return []
        world = self.rank_world()[1]
        served = self._served(key, key.total, compressor)[0]
        retired = []
        for k in ef.keys():
            if k.chunk is not None and k.segments == key.segments and k != served:
                residual = ef.residual(k)
                if residual is not None:
                    begin, length = k.chunk
                    flat.view(-1)[begin:begin + length].add_(residual.view(-1), alpha=float(world))
                    retired.append((k.chunk, residual.clone()))
                ef.reset(k)
        return retired

    def _forget(self, key: StateKey) -> None:
        """Drop ``key``'s worker residual and its layout's served chunks (after the corrector copied them)."""
        ef = self.error_feedback
        assert ef is not None
        for k in ef.keys():
            if k == key or (k.chunk is not None and k.segments == key.segments):
                ef.reset(k)

    def reduce_params(self, flat: Tensor, params: Sequence[Tensor], local: Tensor | None = None,
                      key: StateKey | None = None, last: bool = True) -> tuple[StateKey, Future]:
        """:meth:`reduce` of a flat tensor made of ``params`` (a DDP bucket); returns its key and the future.

        ``key``: ``self.names.key(params)`` when the caller has it already.
        ``last``: no bucket of this step follows; False lets a small bucket
        wait to be fused with the next ones (module doc: the future then
        completes when the fused exchange does). During the first iteration
        after :meth:`load_state_dict`, a bucket whose parameters are those of
        one or more saved layouts is reduced as those layouts, in the saved
        order (see the module doc).
        """
        key = self.names.key(params) if key is None else key
        if self._resumed is not None:
            self._check_resumed(params)
        fuse = self._fusing(flat)
        if self._held and (not fuse or not self._held[0].joins(flat)):
            self._flush()
        # the first iteration after a load holds every bucket: the saved layouts are fused as saved
        resuming = bool(self._loaded)
        if not fuse or (not self._held and (last or (flat.numel() >= self.fuse_numel and not resuming))):
            return key, self._reduce_layout(flat, key, local)
        held = _Held(flat, key, local)
        self._held.append(held)
        if last or (not resuming and sum(h.flat.numel() for h in self._held) >= self.fuse_numel):
            self._flush()
        return key, held.future

    def _fusing(self, flat: Tensor) -> bool:
        """Whether buckets like ``flat`` are fused at this step: a compressing step and a floating-point bucket.

        A bucket at or above ``fuse_numel`` is not held, but it takes the held ones with it.
        """
        return (self.fuse_numel > 0 and flat.is_floating_point() and self.step >= self.warmup_iters
                and not isinstance(self.compressor, NoneCompressor))

    def _flush(self) -> None:
        """Send the held buckets as one exchange; each one's future completes with its part of the result."""
        held, self._held = self._held, []
        if not held:
            return
        if len(held) == 1:
            one = held[0]
            _settle(one.future, self._reduce_layout(one.flat, one.key, one.local))
            return
        flat = torch.cat([h.flat.view(-1) for h in held])
        key = StateKey(tuple(seg for h in held for seg in h.key.segments))
        local = torch.empty_like(flat) if any(h.local is not None for h in held) else None
        fut = self._reduce_layout(flat, key, local)
        sizes = [h.flat.numel() for h in held]
        if local is not None:  # written before anything is sent
            for h, part in zip(held, local.split(sizes)):
                if h.local is not None:
                    h.local.view(-1).copy_(part)

        def scatter(done: Future) -> None:
            try:
                parts = done.value().view(-1).split(sizes)
                for h, part in zip(held, parts):
                    h.flat.view(-1).copy_(part)
            except BaseException as exc:  # noqa: BLE001 - every held bucket fails with the exchange
                for h in held:
                    h.future.set_exception(exc)
                return
            for h in held:
                h.future.set_result(h.flat)

        fut.add_done_callback(counted(scatter))

    def _reduce_layout(self, flat: Tensor, key: StateKey, local: Tensor | None) -> Future:
        """:meth:`reduce`, or the saved layouts ``key`` is made of during the first iteration after a load."""
        saved = self._saved_layouts(key)
        if saved is None:
            return self.reduce(flat, key, local)
        if self._fusing(flat):  # a checkpoint of a warm-up step: its layouts, fused as the next step fuses them
            saved = fuse_layouts(saved, self.fuse_numel)
        futures = []
        for part in saved:
            arranged = rearrange(flat, key, part)
            arranged_local = None if local is None else torch.empty_like(arranged)
            futures.append(self.reduce(arranged, part, arranged_local))
            if local is not None:
                assert arranged_local is not None
                rearrange(arranged_local, part, key, out=local.view(-1))

        def write_back(done: list[Future]) -> Tensor:
            for part, fut in zip(saved, done):
                rearrange(fut.value(), part, key, out=flat.view(-1))
            return flat

        return then(torch.futures.collect_all(futures), write_back)

    def _saved_layouts(self, key: StateKey) -> list[StateKey] | None:
        """The saved layouts that make up ``key``'s parameters, in saved order (None: reduce ``key`` as it is)."""
        if not self._loaded or key in self._loaded:
            return None
        names, parts, covered = key.names(), [], set[str]()
        for saved in self._loaded:
            saved_names = saved.names()
            if saved_names <= names:
                parts.append(saved)
                covered |= saved_names
            elif saved_names & names:
                self._warn_resume(f"the resumed bucket {key} splits the saved layout {saved} (another bucket "
                                  "layout): its state is carried per parameter, exact, but this iteration's "
                                  "compression blocks and served chunks differ from an uninterrupted run's")
                return None
        return parts if covered == names else None

    def _check_resumed(self, params: Sequence[Tensor]) -> None:
        """Warn when the rank, the world size or this rank's parameters are not the ones saved (module doc).

        The rank and world size are checked on the first bucket after a load, each parameter on its first.
        """
        saved = self._resumed
        assert saved is not None
        problems = []
        if "world" in saved:
            rank, world = self.rank_world()
            saved_rank, saved_world = saved.pop("rank"), saved.pop("world")
            if saved_world != world:
                problems.append(f"it was saved by one of {saved_world} ranks, this run has {world} (the residuals "
                                "and served chunks belong to that world size)")
            elif saved_rank != rank:
                problems.append(f"it holds rank {saved_rank}'s momentum and residuals and rank {rank} loaded it "
                                "(save state_dict(), which gathers every rank's part, or each rank's own "
                                "local_state_dict())")
        replica: dict[str, int] = saved.setdefault("replica", {})
        differ = [name for name, p in ((self.names.name(p), p) for p in params)
                  if name in replica and replica.pop(name) != _checksum(p)]
        if not replica:
            self._resumed = None
        if differ:
            problems.append(f"{len(differ)} parameter(s) ({', '.join(differ[:4])}) differ from the replica this rank "
                            "saved: with the local correction every rank's parameters are its own; load each rank's "
                            "model after DDP(...) (its constructor broadcasts rank 0's parameters) or build DDP with "
                            "init_sync=False")
        if problems:
            self._warn_resume("; ".join(problems))

    @staticmethod
    def _warn_resume(problem: str) -> None:
        msg = f"CompressionState resumed from a checkpoint that does not continue this run exactly: {problem}"
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)

    def _apply_momentum(self, key: StateKey, x: Tensor, finite: bool, divide: int = 1) -> None:
        """``m = beta m + x``, then ``x = m / divide``; a non-finite ``x`` becomes ``(x + beta m) / divide`` and
        ``m`` stays."""
        m = self.momentum_buffers.buffer(key, x.view(-1))
        if finite:
            torch.add(x.view(-1), m, alpha=self.momentum, out=m)
            if divide == 1:
                x.view(-1).copy_(m)
            else:
                torch.div(m, divide, out=x.view(-1))
        else:
            x.view(-1).add_(m, alpha=self.momentum)
            if divide != 1:
                x.div_(divide)

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size) in the state's group; (0, 1) without a process group."""
        if not dist.is_available() or not dist.is_initialized():
            return 0, 1
        return dist.get_rank(self.process_group), dist.get_world_size(self.process_group)

    def _served(self, key: StateKey, numel: int, compressor: Compressor) -> tuple[StateKey | None, int, int]:
        """The chunk of ``key`` this rank serves under ``compressor`` (None unless two-phase), its start and count."""
        rank, world = self.rank_world()
        start, count = chunk_bounds(numel, world, chunk_granule(compressor))[rank]
        two_phase = compressor.pattern is Pattern.TWO_PHASE and not isinstance(compressor, NoneCompressor)
        return (key.serving(start, count) if two_phase and count else None), start, count

    def _corrector(self, key: StateKey, numel: int, compressor: Compressor,
                   retired: list[tuple[tuple[int, int], Tensor]] | None = None) -> Callable[[Tensor], Tensor]:
        """Called after ``compensate``: a function adding this rank's change of residuals to the average.

        ``avg + (e_new - e_old)`` for the worker residual, and, on the chunk
        this rank serves in the two-phase exchange, ``world * (s_new - s_old)``
        for the server residual: the mean over ranks of what they apply is
        then exactly the mean of the uncompressed inputs (module doc). A
        served chunk of this layout that ``compressor`` does not serve (``auto``
        moved the exchange to another pattern or granule, ``retired``: paid
        into this exchange by :meth:`_retire_chunks`) ends with ``world * (0 - s_old)``.
        """
        ef = self.error_feedback
        assert ef is not None, "local correction needs error feedback"
        world = self.rank_world()[1]
        served, start, count = self._served(key, numel, compressor)
        worker_old = _copy(ef.residual(key))
        server_old = _copy(ef.residual(served)) if served is not None else None
        ended = list(retired or [])

        def correct(average: Tensor) -> Tensor:
            flat = average.view(-1)
            _add_change(flat, ef.residual(key), worker_old, 1.0)
            if served is not None:
                _add_change(flat[start:start + count], ef.residual(served), server_old, float(world))
            for (begin, length), old in ended:
                _add_change(flat[begin:begin + length], None, old, float(world))
            return average

        return correct

    # -- checkpoints -------------------------------------------------------------
    def local_state_dict(self) -> dict[str, Any]:
        """This rank's part of the checkpoint (plain types; no collective): what it needs to go on exactly.

        For a file per rank; :meth:`state_dict` gathers every rank's part into one.
        """
        rank, world = self.rank_world()
        replica = {name: _checksum(t) for name, t in self.names.named()} if self.local_correction else {}
        return {
            "step": self.step,
            "momentum": self.momentum_buffers.state_dict(),
            "error_feedback": None if self.error_feedback is None else self.error_feedback.state_dict(),
            "compressor": self.compressor.state_dict(),
            "layouts": [k.as_plain() for k in (self._layouts or self._last_layouts)],
            "rank": rank,
            "world": world,
            "replica": replica,
            "run_steps": self._run_steps,
            **({"auto": self.auto.state_dict()} if self.auto is not None else {}),
        }

    def state_dict(self, timeout: float = GATHER_TIMEOUT) -> dict[str, Any]:
        """Every rank's part, gathered (``{"world": W, "ranks": [...]}``): a collective; save it on one rank.

        Call it between steps on every rank of the state's group (module doc,
        "Checkpoints"); :func:`~gradwire.exchange.checkpoint.gather_parts` says how.

        Raises:
            CheckpointError: not every rank called it within ``timeout`` seconds.
        """
        return gather_parts(self.local_state_dict(), self.process_group, "CompressionState.state_dict()", timeout)

    @staticmethod
    def merge_parts(parts: list[dict[str, Any]], rank: int) -> dict[str, Any]:
        """An approximate part for ``rank`` of a run of another world size (``checkpoint.own_part``).

        The mean of the saved ranks' momenta and worker residuals (the update
        carries their average); served chunks dropped (they belong to the
        saved world's chunking); everything else saved rank ``rank % W``'s.
        """
        base = dict(parts[rank % len(parts)])
        base["momentum"] = _mean_buffers([p["momentum"] for p in parts])
        if base["error_feedback"] is not None:
            base["error_feedback"] = _mean_buffers([p["error_feedback"] for p in parts])
        base["replica"] = {}
        return base

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's part of what :meth:`state_dict` (or :meth:`local_state_dict`) returned.

        The configuration is not part of it. On another world size the part
        is approximate (:meth:`merge_parts`) and a warning says what.

        Raises:
            ValueError: the checkpoint holds error feedback and this state has
                none, or the other way round.
        """
        rank, world = self.rank_world()
        state, problem = own_part(state, rank, world, self.merge_parts)
        if problem is not None:
            state = {**state, "rank": rank, "world": world}
            self._warn_resume(problem)
        if (state["error_feedback"] is None) != (self.error_feedback is None):
            raise ValueError(f"the checkpoint has error_feedback={'off' if state['error_feedback'] is None else 'on'}, "
                             f"this state {'off' if self.error_feedback is None else 'on'}: build the state as it was saved")
        self.step = int(state["step"])
        self.momentum_buffers.load_state_dict(state["momentum"])
        loaded = list(self.momentum_buffers.keys())
        if self.error_feedback is not None:
            self.error_feedback.load_state_dict(state["error_feedback"])
            loaded += [k for k in self.error_feedback.keys() if k.chunk is None]
        self.compressor.load_state_dict(state["compressor"])
        self.names = ParamNames()
        if state.get("layouts"):
            loaded = [StateKey.from_plain(k) for k in state["layouts"]]
        self._loaded = list(dict.fromkeys(loaded))
        self._layouts, self._last_layouts = {}, {}
        self._run_steps = 0
        self._rebuild_check = state.get("run_steps") == 1
        # saved after DDP's first iteration: its layouts are DDP's initial ones, which _rebuild_check judges
        self._layout_check = [] if self._rebuild_check or not state.get("layouts") else list(self._loaded)
        if self.auto is not None and state.get("auto"):
            self.auto.load_state_dict(state["auto"])
        resumed: dict[str, Any] = {k: state[k] for k in ("rank", "world") if k in state}
        resumed["replica"] = dict(state.get("replica") or {})
        self._resumed = resumed

    # -- pickling without the process group ----------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        skip = ("process_group", "sequencer", "names", "_loaded", "_layouts", "_last_layouts", "_resumed",
                "_run_steps", "_rebuild_check", "_layout_check", "_held", "auto", "_step_futures")
        return {s: getattr(self, s) for s in self.__slots__ if s not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self.process_group = None
        self.names = ParamNames()
        self.sequencer = Sequencer()
        self._loaded = []
        self._layouts, self._last_layouts = {}, {}
        self._resumed = None
        self._run_steps = 0
        self._rebuild_check = False
        self._layout_check = []
        self._held = []


def fuse_layouts(layouts: Sequence[StateKey], fuse_numel: int) -> list[StateKey]:
    """The keys the fusion rule makes of buckets arriving in this order (the last one ends the step).

    A bucket of ``fuse_numel`` or more with none held leaves alone; others
    are held until the held ones reach ``fuse_numel`` (a large bucket takes
    the held ones with it) or the step ends. Applied to keys that are fused
    already it returns them unchanged.
    """
    out: list[StateKey] = []
    held: list[StateKey] = []

    def flush() -> None:
        if held:
            out.append(StateKey(tuple(seg for k in held for seg in k.segments)))
            held.clear()

    for key in layouts:
        if not held and key.numel >= fuse_numel:
            out.append(key)
            continue
        held.append(key)
        if sum(k.numel for k in held) >= fuse_numel:
            flush()
    flush()
    return out


class _Held:
    """A bucket waiting to be fused: its tensor, key, local buffer and the future its caller holds."""

    __slots__ = ("flat", "key", "local", "future")

    def __init__(self, flat: Tensor, key: StateKey, local: Tensor | None) -> None:
        self.flat, self.key, self.local = flat, key, local
        self.future: Future = Future()

    def joins(self, other: Tensor) -> bool:
        """Whether ``other`` can be concatenated to this bucket (one dtype, one device)."""
        return other.dtype == self.flat.dtype and other.device == self.flat.device


def _settle(out: Future, fut: Future) -> None:
    """Complete ``out`` with ``fut``'s value or failure."""
    def done(f: Future) -> None:
        try:
            out.set_result(f.value())
        except BaseException as exc:  # noqa: BLE001 - forwarded to the waiter
            out.set_exception(exc)

    fut.add_done_callback(counted(done))


def _checksum(t: Tensor) -> int:
    """CRC-32 of a tensor's bytes (a copy on the CPU)."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    return zlib.crc32(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else 0


def _mean_buffers(stores: list[dict[str, Any]]) -> dict[str, Any]:
    """The element-wise mean of ``SegmentStore.state_dict()``\\ s' whole-key buffers (served chunks dropped)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for store in stores:
        for entry in store["buffers"]:
            if entry.get("chunk") is None:
                by_key.setdefault(repr(entry["segments"]), []).append(entry)
    return {"buffers": [{**entries[0], "value": mean_tensors([e["value"] for e in entries])}
                        for entries in by_key.values()]}


def _copy(residual: Tensor | None) -> Tensor | None:
    return None if residual is None else residual.clone()


def _add_change(out: Tensor, new: Tensor | None, old: Tensor | None, alpha: float) -> None:
    """``out += alpha * (new - old)``; a missing residual counts as zero."""
    if new is not None:
        out.add_(new.view(out.shape), alpha=alpha)
    if old is not None:
        out.sub_(old.view(out.shape), alpha=alpha)
