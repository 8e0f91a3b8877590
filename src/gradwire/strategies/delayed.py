"""``delayed``: apply the fresh local gradient now, swap in its average one step later.

The exchange of step t's gradients overlaps all of step t+1's compute:

1. ``wrap`` puts the model in DDP with :func:`delayed_hook`. For each bucket,
   as soon as backward produces it, the hook copies it (``v``: the local
   gradient; with a compressor, the local momentum ``m = beta m + g``),
   launches the (compressed) average of the copy in the background and
   returns the bucket itself as an already completed future: DDP's
   ``backward()`` never waits.
2. ``step`` at step t (after backward) waits for step t-1's averages, which
   had a whole forward+backward to arrive, and applies

       u_t = v_t + (avg_{t-1} - v_{t-1})

   i.e. this rank's fresh vector at once, and one step later its replacement
   by the average. Step 0 applies ``v_0``.
   DDP runs with ``gradient_as_bucket_view``: the gradients are views of its
   buckets, so ``u_t`` is written flat into each bucket (two passes) instead
   of a copy and an add per parameter. The step after DDP rebuilt its buckets
   (once, at step 1) pairs buckets of different layouts and goes through each
   parameter's ``.grad`` instead (``per_parameter_steps`` counts those).
3. ``finish`` applies the last correction ``avg_T - v_T`` and averages the
   parameters exactly, so every rank ends with the same model.

Why this form (stability). Applying the stale average alone (``delayed:naive``:
``u_t = avg_{t-1}``, step 0 skipped) delays the curvature feedback by a step.
On a quadratic with curvature h, heavy-ball momentum b with delay 1 gives
``x_{t+1} = (1+b) x_t - (b + lr*h) x_{t-1}``, stable only while
``b + lr*h < 1`` against ``lr*h < 2 (1 + b)`` without delay: with b = 0.9 the
stable learning rates shrink 38 times (``benchmarks/overlap_strategies.py``
trains both). In ``u_t`` the gradient at the current
parameters enters undelayed, so the curvature feedback is sync's; the stale
part ``avg_{t-1} - v_{t-1}`` is only the difference between the ranks (zero
when every rank sees the same data, which makes this exactly synchronous
momentum SGD). What a rank has applied telescopes:

    sum_{s<=t} u_s = sum_{s<t} avg_s + v_t

every rank has applied the same sum of averages plus its own latest vector,
so the ranks differ by ``lr * (v_t^i - mean_j v_t^j)`` (through the
optimizer's momentum when it has one): bounded, never accumulating.

With a compressor (``onebit+delayed``). Error feedback in front of the
optimizer's momentum fails (:mod:`gradwire.exchange.state`), so, as in ``sync``,
the exchange's :class:`~gradwire.exchange.CompressionState` keeps the momentum
(``v = m``), compresses ``m`` with error feedback, and the optimizer runs
without momentum. The telescoping sum still
holds with ``avg_s`` the decompressed average: the model follows the
error-compensated compressed momentum SGD of ``sync`` plus the local ``m_t``,
and the compression error of the average reaches each update once, as the
residual difference ``e_{t-2} - e_{t-1}`` (exactly as in ``sync``, one step
later). A vote (``signum``) is not an average of ``v`` and is refused, except
by ``delayed:naive``.

Clipping (a script's ``clip_grad_norm_`` or ``clip_grad_value_`` between
backward and step, :meth:`DelayedStrategy.clipped`). ``.grad`` holds ``v_t``,
which the script clips to ``f(v_t)``; the step applies
``f(v_t) + f(avg_{t-1}) - f(v_{t-1})``: the average is clipped with the
script's own threshold, over every bucket, as sync clips an average, when
it is applied. The sum telescopes to ``sum_{s<t} f(avg_s) + f(v_t)``: every
rank applies the same clipped averages (sync's, a step late) plus its own
latest clipped vector. With a compressor the exchange then carries the
gradient (the optimizer is the script's, :mod:`gradwire.compare.inject`),
so ``v_t`` is the gradient there too. A resume does not know the clip of the
step before it: the first step after :meth:`load_state_dict` applies what
was saved as it was saved (clipped when saved after a clipped step).

Checkpoints: :meth:`DelayedStrategy.state_dict` waits for the averages in
flight and saves what each parameter is still owed (``avg_{t-1} - v_{t-1}``)
with the exchange's state (momentum, residuals); the first step after
:meth:`DelayedStrategy.load_state_dict` applies it per parameter, so a
resume continues exactly.

Exposure. The exchange runs on a process group of its own (same ranks, same
network spec): a two-phase compressor issues its second collective from a
callback, and on DDP's group that could interleave with DDP's own collectives
(the bucket rebuild's broadcast in the second forward) in a different order on
each rank. Waiting for ``avg_{t-1}`` happens in :meth:`DelayedStrategy.step`,
through :meth:`Strategy.waiting`.
"""
# No ``from __future__ import annotations``: register_comm_hook checks the
# hook's annotations against the real dist.GradBucket and Future[Tensor].
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire.exchange import CompressionState, StateKey

