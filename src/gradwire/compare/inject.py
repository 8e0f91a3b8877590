"""Apply a strategy to the DDP model and the optimizer of an unchanged script.

``gradwire compare -- CMD`` runs the user's own training under every
strategy. In each rank of that job, :func:`install` (called by the profile's
bootstrap when the script initialises its process group) patches
``DistributedDataParallel.__init__`` so that the strategy is applied where the
script builds its DDP model, and hooks the optimizer that owns the DDP's
parameters. This module lives with ``compare`` because its one user is
compare's child process (:mod:`gradwire.compare.child`); it only asks the
strategies (:mod:`gradwire.strategies`) how they go on a DDP. Where each
strategy goes:

=============================  ===============================  ==================================
strategy                       at ``DDP(...)``                  at each ``optimizer.step()``
=============================  ===============================  ==================================
sync                           nothing (the script as written)  the optimizer's own step
torch-fp16, torch-powersgd:R   PyTorch's comm hook              the optimizer's own step
C (sync with a compressor)     gradwire's compression hook      the optimizer scheme's step
delayed, C+delayed             ``gradient_as_bucket_view``,     ``strategy.step``, which ends in
                               delayed's hook                   the optimizer's (or scheme's) step
localsgd:H, async-average:H    a no-op hook: gradients stay     the optimizer's step, then the
(with or without C)            local                            strategy's parameter averaging
handler, C+handler             DDP's reducer off; the           ``synchronize()``, then the
                               handler's autograd hooks         optimizer's (or scheme's) step
                               average
=============================  ===============================  ==================================

With a compressor on gradients (C, C+delayed) the exchange owns the momentum:
at the DDP's first forward the optimizer that holds its parameters is found
(every ``torch.optim`` optimizer made after ``init_process_group`` is
registered; earlier ones are found by a scan of live objects) and split with
:func:`gradwire.exchange.schemes.scheme_for` (SGD: momentum and L2 decay move into
the exchange; Adam/AdamW: full-precision warm-up, then frozen variance and
the momentum compressed). The other strategies leave the optimizer as it is.

Each strategy class says how it goes on a script's DDP
(:meth:`~gradwire.strategies.base.Strategy.attach_ddp`), whether it owns the
step, and what it does when the script reads ``.grad``, scales the loss or
accumulates; this module only asks. Every strategy but ``sync`` runs its
collectives on a group of its own (:meth:`Strategy.dedicated_group`), so that
DDP's own collectives (``find_unused_parameters``' map, ``broadcast_buffers``)
and a two-phase exchange can never be paired differently on the ranks.

Refusals. A strategy that cannot be applied to the script is never run half
way: :class:`StrategyRefused` is raised where the script reaches the point
that cannot work, with the reason: a second DDP or optimizer, an optimizer no
scheme runs, no optimizer at the first forward, a comm hook of the script's
own, LBFGS (several closure calls per step) under a strategy that owns the
step, gradient clipping that starts after the exchange took over the
optimizer's momentum (clipping from the first step gives the optimizer back,
or, for an Adam clipped by norm, hands it to ``LocalMomentsAdam``,
:meth:`Injection.grads_read`; ``delayed`` clips each average as it applies
it, :meth:`Injection.clipped`), a
``GradScaler`` where the exchange or the ranks' step decisions would mix
scales, ``no_sync()`` under ``handler``, SGD's weight decay under a
compressing ``handler``. A script that steps an optimizer before it ever
builds a DDP raises :class:`StrategyNotApplied` at that first step, so no run
of the baseline is passed off as the strategy. ``sync`` never refuses: it is
the script as written, DDP or not.

Closures. ``optimizer.step(closure)`` (Lightning's automatic optimization)
runs forward and backward inside the step. The step is taken over when the
optimizer is made (or at the first forward, for one made before the DDP), so
the first step already runs the closure first and then the strategy, as the
plain loop would (tests/compare/test_inject_stacks.py checks bit for bit).

How the optimizer's step is replaced. The owner's ``step`` becomes an
instance attribute (a bound method, so an LR scheduler made later wraps it as
it wraps any step; one made earlier keeps working: its ``_opt_called`` mark is
set). It calls the strategy's step or the scheme's, and otherwise the step
that was there before.

Traps:
- ``finish`` of a strategy (the last average of ``delayed``, the exact
  parameter average of ``localsgd``) has no place in a script's own loop: the
  ranks end with their last local differences; :meth:`Injection.close` only
  waits for the averages still in flight, before the process group goes.
- The checks of ``.grad`` readers patch ``clip_grad._get_total_norm`` (what
  ``clip_grad_norm_`` calls, however it was imported), ``_clip_grads_with_norm_``
  (the threshold), ``clip_grad_value_`` and ``GradScaler.unscale_``; a
  hand-written clipping loop over ``p.grad`` is not seen.
"""
# No ``from __future__ import annotations``: register_comm_hook checks the
# hook's annotations against the real dist.GradBucket and Future[Tensor].
import gc
import inspect
import logging
import types
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.hooks import RemovableHandle

