"""Training over a WAN: DiLoCo's outer optimisation, streamed in fragments, compressed, overlapped.

``diloco:H`` (Douillard et al., 2023, https://arxiv.org/abs/2311.08105): every
rank takes ``H`` steps of its own (inner) optimizer on its own data, with no
communication; then the ranks average the *outer gradient*, the change of
the parameters since the last round, and an outer optimizer applies it:

1. ``delta_i = anchor - x_i`` (the anchor is the last round's global model,
   the same on every rank);
2. ``g = mean_i(delta_i)``, through the exchange (a compressor with error
   feedback across rounds: ``int8+diloco:100``);
3. SGD with Nesterov momentum on the anchor: ``m = mu m + g``,
   ``anchor -= lr (g + mu m)`` (the paper's outer lr 0.7, momentum 0.9);
4. every rank continues from the new anchor; its inner optimizer keeps its
   state (AdamW's moments), as in the paper.

Every rank computes the same anchor and the same outer momentum from the
same average, so the replicas meet exactly at every round (the exchange
makes no local correction).

``streaming-diloco:H:fragments=F`` (Douillard et al., 2025, "Streaming
DiLoCo", https://arxiv.org/abs/2501.18512): the parameters are cut into ``F``
fragments of about equal size, each synchronised every ``H`` steps as above
but at staggered steps (fragment ``f`` at steps ``(f + 1) H / F + k H``), so a
round moves ``1 / F`` of the model and the peak bandwidth falls by about ``F``.

``overlap=T`` (either form): a fragment's average is launched at its round
and applied ``T`` inner steps later, while those steps run (what hides a WAN's
latency). The outer step then uses the average of the deltas at the launch,
and the rank keeps the progress it made meanwhile:
``x <- anchor_new + (x_now - x_at_launch)``. ``T`` must be less than the
steps between two rounds of any one fragment (``H``).

Traps:
- ``onebit`` is refused (and ``signum``, a vote): a sign-compressed outer
  gradient misses 60-70% of a round's change, and error feedback carries a
  residual as large as a whole round's change into later rounds, which start
  from another model; the error grows every round and the training diverges
  (``benchmarks/diloco_outer_compression.py``). A quantiser whose error is a
  few percent of a round (``int8``) keeps diloco's loss.
- The outer step is on the parameters; buffers (BatchNorm statistics) stay
  local, as in PyTorch's post-local SGD.
- ``finish`` runs one last round of every fragment (overlapped ones waited
  for), so that every rank ends on the same model; a script's own loop
  (``gradwire compare -- CMD``) has no place for it: its ranks end on their
  last local parameters, as under ``localsgd``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.futures import Future

from gradwire.exchange import CompressionState, Compressor, StateKey

from .averaging import _Averaging
from .base import Timing, flatten, unflatten_into

__all__ = ["DiLoCoStrategy", "StreamingDiLoCoStrategy", "fragment_bounds"]

#: the paper's outer optimizer
DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM = 0.7, 0.9
#: fragments of ``streaming-diloco`` unless given (at most H)
DEFAULT_FRAGMENTS = 4


def fragment_bounds(sizes: list[int], fragments: int) -> list[tuple[int, int]]:
    """Split tensors of ``sizes`` elements into ``fragments`` contiguous runs of about equal numel.

    Returns ``(first, last)`` tensor indices (``last`` exclusive) per fragment;
    every fragment holds at least one tensor.
    """
    if not 1 <= fragments <= len(sizes):
        raise ValueError(f"fragments must be from 1 to the number of parameter tensors ({len(sizes)}), "
                         f"got {fragments}")
    bounds: list[tuple[int, int]] = []
    total, first, acc = sum(sizes), 0, 0
    for i, n in enumerate(sizes):
        acc += n
        left_tensors, left_fragments = len(sizes) - i - 1, fragments - len(bounds) - 1
        if left_fragments == 0:
            continue
        if acc >= total * (len(bounds) + 1) / fragments or left_tensors == left_fragments:
            bounds.append((first, i + 1))
            first = i + 1
    bounds.append((first, len(sizes)))
    return bounds


@dataclass
class _Fragment:
    """One fragment's tensors, its anchor (the global model's share) and the outer momentum."""

    index: int
    params: list[nn.Parameter]
    anchor: Tensor
    momentum: Tensor
    #: the step at which this fragment's rounds fall, modulo H
    phase: int
    #: an outer average in flight: (x at launch, the future of mean(delta), the step it is applied at)
    pending: tuple[Tensor, Future, int] | None = None
    #: the step of this fragment's last round (the same on every rank)
    synced_at: int = 0

    @property
    def key(self) -> StateKey:
        return StateKey.of(f"fragment{self.index}", self.anchor.numel())


class DiLoCoStrategy(_Averaging):
    """Inner steps of the user's optimizer, an outer Nesterov step on the averaged parameter change (module doc).

    Args:
        H: inner steps between two rounds of a fragment.
        compressor: compresses the outer gradient (error feedback across rounds).
        momentum: the inner optimizer's momentum, for loops that build it (``optimizer_momentum``).
        lr, mu: the outer optimizer (SGD with Nesterov momentum ``mu``).
        overlap: inner steps an outer average may take to arrive (0: blocking).
        fragments: parameter fragments synchronised in turn (1: plain DiLoCo).
    """

    name = "diloco"
    timing = Timing.AVERAGE

    def __init__(self, H: int, compressor: str | Compressor | None = None, momentum: float = 0.9,  # noqa: N803
                 group: dist.ProcessGroup | None = None, lr: float = DEFAULT_OUTER_LR,
                 mu: float = DEFAULT_OUTER_MOMENTUM, overlap: int = 0, fragments: int = 1) -> None:
        super().__init__(H, compressor, momentum, group)
        self.outer_lr = float(lr)
        self.outer_momentum = float(mu)
        if not self.outer_lr > 0:
            raise ValueError(f"{self.name}: the outer lr must be > 0, got {lr}")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"{self.name}: the outer momentum must be in [0, 1), got {self.outer_momentum}")
        if not 0 <= overlap < H:
            raise ValueError(f"{self.name}: overlap must be from 0 to H - 1 = {H - 1} steps, got {overlap}")
        if fragments < 1 or fragments > H:
            raise ValueError(f"{self.name}: fragments must be from 1 to H = {H}, got {fragments}")
        self.overlap = overlap
        self.fragments = fragments
        self._parts: list[_Fragment] = []
        #: the simulated clock's tag of each fragment's round in flight (Strategy.background)
        self._tags: dict[int, Any] = {}
        #: outer rounds done, per fragment
        self.rounds = [0] * fragments

    @property
    def optimizer_momentum(self) -> float:
        return self.momentum

    def exchange_state(self, group: dist.ProcessGroup | None, momentum: float = 0.0) -> CompressionState:
        """The outer exchange compresses from its first round (unless the compressor says ``warmup=N``).

        The exchange's default warm-up of one uncompressed step is for DDP, which rebuilds its
        buckets after the first iteration; an outer round sends the same fragment every time, and
        with a handful of rounds to the target an uncompressed first one is a large share of the
        bytes (a fifth of them for five rounds).
        """
        state = super().exchange_state(group, momentum)
        state.warmup_iters = state.compressor.warmup
        return state

    def wrap(self, model: nn.Module) -> nn.Module:
        module = super().wrap(model)
        self._parts = []
        bounds = fragment_bounds([p.numel() for p in self.params], min(self.fragments, len(self.params)))
        for f, (a, b) in enumerate(bounds):
            params = self.params[a:b]
            anchor = flatten(params)
            phase = ((f + 1) * self.period // len(bounds)) % self.period
            self._parts.append(_Fragment(f, params, anchor, torch.zeros_like(anchor), phase))
        self.rounds = [0] * len(self._parts)
        return module

    def _outer(self, part: _Fragment, mean: Tensor) -> None:
        """SGD with Nesterov momentum on the anchor: ``m = mu m + g``, ``anchor -= lr (g + mu m)``."""
        mu = self.outer_momentum
        part.momentum.mul_(mu).add_(mean)
        step = mean.add(part.momentum, alpha=mu) if mu else mean
        part.anchor.sub_(step, alpha=self.outer_lr)
        self.rounds[part.index] += 1

    def _launch_part(self, part: _Fragment) -> tuple[Tensor, Future]:
        """The fragment's parameters now, and the future of the average of ``anchor - x``."""
        x = flatten(part.params)
        delta = part.anchor - x
        with self.background() as self._tags[part.index]:
            fut = self._exchange.reduce(delta, part.key)
        self.averages += 1
        return x, fut

    def _settle_part(self, part: _Fragment) -> None:
        """Apply the fragment's outer step; keep the inner progress made since its launch."""
        assert part.pending is not None
        at_launch, fut, _ = part.pending
        part.pending = None
        with self.waiting(self._tags.pop(part.index, None)):
            mean = fut.wait()
        self._outer(part, mean)
        with torch.no_grad():
            progress = flatten(part.params).sub_(at_launch)
            unflatten_into(progress.add_(part.anchor), part.params)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()
        self.steps += 1
        launched = False
        for part in self._parts:
            if part.pending is not None and self.steps >= part.pending[2]:
                self._settle_part(part)
            if self.steps % self.period == part.phase:
                if part.pending is not None:  # overlap >= rounds' spacing cannot happen (checked), but be exact
                    self._settle_part(part)
                x, fut = self._launch_part(part)
                part.pending = (x, fut, self.steps + self.overlap)
                part.synced_at = self.steps
                launched = True
                if self.overlap == 0:
                    self._settle_part(part)
        if launched:
            self._exchange.end_step()

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        """One last round of every fragment with inner steps since its last (module doc): every rank ends equal."""
        for part in self._parts:
            if part.pending is not None:
                self._settle_part(part)
            if part.synced_at < self.steps:  # inner steps since its last round (a count every rank shares)
                x, fut = self._launch_part(part)
                part.pending = (x, fut, self.steps)
                part.synced_at = self.steps
                self._settle_part(part)
        if self._parts:
            self._exchange.end_step()

    def in_flight(self) -> list[Future]:
        return [part.pending[1] for part in self._parts if part.pending is not None]

    def state_dict(self) -> dict[str, object]:
        """The anchors, the outer momentum, the rounds and the exchange's error feedback (none in flight)."""
        for part in self._parts:
            if part.pending is not None:
                self._settle_part(part)
        return {"steps": self.steps, "rounds": list(self.rounds), "averages": self.averages,
                "anchors": [p.anchor.clone() for p in self._parts],
                "momenta": [p.momentum.clone() for p in self._parts],
                "exchange": self._exchange.local_state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        anchors, momenta = state["anchors"], state["momenta"]
        assert isinstance(anchors, list) and isinstance(momenta, list)
        if len(anchors) != len(self._parts):
            raise ValueError(f"{self.name}: the state holds {len(anchors)} fragments, this strategy "
                             f"{len(self._parts)} (call wrap() on the same model first)")
        for part, anchor, momentum in zip(self._parts, anchors, momenta):
            part.anchor.copy_(anchor)
            part.momentum.copy_(momentum)
            part.pending = None
        self.steps = int(state["steps"])  # type: ignore[call-overload]
        self.rounds = [int(r) for r in state["rounds"]]  # type: ignore[attr-defined]
        self.averages = int(state["averages"])  # type: ignore[call-overload]
        self._exchange.load_state_dict(state["exchange"])  # type: ignore[arg-type]

    @classmethod
    def average_schedule(cls, params: Mapping[str, float]) -> tuple[int, int, bool]:
        default = 1 if cls is DiLoCoStrategy else min(DEFAULT_FRAGMENTS, int(params["H"]))
        fragments = int(params.get("fragments", default))
        return max(1, int(params["H"]) // fragments), fragments, params.get("overlap", 0) > 0


class StreamingDiLoCoStrategy(DiLoCoStrategy):
    """``streaming-diloco:H:fragments=F``: DiLoCo with F fragments synchronised in turn (module doc)."""

    name = "streaming-diloco"

    def __init__(self, H: int, compressor: str | Compressor | None = None, momentum: float = 0.9,  # noqa: N803
                 group: dist.ProcessGroup | None = None, lr: float = DEFAULT_OUTER_LR,
                 mu: float = DEFAULT_OUTER_MOMENTUM, overlap: int = 0, fragments: int | None = None) -> None:
        super().__init__(H, compressor, momentum, group, lr, mu, overlap,
                         min(DEFAULT_FRAGMENTS, H) if fragments is None else fragments)