from gradwire.exchange.state import warmup_steps

from .base import CannotApply, DDPAttachment, ExchangeTraits, Strategy, Timing, average_parameters, group_timeout
from .clipping import GradientClip

__all__ = ["DelayedStrategy"]

#: bucket size of ``delayed``: small enough that the digits CNN's classifier
#: (most of its bytes) starts travelling before the convolutions' backward
DEFAULT_BUCKET_CAP_MB = 0.05
#: with a compressor the bytes are few and every bucket pays a compression
#: round's fixed cost (chunking, packing, two collectives): DDP's own default
COMPRESSED_BUCKET_CAP_MB = 25.0

#: what a step still owes each bucket's parameters: (the bucket's key, ``avg``, ``v``), laid out as the key;
#: applied as ``(g + avg) - v`` (naive: ``avg``), the order of the flat update, so that the two agree bit for bit
Owed = List[Tuple[StateKey, Tensor, Tensor]]


class _Launch:
    """One bucket of one step: its key and parameters (bucket order), DDP's bucket, local vector ``v``, average in flight."""

    __slots__ = ("key", "params", "bucket", "local", "future", "tag")

    def __init__(self, key: StateKey, params: List[Tensor], bucket: Tensor, local: Tensor, future: Future,
                 tag: Any = None) -> None:
        self.key, self.params, self.bucket, self.local, self.future = key, params, bucket, local, future
        #: where the simulated clock observes the average (Strategy.background)
        self.tag = tag

    def grads_are_bucket(self) -> bool:
        """Whether the parameters' ``.grad`` are views of the bucket (DDP's ``gradient_as_bucket_view``)."""
        first, last = self.params[0].grad, self.params[-1].grad
        if first is None or last is None:
            return False
        end = self.bucket.data_ptr() + (self.bucket.numel() - last.numel()) * self.bucket.element_size()
        return first.data_ptr() == self.bucket.data_ptr() and last.data_ptr() == end