from gradwire.exchange.chooser import live_choosers
from gradwire.exchange.futures import completed
from gradwire.exchange.local_moments import LocalMomentsAdam
from gradwire.exchange import CompressionState
from gradwire.exchange.schemes import (DEFAULT_ADAM_WARMUP, FrozenVarianceAdam, OptimizerScheme, UnsupportedOptimizer,
                                       check_optimizer, scheme_for)

from gradwire.strategies.base import CannotApply, Strategy, making_strategy_optimizer
from gradwire.strategies.clipping import GradientClip
from gradwire.strategies.delayed import DelayedStrategy
from gradwire.strategies.registry import StrategyChoice, parse_strategy

__all__ = ["Injection", "StrategyNotApplied", "StrategyRefused", "install", "uninstall"]

log = logging.getLogger(__name__)


class StrategyRefused(RuntimeError):
    """The strategy cannot be applied to this script; the message says why."""


class StrategyNotApplied(RuntimeError):
    """The script trained without building a DDP model, so the strategy had nothing to apply to."""


#: bits per element an ``auto`` candidate keeps under a script's own optimizer (``AutoChooser.restrict``)
RELEASED_MIN_BITS = 8.0

#: what :attr:`Injection.status` says
WAITING, APPLIED, REFUSED, NOT_APPLIED = "waiting for DDP", "applied", "refused", "not applied"


class _Hook:
    """State of :func:`_injected_hook`: the scheme's bucket preparation, then the strategy's own hook."""

    __slots__ = ("hook", "state", "scheme", "local_first")

    def __init__(self, hook: Callable[[Any, dist.GradBucket], torch.futures.Future], state: Any) -> None:
        self.hook = hook
        self.state = state
        self.scheme: Optional[OptimizerScheme] = None
        #: the first step's buckets stay local until the script shows whether it clips (Injection.grads_read)
        self.local_first = False


def _injected_hook(injected: _Hook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The strategy's hook, after the scheme's :meth:`~OptimizerScheme.prepare` (SGD's decay).

    A scheme that exchanges in its step (:class:`LocalMomentsAdam`) gets each rank's own bucket back.
    """
    if injected.scheme is not None:
        if injected.local_first or getattr(injected.scheme, "local_gradients", False):
            return completed(bucket.buffer())
        injected.scheme.prepare(bucket.buffer(), bucket.parameters())
    return injected.hook(injected.state, bucket)


class _StepProxy:
    """What a strategy's ``step(optimizer)`` calls ``optimizer.step()`` on: the step the injection chose."""

    def __init__(self, step: Callable[..., Any], args: tuple, kwargs: Dict[str, Any]) -> None:
        self._step, self._args, self._kwargs = step, args, kwargs
        self.result: Any = None

    def step(self) -> Any:
        self.result = self._step(*self._args, **self._kwargs)
        return self.result


class Injection:
    """One strategy applied to one script's DDP model and optimizer (see the module doc).

    Args:
        choice: the strategy, e.g. ``"onebit+delayed"``.
        adam_warmup: optimizer steps of full-precision Adam before the variance freezes.
        on_status: called with this injection whenever its status changes (the
            compare child writes it to disk at once, before a refusal is raised).
    """

    def __init__(self, choice: "str | StrategyChoice", adam_warmup: int = DEFAULT_ADAM_WARMUP,
                 on_status: Optional[Callable[["Injection"], None]] = None) -> None:
        self.choice = parse_strategy(choice)
        self.adam_warmup = int(adam_warmup)
        self.on_status = on_status
        self.status = WAITING
        self.reason = ""
        #: what was applied, in words (for the comparison's table)
        self.description = ""
        self.strategy: Optional[Strategy] = None
        self.scheme: Optional[OptimizerScheme] = None
        self.optimizer_name: Optional[str] = None
        self._ddp: Optional["weakref.ref[DDP]"] = None
        self._hook: Optional[_Hook] = None
        self._owner: Optional["weakref.ref[torch.optim.Optimizer]"] = None
        self._resolved = False
        #: the optimizer whose step this injection took over, and the step it replaced
        self._step_owner: Optional["weakref.ref[torch.optim.Optimizer]"] = None
        self._real_step: Callable[..., Any] = _no_step
        #: called after every step of the owning optimizer, and before every DDP forward
        self.step_listeners: List[Callable[[], None]] = []
        self.forward_listeners: List[Callable[[], None]] = []

    # -- status ------------------------------------------------------------------
    @property
    def is_sync(self) -> bool:
        """Whether the choice is plain ``sync``: the script as written."""
        return self.choice.compressor is None and self.choice.spec.name == "sync"

    def _set(self, status: str, reason: str = "") -> None:
        self.status, self.reason = status, reason
        if self.on_status is not None:
            self.on_status(self)

    def refuse(self, reason: str) -> StrategyRefused:
        """Record the refusal and return the exception to raise."""
        self._set(REFUSED, reason)
        return StrategyRefused(f"gradwire: strategy {self.choice} refused: {reason}")

    def record(self) -> Dict[str, Any]:
        """What was applied, in plain types."""
        auto = [c.summary() for c in live_choosers()]
        short = "optimizer as written" if self.scheme is None else self.scheme.short()
        return {"strategy": str(self.choice), "status": self.status, "reason": self.reason,
                "description": self.description, "optimizer": self.optimizer_name,
                "scheme": None if self.scheme is None else self.scheme.describe(),
                "short": "; ".join([short] + [a["describe"] for a in auto]),
                "ddp": self._ddp is not None, "auto": auto}

    # -- at DDP(...) ----------------------------------------------------------------
    def ddp_arguments(self, arguments: Dict[str, Any]) -> None:
        """Change DDP's constructor arguments (bound by name) before it runs; refuse a second DDP."""
        if self._ddp is not None and not self.is_sync:
            raise self.refuse("the script builds a second DistributedDataParallel; gradwire applies a strategy "
                              "to one DDP model per process")
        if not self.is_sync:
            arguments.update(self.choice.entry.cls.ddp_arguments)

    def adopt(self, ddp: DDP) -> None:
        """Apply the strategy to ``ddp`` (just built by the script)."""
        first = self._ddp is None
        self._ddp = weakref.ref(ddp)
        if not first:  # sync: a second DDP is the script's business
            return
        ddp.register_forward_pre_hook(self._before_forward)
        made = next((o for o in _registry if self.owns(p for g in o.param_groups for p in g["params"])), None)
        if made is not None:  # an optimizer made before the DDP: its first step may run the first forward
            self._take_step(made)
        if self.is_sync:
            self.description = "the script as written"
            self._set(APPLIED)
            return
        default = dist.distributed_c10d._get_default_group()
        group = None if ddp.process_group is default else ddp.process_group
        # the exchange's momentum is set by the optimizer scheme at the first forward
        strategy = self.choice.build(momentum=0.0, group=group)
        self.strategy = strategy
        try:
            attachment = strategy.attach_ddp(ddp)
        except CannotApply as exc:
            raise self.refuse(str(exc)) from None
        self.description = f"{self.choice}: {attachment.description}"
        if attachment.hook is not None:
            self._hook = _Hook(attachment.hook, attachment.state)
            ddp.register_comm_hook(self._hook, _injected_hook)

        def register_comm_hook(state: object, hook: Callable[..., Any]) -> None:
            raise self.refuse("the script registers a DDP comm hook of its own; it would replace the strategy's")

        real_no_sync = ddp.no_sync

        def no_sync() -> Any:
            self._check(strategy.accumulates)
            return real_no_sync()

        ddp.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
        ddp.no_sync = no_sync  # type: ignore[method-assign]
        self._set(APPLIED)

    def _check(self, trait: Callable[..., None], *args: Any) -> None:
        """Run one of the strategy's checks; a :class:`CannotApply` becomes the refusal."""
        try:
            trait(*args)
        except CannotApply as exc:
            raise self.refuse(str(exc)) from None

    # -- at the first forward ---------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: Any) -> None:
        for listener in self.forward_listeners:
            listener()
        self.resolve()

    def resolve(self) -> None:
        """Find the optimizer of the DDP's parameters and take over its step (once).

        At the first of: the first forward, or an optimizer made after the
        DDP that holds its parameters. The forward alone would be too late
        for a closure: ``optimizer.step(closure)`` runs the first forward
        inside the first step, which then would have been the optimizer's own.
        """
        ddp = self._ddp() if self._ddp is not None else None
        if ddp is None or self._resolved:
            return
        self._resolved = True
        self._resolve(ddp)

    def optimizer_made(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer was constructed (its subclass may still be filling it in): take over its step if it
        steps the adopted DDP's parameters, so that the first step resolves before its closure runs."""
        if self._ddp is None or not self.owns(p for g in optimizer.param_groups for p in g["params"]):
            return
        if self._resolved and self._needs_step() and (self._owner is None or self._owner() is not optimizer):
            raise self.refuse(f"a second optimizer ({type(optimizer).__name__}) holds the DDP's parameters; the "
                              "strategy needs the one optimizer that steps them")
        if self._step_owner is None:
            self._take_step(optimizer)

    def _take_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._real_step = _install_step(optimizer, self)
        self._step_owner = weakref.ref(optimizer)

    def _needs_scheme(self) -> bool:
        """Whether a compressor's exchange owns the momentum, so an optimizer scheme must split the optimizer."""
        return (self.choice.compressor is not None and self.strategy is not None
                and self.strategy.compressor_owns_momentum)

    def _steps_through_strategy(self) -> bool:
        # LocalMomentsAdam under delayed runs the exchange and the late average itself
        return (self.strategy is not None and self.strategy.owns_step
                and not isinstance(self.scheme, LocalMomentsAdam))

    def _needs_step(self) -> bool:
        return self._steps_through_strategy() or self._needs_scheme()

    def _resolve(self, ddp: nn.Module) -> None:
        """Find the optimizer that owns the DDP's parameters; split it with the exchange when needed."""
        assert isinstance(ddp, DDP)
        params = {id(p) for p in ddp.module.parameters() if p.requires_grad}
        owners = [opt for opt in _optimizers() if any(id(p) in params for g in opt.param_groups for p in g["params"])]
        if len(owners) > 1 and self._needs_step():
            raise self.refuse(f"{len(owners)} optimizers hold the DDP's parameters "
                              f"({', '.join(type(o).__name__ for o in owners)}); the strategy needs the one "
                              "optimizer that steps them")
        if not owners:
            if self._needs_step():
                raise self.refuse("no torch.optim optimizer holds the DDP's parameters at its first forward; "
                                  "the strategy needs the optimizer's step (build the optimizer before training)")
            return
        owner = owners[0]
        self.optimizer_name = type(owner).__name__
        self._owner = weakref.ref(owner)
        strategy = self.strategy
        if strategy is not None and self._needs_step():
            self._check(strategy.check_optimizer, owner, self._needs_scheme())
        if self._step_owner is None or self._step_owner() is not owner:
            self._take_step(owner)
        real_step = self._real_step
        if strategy is not None and self._needs_scheme():
            state = strategy.scheme_exchange()
            assert state is not None, f"{strategy.name} attached no exchange for its compressor"
            try:
                self.scheme = scheme_for(owner, state, adam_warmup=self.adam_warmup, step_fn=real_step,
                                         group=strategy.group)
            except UnsupportedOptimizer as exc:
                raise self.refuse(str(exc)) from None
            if self._hook is not None:
                self._hook.scheme = self.scheme
                # delayed's hook keeps the first step local anyway (and launches its average): not held back here
                self._hook.local_first = (self._local_moments_fit()
                                          and not isinstance(self.strategy, DelayedStrategy))
            self.description += f"; {self.scheme.describe()}"
            self._set(APPLIED)
        if isinstance(strategy, DelayedStrategy):
            # a clip by norm hands an Adam's step to LocalMomentsAdam (grads_read): the first step's average
            # waits for the script's first read of .grad, or its step, instead of going out to be dropped
            strategy.hold_first = (self._local_moments_fit() if self.scheme is not None
                                   else self._delayed_local_moments_fit(owner))

    # -- between backward and step ------------------------------------------------------
    def owns(self, params: Iterable[Any]) -> bool:
        """Whether ``params`` (tensors, or anything else) include a parameter of the adopted DDP."""
        ddp = self._ddp() if self._ddp is not None else None
        if ddp is None:
            return False
        mine = {id(p) for p in ddp.module.parameters()}
        return any(id(p) in mine for p in params)

    def owns_grads(self, ids: set) -> bool:
        """Whether ``ids`` hold the ``id`` of a ``.grad`` of the adopted DDP's parameters."""
        ddp = self._ddp() if self._ddp is not None else None
        if ddp is None:
            return False
        return any(id(p.grad) in ids for p in ddp.module.parameters() if p.grad is not None)

    def grads_read(self, by_norm: bool = False) -> None:
        """The script is about to read the DDP's ``.grad`` (clipping): the strategy makes it right or refuses.

        Under a compressor whose exchange owns the momentum:

        - Adam/AdamW clipped by norm under a synchronous exchange with error
          feedback (onebit, topk, ...): :class:`LocalMomentsAdam` takes over from
          the first step: each rank keeps its own gradient and Adam moments, the
          clip's norm is the average gradient's (:meth:`global_norm`), and the
          ranks' Adam directions are averaged compressed in the step.
        - Otherwise the optimizer is given back to the script
          (:meth:`OptimizerScheme.release`): the exchange carries the gradient
          with error feedback, ``.grad`` holds its decompressed average, and the
          script's optimizer steps on it clipped.
        """
        if self.strategy is None or isinstance(self.scheme, LocalMomentsAdam):
            return
        if self.scheme is not None and by_norm and self._local_moments_fit():
            if self.scheme.steps:
                raise self.refuse(f"the script reads .grad (gradient clipping) first at step {self.scheme.steps + 1}, "
                                  "after the exchange took over Adam's momentum; clip from the first step")
            self._take_local_moments(self.scheme.optimizer, self.scheme.state)
            return
        owner = self._step_owner() if self._step_owner is not None else None
        if (self.scheme is None and by_norm and owner is not None and not owner.state
                and self._delayed_local_moments_fit(owner)):  # plain delayed: the exact exchange of directions
            assert isinstance(self.strategy, DelayedStrategy)
            # delayed's own group (never DDP's: DDP issues collectives of its own there from another thread)
            group = self.strategy.comm_group
            self._take_local_moments(owner, CompressionState("none", process_group=group))
            return
        if isinstance(self.strategy, DelayedStrategy):
            self.strategy.release_first()  # .grad still holds this rank's unclipped gradient: its average goes out
        self._average_first_step()
        if self.scheme is not None:
            try:
                self.scheme.release()
            except UnsupportedOptimizer as exc:
                raise self.refuse(str(exc)) from None
            if self.scheme.state.auto is not None:  # the script's own Adam steps on the decoded average
                dropped = self.scheme.state.auto.restrict(RELEASED_MIN_BITS, "the script clips")
                if dropped:
                    log.info("gradwire: the script clips: auto leaves out %s", ", ".join(dropped))
            log.info("gradwire: the script clips: %s runs as written, the exchange carries the gradient",
                     self.optimizer_name)
            self.description = self.description.replace(f"; {self.scheme.describe()}", "")
            self.description += (f"; {self.optimizer_name} as written, on the average of the gradients compressed "
                                 "with error feedback (the script clips)")
            self.scheme = None
            if self._hook is not None:
                self._hook.scheme = None
        self._check(self.strategy.grads_read, self.scheme is not None)

    def _take_local_moments(self, owner: torch.optim.Optimizer, state: CompressionState) -> None:
        """:class:`LocalMomentsAdam` steps ``owner`` from now on (see :meth:`grads_read`).

        Under ``delayed`` the strategy's own step and hook stand aside: the
        scheme launches each step's exchange and applies it a step later
        (``delayed=True``); the first step's buckets, which the strategy's
        hook held back (:meth:`DelayedStrategy.drop_first`), are dropped
        (``.grad`` still holds this rank's gradient), and the exchange starts
        afresh on the strategy's group.
        """
        strategy = self.strategy
        assert strategy is not None  # grads_read runs under a strategy
        delayed = isinstance(strategy, DelayedStrategy)
        if self.scheme is not None:
            self.description = self.description.replace(f"; {self.scheme.describe()}", "")
        if delayed:
            assert isinstance(strategy, DelayedStrategy)
            strategy.drop_first()
            for fut in strategy.in_flight():
                fut.wait()
            state = CompressionState(state.compressor, process_group=state.process_group,
                                     min_compress_numel=state.min_compress_numel)
        local = self._hook is not None and self._hook.local_first
        self.scheme = LocalMomentsAdam(owner, state, exact_first=not (local or delayed), delayed=delayed)
        # its waits are the step's exposed communication; delayed's launch overlaps the next step's compute
        self.scheme.waiting, self.scheme.background = strategy.waiting, strategy.background
        if self._hook is not None:
            self._hook.scheme, self._hook.local_first = self.scheme, False
        log.info("gradwire: the script clips by norm: %s", self.scheme.describe())
        self.description += f"; {self.scheme.describe()} (the script clips)"

    def _delayed_local_moments_fit(self, owner: torch.optim.Optimizer) -> bool:
        """Whether ``delayed`` (with a compressor or none) can hand a clipped Adam to :class:`LocalMomentsAdam`."""
        strategy = self.strategy
        if not isinstance(strategy, DelayedStrategy) or strategy.naive or self._hook is None:
            return False
        try:
            return check_optimizer(owner) == FrozenVarianceAdam.name
        except UnsupportedOptimizer:
            return False

    def _average_first_step(self) -> None:
        """The first step's gradients, kept local in case the script clips by norm, averaged exactly now.

        What the first exchange would have done (the scheme's warm-up averages
        plain gradients): one all_reduce of every gradient, after the scheme's
        :meth:`~OptimizerScheme.prepare` has seen this rank's own.
        """
        hook = self._hook
        ddp = self._ddp() if self._ddp is not None else None
        if hook is None or not hook.local_first or ddp is None or self.scheme is None:
            return
        hook.local_first = False
        state = self.scheme.state
        params = [p for p in ddp.module.parameters() if p.grad is not None]
        if not params:
            return
        with torch.no_grad():
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            self.scheme.prepare(flat, params)
            dist.all_reduce(flat, group=state.process_group)
            flat.div_(dist.get_world_size(state.process_group))
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        state.end_step()

    def _local_moments_fit(self) -> bool:
        """Whether :class:`LocalMomentsAdam` can run this script's clipped Adam (see :meth:`grads_read`)."""
        state = self.scheme.state if self.scheme is not None else None
        if not (isinstance(self.scheme, FrozenVarianceAdam) and state is not None and state.auto is None
                and state.error_feedback is not None and state.compressor.averages):
            return False
        return not self._steps_through_strategy() or self._delayed_local_moments_fit(self.scheme.optimizer)

    def clip_norm(self, grads: List[Any], norm_type: float) -> Optional[torch.Tensor]:
        """The total norm the script's clip sees, where a scheme measures it (None: torch's own)."""
        if isinstance(self.scheme, LocalMomentsAdam):
            try:
                return self.scheme.global_norm(grads, norm_type)
            except UnsupportedOptimizer as exc:
                raise self.refuse(str(exc)) from None
        return None

    def clipped(self, clip: GradientClip) -> None:
        """The script clipped the DDP's ``.grad`` as ``clip`` says (after :meth:`grads_read`)."""
        if self.strategy is not None and not isinstance(self.scheme, LocalMomentsAdam):
            self.strategy.clipped(clip)

    def grads_unscaled(self) -> None:
        """A ``GradScaler`` is about to unscale the DDP's ``.grad``."""
        if self.strategy is not None:
            self._check(self.strategy.grad_scaler, self._needs_scheme())

    # -- each optimizer step ----------------------------------------------------------
    def optimizer_step(self, args: tuple, kwargs: Dict[str, Any]) -> Any:
        """The owning optimizer's step under the strategy.

        A closure (``optimizer.step(closure)``, as Lightning's automatic
        optimization calls it) runs forward and backward inside the step.
        Where the strategy or a scheme owns the step, the closure runs first,
        once, with gradients enabled, so the strategy combines this step's
        gradients, and the optimizer's own step then runs without it; the
        closure's loss is returned as the optimizer would return it.
        Otherwise (sync, PyTorch's hooks) the closure goes to the optimizer's
        own step as written (LBFGS may call it several times: each backward
        is one DDP exchange).
        """
        self.resolve()
        self._average_first_step()  # the script did not clip by norm at its first step
        inner = self.scheme.step if self.scheme is not None else self._real_step
        strategy = self.strategy
        loss: Any = None
        owned = self._needs_step()
        try:
            if owned:
                args, kwargs, closure = _split_closure(args, kwargs)
                if closure is not None:
                    with torch.enable_grad():
                        loss = closure()
            if self._steps_through_strategy():
                assert strategy is not None
                proxy = _StepProxy(inner, args, kwargs)
                strategy.step(proxy)  # type: ignore[arg-type]  # a strategy only calls its optimizer's step()
                return loss if loss is not None else proxy.result
            result = inner(*args, **kwargs)
            return loss if loss is not None else result
        finally:
            for listener in self.step_listeners:
                listener()

    def check_step_without_ddp(self, optimizer: torch.optim.Optimizer) -> None:
        """Called before any optimizer step: a step before any DDP means the strategy cannot apply."""
        if self._ddp is None and not self.is_sync:
            self._set(NOT_APPLIED, f"the script stepped {type(optimizer).__name__} without having built a "
                                   "DistributedDataParallel model; the strategy is applied at DDP construction")
            raise StrategyNotApplied(f"gradwire: strategy {self.choice} not applied: {self.reason}")

    def close(self) -> None:
        """Wait for the averages still in flight (ignoring their failures), then let the strategy release what it
        started (:meth:`Strategy.close`): the process group is about to go."""
        pending = self.strategy.in_flight() if self.strategy is not None else []
        if isinstance(self.scheme, LocalMomentsAdam):
            pending = [*pending, *self.scheme.in_flight()]
        for fut in pending:
            try:
                fut.wait()
            except Exception:  # noqa: BLE001 - the training is over; its failures were raised where they happened
                pass
        if self.strategy is not None:
            self.strategy.close()


def _no_step(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("no optimizer step was taken over")


def _split_closure(args: tuple, kwargs: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any], Optional[Callable[[], Any]]]:
    """``optimizer.step``'s arguments without the closure, and the closure (positional or by name)."""
    kwargs = dict(kwargs)
    closure = kwargs.pop("closure", None)
    if closure is None and args and callable(args[0]):
        closure, args = args[0], args[1:]
    return args, kwargs, closure


# ----------------------------------------------------------------------------------------------- patches
#: optimizers made since install(), held weakly
_registry: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
_current: Optional[Injection] = None
#: what install() replaced, as (owner, attribute, original), and the hook it registered
_saved: List[Union[Tuple[Any, str, Any], RemovableHandle]] = []


def _optimizers() -> List[torch.optim.Optimizer]:
    """Live optimizers: those registered at construction, else (made before install) a scan of live objects."""
    found = list(_registry)
    if not found:
        found = [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)]
    return found


def _install_step(optimizer: torch.optim.Optimizer, injection: Injection) -> Callable[..., Any]:
    """Make ``optimizer.step`` call ``injection.optimizer_step``; return the step it replaced."""
    real_step = optimizer.step
    scheduled = hasattr(real_step, "_wrapped_by_lr_sched")

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if scheduled:
            self._opt_called = True  # type: ignore[attr-defined]  # what the LR scheduler's own wrapper would have marked
        return injection.optimizer_step(args, kwargs)

    if scheduled:
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    return real_step


def install(choice: "str | StrategyChoice", adam_warmup: int = DEFAULT_ADAM_WARMUP,
            on_status: Optional[Callable[[Injection], None]] = None) -> Injection:
    """Patch DDP and the optimizers of this process so that ``choice`` is applied; return the injection.

    Idempotent per process: a second call returns the first injection.
    """
    global _current
    if _current is not None:
        return _current
    injection = Injection(choice, adam_warmup, on_status)
    _current = injection
    real_init = DDP.__init__
    signature = inspect.signature(real_init)

    def __init__(self: DDP, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        bound = signature.bind(self, *args, **kwargs)
        injection.ddp_arguments(bound.arguments)
        real_init(*bound.args, **bound.kwargs)
        injection.adopt(self)

    real_opt_init = torch.optim.Optimizer.__init__

    def optimizer_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        real_opt_init(self, *args, **kwargs)
        if making_strategy_optimizer():  # a strategy's outer optimizer: not the script's
            return
        _registry.add(self)
        injection.optimizer_made(self)

    def before_any_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        injection.check_step_without_ddp(optimizer)

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(before_any_step)
    _saved[:] = [handle]
    _patch(DDP, "__init__", __init__)
    _patch(torch.optim.Optimizer, "__init__", optimizer_init)
    _watch_gradient_readers(injection)
    return injection


def _patch(owner: Any, name: str, value: Any) -> None:
    _saved.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def _watch_gradient_readers(injection: Injection) -> None:
    """Tell ``injection`` when the script reads the DDP's ``.grad`` between backward and step.

    Gradient clipping: ``clip_grad_norm_`` computes its norm through
    ``clip_grad._get_total_norm`` (a module global, so a ``clip_grad_norm_``
    imported by name before the patch still passes through it), and
    ``clip_grad_value_``. Mixed precision: a ``GradScaler`` unscales ``.grad``
    in ``unscale_``, which its ``step`` calls too (a disabled scaler does
    neither, and is left alone).
    """
    from torch.amp import GradScaler
    from torch.nn import utils
    from torch.nn.utils import clip_grad

    def reads(items: List[Any], by_norm: bool = False) -> bool:  # parameters (clip_grad_value_) or gradients
        mine = injection.owns(items) or injection.owns_grads({id(t) for t in items})
        if mine:
            injection.grads_read(by_norm)
        return mine

    real_norm = clip_grad._get_total_norm
    #: the norm_type of the last total norm taken of the DDP's gradients (the clip that follows bounds it)
    norm_types: List[float] = [2.0]

    def total_norm(tensors: Any, norm_type: float = 2.0, *args: Any, **kwargs: Any) -> Any:
        items = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        mine = reads(items, by_norm=True)
        norm_types[0] = float(norm_type)
        norm = injection.clip_norm(items, float(norm_type)) if mine else None
        return real_norm(items, norm_type, *args, **kwargs) if norm is None else norm

    real_scale = clip_grad._clip_grads_with_norm_

    def clip_grads_with_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        items = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        out = real_scale(items, max_norm, *args, **kwargs)
        if injection.owns(items):
            injection.clipped(GradientClip(max_norm=float(max_norm), norm_type=norm_types[0]))
        return out

    real_value = clip_grad.clip_grad_value_

    def clip_grad_value_(parameters: Any, clip_value: float, *args: Any, **kwargs: Any) -> Any:
        items = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        reads(items)
        out = real_value(items, clip_value, *args, **kwargs)
        if injection.owns(items):
            injection.clipped(GradientClip(clip_value=float(clip_value)))
        return out

    real_unscale = GradScaler.unscale_

    def unscale_(self: GradScaler, optimizer: torch.optim.Optimizer) -> None:
        if self.is_enabled() and injection.owns(p for g in optimizer.param_groups for p in g["params"]):
            injection.grads_unscaled()
        return real_unscale(self, optimizer)

    _patch(clip_grad, "_get_total_norm", total_norm)
    _patch(clip_grad, "_clip_grads_with_norm_", clip_grads_with_norm_)
    _patch(utils, "get_total_norm", total_norm)
    _patch(clip_grad, "clip_grad_value_", clip_grad_value_)
    _patch(utils, "clip_grad_value_", clip_grad_value_)
    _patch(GradScaler, "unscale_", unscale_)


def uninstall() -> None:
    """Undo :func:`install` (tests)."""
    global _current
    for entry in _saved:
        if isinstance(entry, tuple):
            setattr(*entry)
        else:
            entry.remove()
    _saved.clear()
    _registry.clear()
    _current = None