def delayed_hook(strategy: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Launch the bucket's average in the background; hand DDP the local gradient at once."""
    buf = bucket.buffer()
    strategy.launch_bucket(buf, bucket.parameters(), last=bucket.is_last())
    fut: Future = Future()
    fut.set_result(buf)
    return fut


class DelayedStrategy(Strategy):
    """Apply ``v_t + avg_{t-1} - v_{t-1}``; each bucket's average overlaps the next step.

    Args:
        compressor: None, or a compressor (the exchange then owns the momentum).
        momentum: heavy-ball momentum (the optimizer's, or the exchange's with a compressor).
        group: process group (None: default); the exchange runs on a new group of its ranks.
        naive: apply the stale average alone (``u_t = avg_{t-1}``), for comparison.
        bucket_cap_mb: DDP's bucket size (default: :data:`DEFAULT_BUCKET_CAP_MB`,
            or :data:`COMPRESSED_BUCKET_CAP_MB` with a compressor).
    """

    name = "delayed"
    timing = Timing.NEXT_STEP
    #: the step writes u_t flat into the buckets
    ddp_arguments = {"gradient_as_bucket_view": True}

    def __init__(self, compressor: Optional[Any] = None, momentum: float = 0.9,
                 group: Optional[dist.ProcessGroup] = None, naive: int = 0,
                 bucket_cap_mb: Optional[float] = None) -> None:
        super().__init__(compressor, momentum, group)
        self.naive = bool(naive)
        if bucket_cap_mb is None:
            bucket_cap_mb = DEFAULT_BUCKET_CAP_MB if self.compressor is None else COMPRESSED_BUCKET_CAP_MB
        self.bucket_cap_mb = bucket_cap_mb
        #: the process group the averages travel on (created by ``wrap``)
        self.comm_group: Optional[dist.ProcessGroup] = None
        #: the exchange (created by ``wrap``); with a compressor it holds the momentum
        self.exchange: Optional[CompressionState] = None
        self._launches: List[_Launch] = []
        #: per bucket layout, two spent buffers (local vector, the one sent) for the next launch:
        #: a fresh bucket-sized tensor per step costs glibc's new pages (page faults), not a copy
        self._spare: Dict[StateKey, Tuple[Tensor, Tensor]] = {}
        self._previous: Optional[List[_Launch]] = None
        #: what the first step after load_state_dict applies per parameter
        self._owed: Optional[Owed] = None
        #: optimizer steps skipped (``naive``: step 0 has nothing to apply)
        self.skipped = 0
        #: steps applied through each parameter's ``.grad`` rather than flat on the buckets: the
        #: step after DDP rebuilt its buckets (once, at step 1), the first step after a resume,
        #: or every step if the gradients stopped being views of the buckets
        self.per_parameter_steps = 0
        #: how the script clipped this step's ``.grad`` (:meth:`clipped`), and last step's
        self._clip: Optional[GradientClip] = None
        self._previous_clip: Optional[GradientClip] = None
        #: the first step's buckets wait for :meth:`release_first` or :meth:`drop_first` instead of launching
        #: (set by ``gradwire compare``'s injection when a clip may hand the step to another exchange)
        self.hold_first = False
        self._held: List[Tuple[Tensor, List[Tensor], bool]] = []

    @classmethod
    def exchange_traits(cls, params: Mapping[str, float], compressor: Optional[str]) -> ExchangeTraits:
        """Its exchange, DDP's bucket size for it, and its own passes over each bucket.

        Outside the hook (which copies the bucket it sends and this rank's vector ``v``), the step
        makes two passes over each bucket: it adds the average and subtracts last step's ``v``.
        """
        cap = DEFAULT_BUCKET_CAP_MB if compressor is None else COMPRESSED_BUCKET_CAP_MB
        return ExchangeTraits(compressor, cap, warmup_steps(compressor), copies=2)

    def wrap(self, model: nn.Module) -> nn.Module:
        # gradients as views of DDP's buckets: the step writes u_t into each bucket in two flat
        # passes instead of a copy per parameter (rank 0's weights everywhere, as DDP does)
        ddp = DDP(model, process_group=self.group, bucket_cap_mb=self.bucket_cap_mb, gradient_as_bucket_view=True)
        return self.adopt(ddp)

    def adopt(self, ddp: DDP, register_hook: bool = True) -> DDP:
        """Run the strategy on a DDP built elsewhere (a script's own; best with ``gradient_as_bucket_view=True``).

        Without gradient views every step goes through each parameter's
        ``.grad`` (``per_parameter_steps``); the exchange runs on a new group
        of ``self.group``'s ranks, which should be the DDP's process group.
        ``register_hook=False``: the caller registers a hook that ends in
        :func:`delayed_hook` (with this strategy as its state) itself.
        """
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
        self.comm_group = dist.new_group(ranks, timeout=group_timeout(self.group))
        state = self.exchange_state(self.comm_group, momentum=self.momentum if self.compressor is not None else 0.0)
        if self.exchange is not None:  # restored before wrap: keep what load_state_dict put there
            state.load_state_dict(self.exchange.local_state_dict())
        self.exchange = state
        if register_hook:
            ddp.register_comm_hook(self, delayed_hook)
        return ddp

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        if self.naive:
            raise CannotApply("delayed:naive skips the first optimizer step, which gradwire cannot do to the "
                              "script's own loop; use delayed")
        self.adopt(ddp, register_hook=False)
        return DDPAttachment(delayed_hook, self, "the local vector now, its average one step later")

    def scheme_exchange(self) -> Optional[CompressionState]:
        return self.exchange

    def grads_read(self, scheme: bool) -> None:
        """``.grad`` holds this rank's gradient ``v_t``, the part of the update applied now (module doc)."""
        super().grads_read(scheme)

    def clipped(self, clip: GradientClip) -> None:
        """Keep the clip for this step: ``v_t`` stays clipped, and ``avg_t`` is clipped alike when applied."""
        self._clip = clip

    def grad_scaler(self, scheme: bool) -> None:
        raise CannotApply("a GradScaler unscales .grad inside its step, after delayed combined this step's scaled "
                          "vector with the last step's average; use bf16 autocast without a scaler, or sync")

    def in_flight(self) -> List[Future]:
        return [launch.future for launch in (self._previous or []) + self._launches]

    def launch_bucket(self, grad: Tensor, params: Sequence[Tensor], last: bool = True) -> None:
        """Record the bucket's local vector and launch its average (called by the hook).

        ``last``: the step's last bucket (smaller ones before it may wait to be fused with it).
        """
        assert self.exchange is not None, "call wrap() first"
        params = list(params)
        if self.hold_first and self.steps == 0:
            self._held.append((grad, params, last))
            return
        numel = sum(p.numel() for p in params)
        if numel != grad.numel():
            raise RuntimeError(f"delayed: bucket of {grad.numel()} elements holds parameters of {numel}; "
                               "DDP's bucket layout is not what the strategy expects")
        key = self.exchange.names.key(params)
        spare = self._spare.pop(key, None)
        local, sent = spare if spare is not None else (torch.empty_like(grad), torch.empty_like(grad))
        # DDP reuses the bucket buffer next step: send a copy; the exchange's momentum (with a
        # compressor) turns it into m and writes this rank's vector v into ``local``
        with self.background() as tag:
            _, fut = self.exchange.reduce_params(sent.copy_(grad), params, local=local, key=key, last=last)
        self._launches.append(_Launch(key, params, grad, local, fut, tag))

    def release_first(self) -> None:
        """Launch the first step's held buckets now (before anything changes ``.grad``); stop holding."""
        self.hold_first = False
        held, self._held = self._held, []
        for grad, params, last in held:
            self.launch_bucket(grad, params, last)

    def drop_first(self) -> None:
        """Forget the first step's held buckets: another exchange takes this step over; stop holding.

        Holding them rather than launching and dropping the exchange saves the
        first step's average on the wire (an uncompressed warm-up one with a
        compressor, the size of every gradient).
        """
        self.hold_first, self._held = False, []

    def _owed_by(self, launches: List[_Launch], clip: Optional[GradientClip] = None) -> Owed:
        """Wait for a step's averages (exposed communication), clipped as ``clip`` says: what each bucket is owed."""
        averages = self._wait(launches)
        if clip is not None:
            clip.apply_(averages)
        return [(launch.key, avg, launch.local) for launch, avg in zip(launches, averages)]

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.release_first()
        if not self._launches:
            raise RuntimeError("delayed: backward() launched no bucket; call forward on the module wrap() returned")
        assert self.exchange is not None
        launches, self._launches = self._launches, []
        previous, self._previous = self._previous, launches
        owed, self._owed = self._owed, None
        clip, self._clip = self._clip, None
        previous_clip, self._previous_clip = self._previous_clip, clip
        self.steps += 1
        self.exchange.end_step()
        if previous is None and owed is None and self.naive:
            self.skipped += 1
            return
        flat = owed is None and all(launch.grads_are_bucket() for launch in launches) and (
            previous is None or [p.key for p in previous] == [launch.key for launch in launches])
        if not flat:  # DDP rebuilt its buckets since the last step (once, early), a resume, or grads are not views
            self.per_parameter_steps += 1
            self._step_per_parameter(launches, owed if previous is None else self._owed_by(previous, previous_clip),
                                     clip)
        else:
            averages: List[Optional[Tensor]] = [None] * len(launches)
            if previous is not None:
                waited = self._wait(previous)
                if previous_clip is not None:  # the average of clipped vectors is clipped as sync clips it
                    previous_clip.apply_(waited)
                averages = list(waited)
            for launch, prev, avg in zip(launches, previous or launches, averages):
                u = launch.bucket  # the gradients; holds this rank's g_t (as the script clipped it)
                if clip is not None:  # this rank's vector, as the script clipped it, is what a step later takes back
                    launch.local.copy_(u)
                if self.naive:
                    assert avg is not None  # naive skips the first step
                    u.copy_(avg)
                elif avg is None:
                    if self.compressor is not None and clip is None:
                        u.copy_(launch.local)
                elif self.compressor is not None and clip is None:  # u = m_t + avg_{t-1} - m_{t-1}
                    torch.add(launch.local, avg, out=u).sub_(prev.local)
                else:  # u = g_t + avg_{t-1} - g_{t-1}
                    u.add_(avg).sub_(prev.local)
                if avg is not None:  # step t-1's vectors are spent: step t+1 writes into them
                    self._spare[prev.key] = (prev.local, avg)
        optimizer.step()

    def _wait(self, launches: List[_Launch]) -> List[Tensor]:
        with self.waiting(*(launch.tag for launch in launches)):
            return [launch.future.wait() for launch in launches]

    def _step_per_parameter(self, launches: List[_Launch], owed: Optional[Owed],
                            clip: Optional[GradientClip] = None) -> None:
        """``step`` through each parameter's ``.grad``, for any bucket layout."""
        grads = self.grads()
        if self.naive:
            for g in grads:
                g.zero_()  # the owed average replaces them
        elif clip is not None:  # .grad holds v_t as the script clipped it: what a step later takes back
            for launch in launches:
                launch.local.copy_(torch.cat([p.grad.reshape(-1) for p in launch.params if p.grad is not None]))
        elif self.compressor is not None:  # the local vector is the exchange's momentum, not the gradient
            for launch in launches:
                _copy_to_grads(launch.local, launch.params)
        # else: DDP left this rank's gradient (= v_t) in .grad
        if owed is not None:
            self._apply(owed, launches)

    def _apply(self, owed: Owed, launches: List[_Launch]) -> None:
        """Add what each parameter is owed to its ``.grad`` (by the parameters' names)."""
        assert self.exchange is not None
        by_name = {self.exchange.names.name(p): p for launch in launches for p in launch.params}
        for key, avg, local in owed:
            offset = 0
            for name, numel in key.segments:
                p = by_name.get(name)
                if p is None:
                    raise RuntimeError(f"delayed: the average owed to parameter {name} has no parameter to go to; "
                                       "resume into the same model (and DDP) the state was saved from")
                assert p.grad is not None  # grads() made every gradient
                grad = p.grad.view(-1)
                if self.naive:
                    grad.copy_(avg[offset:offset + numel])
                else:
                    grad.add_(avg[offset:offset + numel]).sub_(local[offset:offset + numel])
                offset += numel

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        if self._previous is None:
            return
        launches, self._previous = self._previous, None
        for g in self.grads():
            g.zero_()
        clip, self._previous_clip = self._previous_clip, None
        self._apply(self._owed_by(launches, clip), launches)
        optimizer.step()
        # Every rank has now applied the same sum of averages; the optimizer's
        # momentum (and rounding) still leave them a little apart.
        average_parameters(self.params, self.group)

    # -- checkpoints -------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The exchange's state and what the next step owes each parameter (waits for the averages in flight).

        Save it together with the model and the optimizer after ``step``;
        plain types only (``torch.load(weights_only=True)`` reads it).
        """
        if self.exchange is None:
            raise RuntimeError("delayed: state_dict() needs wrap() first")
        owed = self._owed if self._previous is None else self._owed_by(self._previous, self._previous_clip)
        if self._previous is not None:  # keep the waited (and clipped) averages for the step that applies them
            self._owed, self._previous, self._previous_clip = owed, None, None
        return {
            "steps": self.steps,
            "skipped": self.skipped,
            "exchange": self.exchange.local_state_dict(),
            "owed": [{**key.as_plain(), "average": avg.clone(), "local": local.clone()} for key, avg, local in owed or []],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, before or after ``wrap``."""
        if self.exchange is None:
            self.exchange = self.exchange_state(None, momentum=self.momentum if self.compressor is not None else 0.0)
        self.exchange.load_state_dict(state["exchange"])
        self.steps = int(state["steps"])
        self.skipped = int(state["skipped"])
        self._owed = [(StateKey.from_plain(e), e["average"].clone(), e["local"].clone()) for e in state["owed"]] or None
        self._previous = None


def _copy_to_grads(flat: Tensor, params: Sequence[Tensor]) -> None:
    """Write consecutive slices of ``flat`` into the parameters' ``.grad``."""
    offset = 0
    for p in params:
        assert p.grad is not None  # grads() made every gradient
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
