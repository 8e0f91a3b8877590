"""Compression under the user's optimizer: SGD with momentum, Adam and AdamW.

Error feedback in front of an optimizer's momentum collapses training
(:mod:`gradwire.exchange.state`): the exchange must own the momentum and compress
it, and the optimizer must run without it. A scheme makes that split for one
optimizer, so a script keeps its own ``torch.optim`` optimizer:

``MomentumSGD`` (``torch.optim.SGD``, ``dampening=0``, no Nesterov):

1. The optimizer's momentum ``beta`` moves into the exchange
   (``state.momentum = beta``); the optimizer's is set to 0.
2. SGD's L2 ``weight_decay`` is part of what its momentum accumulates
   (``m = beta m + g + wd p``), so it moves too: :meth:`OptimizerScheme.prepare`
   adds ``wd * p`` to each bucket before the exchange's momentum, and the
   optimizer's ``weight_decay`` is set to 0.
3. The exchange returns ``u`` (the compressed average of ``m``, locally
   corrected) in ``.grad``; SGD without momentum applies ``p -= lr * u``.
   With the ``none`` compressor this is momentum SGD to rounding.

``FrozenVarianceAdam`` (``Adam`` without L2 decay, ``AdamW``), after DeepSpeed's
1-bit Adam (Tang et al., 2021, https://arxiv.org/abs/2102.02888):

1. Warm-up, ``warmup_steps`` optimizer steps: the exchange averages gradients
   uncompressed (``state.momentum = 0``, no compression) and the optimizer's
   own step runs: exactly Adam/AdamW.
2. The switch. With ``v`` held, Adam's update is momentum SGD with a fixed
   diagonal preconditioner ``P = 1 / (sqrt(v_hat) + eps)``, and Adam's EMA
   momentum ``m = beta1 m + (1 - beta1) g`` is ``(1 - beta1)`` times the
   sum-form momentum ``u = beta1 u + g`` the exchange keeps. So the exchange
   takes the momentum (``state.momentum = beta1``), seeded from ``exp_avg``
   so that nothing jumps, and compression starts.
3. Each later step applies, per parameter::

       p *= 1 - lr * wd                                  (AdamW's decoupled decay)
       exp_avg = (1 - beta1) * u
       p -= lr / (1 - beta1**t) * exp_avg / (sqrt(v_hat) + eps)

   torch's AdamW step with the variance held at ``v_hat``. ``lr`` is read
   from ``param_groups`` every step (learning-rate schedulers keep working).

Where this does better than 1-bit Adam (each measured on the GPT example,
benchmarks/README.md):

- The exchange carries ``P g`` instead of ``g`` (``prepare`` divides the
  bucket by the denominators), so the momentum it compresses is Adam's update
  itself, ``P u``. Its elements have nearly one magnitude, which a sign with
  one scale per block of 512 represents well; the raw momentum mixes
  coordinates whose ``v`` differ by orders of magnitude in one block. ``P``
  being identical on every rank, the average of ``P m_i`` is ``P`` times the
  average of ``m_i``: nothing else changes.
- The variance is not frozen for good. 1-bit Adam needs a warm-up of 15-25%
  of training for ``v`` to settle, and that warm-up moves full-precision
  bytes: with compression at 1/30, a 15% warm-up alone caps the saving near
  6x. Here every rank keeps its own ``v_i`` from its local gradients (free,
  in ``prepare``). At 2, 4, 8, ... times the warm-up and then every
  ``refresh_cap`` steps, one bf16 all_reduce averages the ``v_i`` and the
  step's local gradients; each tensor's ``v_hat`` is the averaged ``v_i`` times
  ``|mean_i g_i|^2 / mean_i |g_i|^2`` of that step (a rank's own gradient is
  noisier than the average Adam sees, by up to the world size). Between
  refreshes, every ``track_every`` steps, one all_reduce of a float per tensor
  follows each tensor's level (``v_hat`` scaled by the change of its mean
  ``v_i``). The momentum and residuals of the exchange are rescaled with
  ``P`` so that they stay in its units. The warm-up then only has to give a
  first ``v``: :data:`DEFAULT_ADAM_WARMUP` steps.
- Robustness of a held ``v``: a floor at ``variance_floor`` times the
  tensor's mean (a coordinate the warm-up never saw, ``v = 0``, would take
  ``1/eps`` steps), and Adafactor's update clipping (Shazeer and Stern, 2018):
  a tensor's update is scaled down to RMS ``max_update_rms`` when a lagging
  ``v`` makes it larger, where the exchange is exact (``none``, ``fp16``) or
  unbiased (``int8``). Not under error feedback (``onebit``, ``topk``): there
  the update applied must be the decompressed one, since the residual keeps
  only what compression dropped; the sign of ``m + e`` scaled to its RMS is
  larger than ``m``, the clip shrinks it every step and that mass is lost
  for good, and each rank's own clip factor would break the local
  correction's exact mean where that option is on. Measured on the digits CNN, 4 ranks,
  3 seeds, AdamW: onebit with the clip -7.6 points of test accuracy, without
  it within noise of AdamW (benchmarks/README.md, ``adamw_onebit.py``).
- Every rank applies the same decoded average (identical replicas); the
  local correction of the compression error is an option
  (:mod:`gradwire.exchange.state`).

Bias correction (a choice, and why). DeepSpeed's 1-bit Adam applies none: it
switches after thousands of steps, where ``1 - beta2**t0`` is 1. Here the
switch comes after a few steps, where ``1 - 0.999**8 = 0.008``: without the
correction the preconditioner would be 11 times too large. So ``v_hat`` is
bias-corrected when it is made (``v / (1 - beta2**t)``, the local ``v_i``
too) and then held (torch's formula, if ``v`` merely stopped changing, would
let the correction decay towards the uncorrected value as ``t`` grows). The
momentum's correction ``1 - beta1**t`` is torch's, with ``t`` the optimizer's
own step count.

The optimizer's state stays meaningful for checkpoints: ``exp_avg`` holds
``(1 - beta1) * u``, ``step`` counts every step, and ``exp_avg_sq`` is kept at
``v_hat * (1 - beta2**t)``, so ``exp_avg_sq / (1 - beta2**t)``, what torch's
AdamW reads, is ``v_hat``: the checkpoint resumes in a plain AdamW with the
same preconditioner. Save :meth:`OptimizerScheme.state_dict` too (the
position, the local variances and the exchange's momentum and residuals):
a collective that gathers every rank's part, which rank 0 saves beside
rank 0's ``optimizer.state_dict()`` (every rank's optimizer state is the
same: it steps on the same average); every rank loads both
(:mod:`gradwire.exchange.checkpoint`).

Traps:
- Between ``backward()`` and the step, ``.grad`` holds the exchanged
  momentum ``u``, not the gradient: gradient clipping (``clip_grad_norm_``)
  would clip the momentum, about ``1 / (1 - beta)`` times larger than a
  gradient. :meth:`OptimizerScheme.release` (before the first step) gives
  the optimizer back and makes the exchange carry the gradient instead; what
  ``gradwire compare`` does for a script that clips, except an Adam clipped by
  norm under error feedback, which :class:`~gradwire.exchange.LocalMomentsAdam`
  steps (:mod:`gradwire.exchange.local_moments`).
- Every parameter group must share one ``beta`` (``betas[0]`` for Adam): the
  exchange keeps one momentum.
- The scheme reads and writes ``param_groups`` once, at construction: an
  optimizer whose momentum is changed later by the script (a momentum
  schedule) is not followed.
- With the local correction switched on (``correct=1``; off by default) the
  ranks' parameters differ by ``lr`` times their residual differences
  (:mod:`gradwire.exchange.state`).
- Adam's step count ``t`` is per parameter in torch; all parameters of the
  DDP model step together here.
- The refreshes need every rank's local gradients, which only a bucket hook
  sees (:func:`gradwire.hooks.scheme_hook`, ``delayed``); an exchange that never calls
  ``prepare`` (the per-parameter ``handler``) holds the warm-up's ``v``.

Example (a hand-written loop)::

    from gradwire.exchange import CompressionState, scheme_for
    from gradwire.hooks import scheme_hook
    state = CompressionState("onebit")
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4, weight_decay=0.1)
    scheme = scheme_for(opt, state, adam_warmup=8)
    ddp.register_comm_hook(scheme, scheme_hook)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        scheme.step()                      # instead of opt.step()
"""
import logging
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from gradwire.compress import StateKey

from .checkpoint import GATHER_TIMEOUT, gather_parts, mean_tensors, own_part
from .state import CompressionState, warmup_steps

__all__ = [
    "DEFAULT_ADAM_WARMUP", "MAX_UPDATE_RMS", "FrozenVarianceAdam", "MomentumSGD", "OptimizerScheme",
    "UnsupportedOptimizer", "check_optimizer", "scheme_for",
]

log = logging.getLogger(__name__)

#: optimizer steps of full-precision Adam before compression starts (see the module doc)
DEFAULT_ADAM_WARMUP = 8

#: the most optimizer steps between two refreshes of Adam's variance
REFRESH_CAP = 256
#: optimizer steps between two updates of each tensor's variance level (a few floats)
TRACK_EVERY = 4

#: warm-up of a state that waits for a scheme to switch compression on
_NEVER = sys.maxsize

#: the RMS an update of the frozen-variance step is clipped to, where the exchange has no error feedback
MAX_UPDATE_RMS = 1.0
#: "the default for this exchange" (:data:`MAX_UPDATE_RMS`, or off under error feedback)
_AUTO = -1.0


class UnsupportedOptimizer(ValueError):
    """The optimizer (or a setting of it) cannot run under a compressed exchange; the message says why."""


def _group_value(optimizer: torch.optim.Optimizer, name: str, what: str) -> Any:
    """The one value of ``name`` every param group shares; refuse groups that differ."""
    values = [g[name] for g in optimizer.param_groups]
    if any(v != values[0] for v in values[1:]):
        raise UnsupportedOptimizer(f"{type(optimizer).__name__}: the param groups have different {what} "
                                   f"({', '.join(map(str, values))}); the exchange keeps one momentum, "
                                   f"so every group must share {what}")
    return values[0]


def check_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """Raise :class:`UnsupportedOptimizer` unless a scheme can run ``optimizer``; return the scheme's name.

    The reasons name the setting and what would work instead.
    """
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        if any(g["nesterov"] for g in optimizer.param_groups):
            raise UnsupportedOptimizer("SGD with nesterov=True: Nesterov's look-ahead uses the momentum "
                                       "before it is averaged, which the exchange owns; use nesterov=False")
        if any(g["dampening"] for g in optimizer.param_groups):
            raise UnsupportedOptimizer("SGD with dampening != 0: the exchange keeps sum-form momentum "
                                       "(m = beta m + g); use dampening=0")
        if any(g.get("differentiable") for g in optimizer.param_groups):
            raise UnsupportedOptimizer("SGD with differentiable=True: the exchange's momentum is not differentiable")
        _group_value(optimizer, "momentum", "momentum")
        return "MomentumSGD"
    if isinstance(optimizer, torch.optim.Adam):  # AdamW is an Adam with decoupled_weight_decay=True
        for g in optimizer.param_groups:
            if g["amsgrad"]:
                raise UnsupportedOptimizer(f"{name} with amsgrad=True: the variance is frozen after the warm-up, "
                                           "so its running maximum has nothing to do; use amsgrad=False")
            if g["maximize"]:
                raise UnsupportedOptimizer(f"{name} with maximize=True is not supported; minimise the negated loss")
            if g.get("differentiable"):
                raise UnsupportedOptimizer(f"{name} with differentiable=True: the frozen-variance step is not "
                                           "differentiable")
            if g["weight_decay"] and not g.get("decoupled_weight_decay", False):
                raise UnsupportedOptimizer(
                    f"Adam with L2 weight_decay={g['weight_decay']}: the decay would enter the momentum the "
                    "exchange owns and the frozen variance; use AdamW (decoupled decay) or weight_decay=0")
        _group_value(optimizer, "betas", "betas")
        return "FrozenVarianceAdam"
    raise UnsupportedOptimizer(
        f"{name} is not supported under a compressed exchange (its momentum or state cannot move into the "
        "exchange); supported: SGD (dampening=0, nesterov=False), Adam (weight_decay=0) and AdamW")


class OptimizerScheme:
    """How an optimizer and a :class:`CompressionState` share one training step (see the module doc).

    Args:
        optimizer: the user's optimizer; its param groups are changed in place.
        state: the exchange; the scheme sets its momentum (and, for Adam, its warm-up).
        step_fn: the optimizer's own step (default ``optimizer.step``), for
            callers that replaced ``optimizer.step`` by something that calls the scheme.
    """

    #: a short name for reports
    name = "scheme"

    def __init__(self, optimizer: torch.optim.Optimizer, state: CompressionState,
                 step_fn: Optional[Callable[..., Any]] = None) -> None:
        self.optimizer = optimizer
        self.state = state
        self.step_fn = optimizer.step if step_fn is None else step_fn
        #: optimizer steps taken through the scheme
        self.steps = 0

    def prepare(self, buffer: Tensor, params: Sequence[Tensor]) -> None:
        """Change a bucket (``buffer``, laid out as ``params``) before the exchange; nothing by default."""

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Apply the exchanged update: call it instead of ``optimizer.step()``."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line: what moved where."""
        return self.name

    def short(self) -> str:
        """A few words for a table cell."""
        return self.name

    def release(self) -> None:
        """Give the optimizer back as the script wrote it; the exchange then carries the gradient itself.

        For a script that reads ``.grad`` between backward and step (gradient
        clipping): the exchange stops owning the momentum (``momentum = 0``),
        compresses the gradient with error feedback and returns the
        decompressed average, the same on every rank (no local correction),
        in ``.grad``; the script clips that and its own optimizer (momentum,
        decay, Adam's moments) steps on it, as PowerSGD's hook and ZeRO++'s
        quantized gradients do. Called between the first backward and the
        first step, when ``.grad`` still holds this step's gradient average.

        Raises:
            UnsupportedOptimizer: the split can no longer be undone exactly (the reason says why).
        """
        raise UnsupportedOptimizer(f"{self.name} cannot give {type(self.optimizer).__name__} back to the script")

    def _gradient_exchange(self) -> None:
        """The exchange's side of :meth:`release`: no momentum, no local correction, compression from now on."""
        self.state.momentum = 0.0
        self.state.momentum_buffers.clear()
        self.state.local_correction = False
        self.state.warmup_iters = warmup_steps(self.state.compressor)

    def _seed(self, params_and_values: Sequence[tuple]) -> None:
        """Install each parameter's momentum in the exchange (keyed by the parameter's segment name)."""
        for p, value in params_and_values:
            key = StateKey.of(self.state.names.name(p), p.numel())
            self.state.momentum_buffers.set(key, value.detach().reshape(-1).to(p.dtype).clone())

    def state_dict(self, timeout: float = GATHER_TIMEOUT) -> Dict[str, Any]:
        """Every rank's :meth:`local_state_dict`, gathered: a collective of every rank; save it on one.

        Beside it, rank 0's ``optimizer.state_dict()`` is every rank's: the
        optimizer steps on the same average everywhere (module doc, "Checkpoints").

        Raises:
            CheckpointError: not every rank called it within ``timeout`` seconds.
        """
        return gather_parts(self.local_state_dict(), self.state.process_group,
                            f"{type(self).__name__}.state_dict()", timeout)

    def load_state_dict(self, saved: Dict[str, Any]) -> None:
        """Restore this rank's part of what :meth:`state_dict` (or :meth:`local_state_dict`) returned.

        On another world size the part is approximate (:meth:`merge_parts`) and a warning says what.
        """
        rank, world = self.state.rank_world()
        part, problem = own_part(saved, rank, world, self.merge_parts)
        if problem is not None:
            part = {**part, "exchange": {**part["exchange"], "rank": rank, "world": world}}
            self.state._warn_resume(problem)
        self.load_local_state_dict(part)

    def merge_parts(self, parts: List[Dict[str, Any]], rank: int) -> Dict[str, Any]:
        """An approximate part for another world size: the exchange's (:meth:`CompressionState.merge_parts`)."""
        return {**parts[rank % len(parts)],
                "exchange": CompressionState.merge_parts([p["exchange"] for p in parts], rank)}

    def local_state_dict(self) -> Dict[str, Any]:
        """This rank's part: the scheme's position and the exchange's state (no collective)."""
        return {"name": self.name, "steps": self.steps, "momentum": self.state.momentum,
                "warmup_iters": self.state.warmup_iters, "exchange": self.state.local_state_dict()}

    def load_local_state_dict(self, saved: Dict[str, Any]) -> None:
        """Restore what :meth:`local_state_dict` returned."""
        if saved["name"] != self.name:
            raise ValueError(f"the checkpoint is of scheme {saved['name']}, this one is {self.name}")
        self.steps = int(saved["steps"])
        self.state.momentum = float(saved["momentum"])
        self.state.warmup_iters = int(saved["warmup_iters"])
        self.state.load_state_dict(saved["exchange"])


class MomentumSGD(OptimizerScheme):
    """``torch.optim.SGD``: momentum and L2 weight decay move into the exchange; SGD applies ``u``."""

    name = "MomentumSGD"

    def __init__(self, optimizer: torch.optim.Optimizer, state: CompressionState,
                 step_fn: Optional[Callable[..., Any]] = None) -> None:
        if check_optimizer(optimizer) != self.name:
            raise UnsupportedOptimizer(f"MomentumSGD runs torch.optim.SGD, got {type(optimizer).__name__}")
        super().__init__(optimizer, state, step_fn)
        beta = float(_group_value(optimizer, "momentum", "momentum"))
        #: weight decay per parameter (by id), signed for ``maximize``
        self.decay: Dict[int, float] = {}
        seeds = []
        for g in optimizer.param_groups:
            sign = -1.0 if g.get("maximize") else 1.0  # SGD negates g, then adds wd * p
            for p in g["params"]:
                if g["weight_decay"]:
                    self.decay[id(p)] = sign * float(g["weight_decay"])
                buf = optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:  # a resumed SGD: its momentum (sum form, dampening 0) continues here
                    seeds.append((p, buf * sign))
                    optimizer.state[p]["momentum_buffer"] = None
            g["momentum"] = 0.0
            g["weight_decay"] = 0.0
        self.momentum = beta
        self.weight_decay = sorted({abs(v) for v in self.decay.values()})
        state.momentum = beta
        self._seed(seeds)

    def prepare(self, buffer: Tensor, params: Sequence[Tensor]) -> None:
        """``buffer += wd * p`` per parameter (the decay SGD's momentum would have accumulated)."""
        if not self.decay:
            return
        flat, offset = buffer.view(-1), 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                wd = self.decay.get(id(p))
                if wd:
                    flat[offset:offset + n].add_(p.detach().reshape(-1), alpha=wd)
                offset += n

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        self.steps += 1
        return self.step_fn(closure) if closure is not None else self.step_fn()

    def release(self) -> None:
        """Momentum and decay back into SGD; ``.grad`` loses the ``wd * p`` that :meth:`prepare` added.

        Exact at the first step: the exchange's momentum was then the
        gradient itself (``m = 0 + g + wd p``), and ``p`` is the same on
        every rank, so ``.grad - wd p`` is the gradient average. Later, SGD's
        momentum would have to be rebuilt from the exchange's, whose residuals
        are in other units: refused.
        """
        if self.steps:
            raise UnsupportedOptimizer(f"the script reads .grad (gradient clipping) first at step {self.steps + 1}, "
                                       "after the exchange took over SGD's momentum; clip from the first step")
        with torch.no_grad():
            for g in self.optimizer.param_groups:
                decays = [self.decay[id(p)] for p in g["params"] if id(p) in self.decay]
                g["momentum"] = self.momentum
                g["weight_decay"] = abs(decays[0]) if decays else 0.0
                for p in g["params"]:
                    wd = self.decay.get(id(p))
                    if wd and p.grad is not None:
                        p.grad.sub_(p.detach(), alpha=wd)
        self.decay = {}
        self._gradient_exchange()

    def local_state_dict(self) -> Dict[str, Any]:
        """The base's, with the momentum and each parameter's decay (in ``param_groups`` order).

        A scheme made for an optimizer that loaded its checkpoint first finds
        momentum 0 and decay 0 in its groups (the scheme moved them out): the
        checkpoint says what they were.
        """
        return {**super().local_state_dict(), "beta": self.momentum,
                "decay": [self.decay.get(id(p)) for p in params_of(self.optimizer)]}

    def load_local_state_dict(self, saved: Dict[str, Any]) -> None:
        super().load_local_state_dict(saved)
        if "decay" in saved:
            self.momentum = float(saved["beta"])
            self.decay = {id(p): float(wd) for p, wd in _aligned(self.optimizer, saved["decay"], "decay") if wd}
            self.weight_decay = sorted({abs(v) for v in self.decay.values()})

    def describe(self) -> str:
        wd = f", weight_decay {'/'.join(f'{w:g}' for w in self.weight_decay)}" if self.weight_decay else ""
        return f"SGD: momentum {self.momentum:g}{wd} moved into the exchange"

    def short(self) -> str:
        return f"SGD: momentum {self.momentum:g}{' + decay' if self.weight_decay else ''} in the exchange"


class FrozenVarianceAdam(OptimizerScheme):
    """Adam/AdamW: full-precision warm-up, then the preconditioned momentum compressed in the exchange.

    Args:
        warmup_steps: optimizer steps of plain Adam before the switch (>= 1).
        variance_floor: ``v`` is kept at least this fraction of its tensor's
            mean (coordinates the warm-up barely saw would get huge steps).
        max_update_rms: the update of a tensor (``m_hat / sqrt(v_hat)``) is
            scaled down to this RMS when larger (Adafactor's update clipping;
            a variance that lags growing gradients cannot blow up); None: off.
            Default: :data:`MAX_UPDATE_RMS`, off where the exchange has error
            feedback (the module doc says why).
        refresh: refresh the variance (see the module doc); needs a process group.
        refresh_cap: the most optimizer steps between two refreshes.
        precondition: exchange the momentum divided by the denominator (the
            module doc); False: the momentum itself, as 1-bit Adam.
        group: the group the refreshes average on (None: the default group);
            never one with the exchange's collectives in flight.
        track_every: optimizer steps between two updates of each tensor's
            level (0: none).
    """

    name = "FrozenVarianceAdam"

    def __init__(self, optimizer: torch.optim.Optimizer, state: CompressionState,
                 warmup_steps: int = DEFAULT_ADAM_WARMUP, step_fn: Optional[Callable[..., Any]] = None,
                 variance_floor: float = 0.01, max_update_rms: Optional[float] = _AUTO, refresh: bool = True,
                 refresh_cap: int = REFRESH_CAP, precondition: bool = True,
                 group: Optional[dist.ProcessGroup] = None, track_every: int = TRACK_EVERY) -> None:
        if check_optimizer(optimizer) != self.name:
            raise UnsupportedOptimizer(f"FrozenVarianceAdam runs torch.optim.Adam/AdamW, got {type(optimizer).__name__}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (Adam needs a variance to freeze), got {warmup_steps}")
        if refresh_cap < 1:
            raise ValueError(f"refresh_cap must be >= 1 step, got {refresh_cap}")
        if not state.compressor.averages:
            raise UnsupportedOptimizer(f"{state.compressor.name}'s exchange is a vote, not an average of the "
                                       "momentum, which the frozen-variance Adam step needs")
        super().__init__(optimizer, state, step_fn)
        self.beta1, self.beta2 = (float(b) for b in _group_value(optimizer, "betas", "betas"))
        self.warmup_steps = int(warmup_steps)
        self.variance_floor = float(variance_floor)
        if max_update_rms is _AUTO:
            max_update_rms = None if state.error_feedback is not None else MAX_UPDATE_RMS
        self.max_update_rms = max_update_rms
        self.refresh = bool(refresh) and dist.is_available() and dist.is_initialized()
        self.refresh_cap = int(refresh_cap)
        self.precondition = bool(precondition)
        self.group = group
        #: the denominators ``sqrt(v_hat) + eps`` by parameter (after the switch)
        self.denominators: Dict[Tensor, Tensor] = {}
        self.frozen = False
        #: this rank's own second moment: EMA (beta2) of its local gradients, fed by prepare()
        self.local_v: Dict[Tensor, Tensor] = {}
        #: this rank's local gradients of a refresh step
        self._stash: Dict[Tensor, Tensor] = {}
        #: variance refreshes done
        self.refreshes = 0
        self.track_every = int(track_every)
        #: per parameter: the v_hat of the last freeze or refresh, and the ranks' mean local level then
        self._base: Dict[Tensor, Tensor] = {}
        self._level: Dict[Tensor, float] = {}
        self._eps = {p: float(g["eps"]) for g in optimizer.param_groups for p in g["params"]}
        #: the level all_reduce of the last step, applied before the next exchange (see _track)
        self._tracking: Optional[tuple] = None
        # warm-up: plain averages of the gradients, no momentum in the exchange
        state.momentum = 0.0
        state.warmup_iters = _NEVER
        done = [int(_step_of(s)) for s in optimizer.state.values() if "step" in s]
        self.steps = max(done, default=0)  # a resumed optimizer: its steps count towards the warm-up
        if self.steps >= self.warmup_steps:
            self._freeze()

    # -- the exchange's side -------------------------------------------------------
    def prepare(self, buffer: Tensor, params: Sequence[Tensor]) -> None:
        """Track this rank's own variance; after the switch, divide the gradients by the denominators.

        ``v_i = beta2 v_i + (1 - beta2) g_i^2`` from the bucket's local
        gradients (kept, on a refresh step, for the noise estimate), then
        ``g_i /= denominator`` when the exchange carries the preconditioned momentum.
        """
        self._finish_track()
        divide = self.frozen and self.precondition
        if not self.refresh and not divide:
            return
        keep = self.refresh and self.refresh_due(self.steps + 1)
        params = list(params)
        grads = list(buffer.view(-1).split([p.numel() for p in params]))
        with torch.no_grad():
            if self.refresh:
                local_v = [self._local_v(p) for p in params]
                torch._foreach_mul_(local_v, self.beta2)
                torch._foreach_addcmul_(local_v, grads, grads, value=1.0 - self.beta2)
                if keep:
                    for p, g in zip(params, grads):
                        self._stash[p] = g.detach().clone()
            if divide:
                pairs = [(g, self.denominators[p].view(-1)) for p, g in zip(params, grads) if p in self.denominators]
                if pairs:
                    torch._foreach_div_([g for g, _ in pairs], [d for _, d in pairs])

    def _local_v(self, p: Tensor) -> Tensor:
        """This rank's own second moment of ``p`` (flat, fp32), made at zero when first seen."""
        v = self.local_v.get(p)
        if v is None:
            v = self.local_v[p] = torch.zeros(p.numel(), dtype=torch.float32, device=p.device)
        return v

    # -- the optimizer's side ------------------------------------------------------
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        if not self.frozen:
            loss = self.step_fn(closure) if closure is not None else self.step_fn()
            self.steps += 1
            if self.steps >= self.warmup_steps:
                self._freeze()
            return loss
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._finish_track()  # a step without an exchange since the last (no bucket called prepare)
        frozen_adam_step(self.optimizer, self.denominators, self.max_update_rms, self.precondition)
        self.steps += 1
        if self.refresh and self.refresh_due(self.steps):
            self._refresh()
        elif self.refresh and self.track_every and self.steps % self.track_every == 0:
            self._tracking = self._launch_levels()
        return loss

    def release(self) -> None:
        """Adam as written from here on; exact during the warm-up (the exchange averaged plain gradients)."""
        if self.frozen:
            raise UnsupportedOptimizer(f"the script reads .grad (gradient clipping) first at step {self.steps + 1}, "
                                       "after the exchange took over Adam's momentum; clip from the first step")
        self._tracking = None
        self.local_v.clear()
        self._stash.clear()
        self._gradient_exchange()

    def _levels(self) -> Dict[Tensor, float]:
        """Each tensor's mean local variance, averaged over the ranks (one small fp32 all_reduce)."""
        params, means, work = self._launch_levels()
        if work is not None:
            work.wait()
        return dict(zip(params, means.tolist()))

    def _launch_levels(self) -> tuple:
        """``_levels``'s all_reduce, issued without waiting: (parameters, the means, its Work or None)."""
        params = [p for p in self.denominators if p in self.local_v]
        if not params:
            return [], torch.zeros(0), None
        means = torch.stack([self.local_v[p].mean() for p in params])
        return params, means, dist.all_reduce(means, group=self.group, async_op=True)

    def _finish_track(self) -> None:
        """Apply the level all_reduce the last step issued (before the next exchange reads the denominators)."""
        pending, self._tracking = self._tracking, None
        if pending is None:
            return
        params, means, work = pending
        if work is not None:
            work.wait()
        self._track(dict(zip(params, means.tolist())))

    def _track(self, levels: Dict[Tensor, float]) -> None:
        """Follow each tensor's variance level between refreshes: ``v_hat = base * level / level_then``.

        The levels' all_reduce is issued at the end of a step and applied at
        the first bucket of the next (:meth:`prepare`) or at a checkpoint:
        the same arithmetic as waiting for it at once, without a rank
        waiting at its step for the slowest one.
        """
        ratios: Dict[Tensor, Tensor] = {}
        if not self._level:  # resumed from a checkpoint: start following from here
            self._level = levels
            return
        with torch.no_grad():
            for p, level in levels.items():
                base, was = self._base.get(p), self._level.get(p)
                if base is None or not was or not level:
                    continue
                old = self.denominators[p]
                v_hat = base * (level / was)
                self.denominators[p] = v_hat.sqrt().add_(self._eps[p])
                ratios[p] = old / self.denominators[p]
                s = self.optimizer.state[p]
                s["exp_avg_sq"].copy_(v_hat * (1.0 - self.beta2 ** _step_of(s)))
        if self.precondition and ratios:
            self._rescale_exchange(ratios)

    def refresh_due(self, step: int) -> bool:
        """Whether the variance is refreshed after optimizer step ``step``.

        At 2, 4, 8, ... times the warm-up (the variance moves fast early),
        then every ``refresh_cap`` steps.
        """
        if step <= self.warmup_steps:
            return False
        if step >= self.refresh_cap:
            return step % self.refresh_cap == 0
        ratio, rest = divmod(step, self.warmup_steps)
        return rest == 0 and ratio & (ratio - 1) == 0

    def _freeze(self) -> None:
        """Switch: denominators from Adam's own ``v``, the exchange's momentum seeded, compression on."""
        seeds = []
        with torch.no_grad():
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    s = self.optimizer.state.get(p)
                    if not s or "exp_avg_sq" not in s:
                        continue
                    denom = frozen_denominator(s["exp_avg_sq"], _step_of(s), self.beta2, g["eps"], self.variance_floor)
                    self.denominators[p] = denom
                    self._base[p] = (denom - g["eps"]).square()
                    m = s["exp_avg"] / (1.0 - self.beta1)
                    seeds.append((p, m / denom if self.precondition else m))
        self._seed(seeds)
        if self.refresh:
            self._level = self._levels()
        self.state.momentum = self.beta1
        self.state.warmup_iters = self.state.step  # the next exchange compresses
        self.frozen = True
        log.info("Adam switched after %d steps: variance frozen, the exchange keeps the momentum (beta1=%g)",
                 self.steps, self.beta1)

    def _refresh(self) -> None:
        """``v_hat`` = the ranks' mean own variance times each tensor's noise ratio (module doc)."""
        params = [p for p in self.denominators if p in self.local_v and p in self._stash]
        if not params:
            return
        world = dist.get_world_size(self.group)
        # one bf16 all_reduce: every rank's variance and this step's local gradients
        flat = torch.cat([self.local_v[p] for p in params] + [self._stash[p].float() for p in params])
        sums = torch.stack([self._stash[p].float().pow(2).sum() for p in params])
        flat = flat.to(torch.bfloat16)
        dist.all_reduce(flat, group=self.group)
        dist.all_reduce(sums, group=self.group)
        flat = flat.float().div_(world)
        total = sum(p.numel() for p in params)
        old = dict(self.denominators)
        correction = 1.0 - self.beta2 ** self.steps
        with torch.no_grad():
            offset = 0
            for i, p in enumerate(params):
                n = p.numel()
                v = flat[offset:offset + n] / correction
                mean_g = flat[total + offset:total + offset + n]
                offset += n
                # E[mean_i g_i]^2 / E[g_i^2]: 1 when the ranks agree, 1/world when their gradients are noise
                local = float(sums[i]) / world
                ratio = min(1.0, max(1.0 / world, float(mean_g.pow(2).sum()) / local)) if local > 0 else 1.0
                v_hat = (v * ratio).view_as(p).to(p.dtype)
                if self.variance_floor > 0 and n:
                    v_hat = v_hat.clamp(min=self.variance_floor * float(v_hat.mean()))
                eps = next(g["eps"] for g in self.optimizer.param_groups if any(q is p for q in g["params"]))
                self.denominators[p] = v_hat.sqrt().add_(eps)
                self._base[p] = v_hat
                s = self.optimizer.state[p]
                s["exp_avg_sq"].copy_(v_hat * (1.0 - self.beta2 ** _step_of(s)))
            if self.precondition:  # the exchange's momentum and residuals are in the old units
                self._rescale_exchange({p: old[p] / self.denominators[p] for p in params})
        self._stash.clear()
        self._level = self._levels()
        self.refreshes += 1

    def _rescale_exchange(self, ratios: Dict[Tensor, Tensor]) -> None:
        """Multiply the exchange's per-element state (momentum, worker and server residuals) by ``ratios``.

        A state key whose segments are not all in ``ratios`` (tensors of
        another optimizer) is left alone; a served chunk takes its slice.
        """
        by_name = {self.state.names.name(p): r.reshape(-1) for p, r in ratios.items()}
        stores: List[tuple] = [(k, self.state.momentum_buffers.get(k)) for k in self.state.momentum_buffers.keys()]
        if self.state.error_feedback is not None:
            stores += [(k, self.state.error_feedback.residual(k)) for k in self.state.error_feedback.keys()]
        for key, buf in stores:
            parts = [by_name.get(name) for name, _ in key.segments]
            found = [r for r in parts if r is not None]
            if buf is None or len(found) < len(parts):
                continue
            ratio = torch.cat(found)
            if key.chunk is not None:
                ratio = ratio[key.chunk[0]:key.chunk[0] + key.chunk[1]]
            buf.view(-1).mul_(ratio.to(buf.dtype))

    def describe(self) -> str:
        return (f"{type(self.optimizer).__name__}: {self.warmup_steps} steps of full-precision warm-up, then the "
                f"momentum (beta1 {self.beta1:g}) over a variance refreshed "
                f"{'every ' + str(self.refresh_cap) + ' steps at most' if self.refresh else 'never'}, "
                "compressed in the exchange")

    def short(self) -> str:
        return f"{type(self.optimizer).__name__}: 1-bit Adam scheme, warm-up {self.warmup_steps}"

    def local_state_dict(self) -> Dict[str, Any]:
        """The base's, with everything the frozen step and the refreshes carry, per parameter.

        Per-parameter entries are lists in ``param_groups`` order (None where
        a parameter has none): the denominators as they are (recomputing them
        from ``exp_avg_sq`` would round differently and miss the floor), the
        local variances, and each tensor's ``v_hat`` and level of the last
        freeze or refresh, which the tracking between refreshes scales from.
        """
        self._finish_track()
        params = params_of(self.optimizer)
        per = lambda d: [None if d.get(p) is None else _plain(d[p]) for p in params]  # noqa: E731
        return {**super().local_state_dict(), "frozen": self.frozen, "refreshes": self.refreshes,
                "denominators": per(self.denominators), "local_v": per(self.local_v), "base": per(self._base),
                "level": per(self._level), "stash": per(self._stash)}

    def merge_parts(self, parts: List[Dict[str, Any]], rank: int) -> Dict[str, Any]:
        """The base's, with the mean of the ranks' local variances and stashed local gradients."""
        merged = super().merge_parts(parts, rank)
        for name in ("local_v", "stash"):
            if all(p.get(name) for p in parts):
                merged[name] = [mean_tensors(list(values)) for values in zip(*(p[name] for p in parts))]
        return merged

    def load_local_state_dict(self, saved: Dict[str, Any]) -> None:
        """Restore what :meth:`local_state_dict` returned (load the optimizer's own state as well)."""
        super().load_local_state_dict(saved)
        self._tracking = None
        self.frozen = bool(saved["frozen"])
        self.refreshes = int(saved.get("refreshes", 0))

        def tensors(name: str) -> Dict[Tensor, Tensor]:
            values = saved.get(name)
            return {p: v.clone() for p, v in _aligned(self.optimizer, values, name) if v is not None} if values else {}

        self.local_v = tensors("local_v")
        if "denominators" not in saved:  # an older checkpoint: the preconditioner from exp_avg_sq, to rounding
            self._denominators_from_optimizer()
            return
        self.denominators = tensors("denominators")
        self._base = tensors("base")
        self._stash = tensors("stash")
        self._level = {p: float(v) for p, v in _aligned(self.optimizer, saved["level"], "level") if v is not None}

    def _denominators_from_optimizer(self) -> None:
        """``exp_avg_sq`` is kept at ``v_hat * (1 - beta2**t)``: dividing recovers ``v_hat`` (rounded)."""
        self.denominators, self._base, self._level, self._stash = {}, {}, {}, {}
        if not self.frozen:
            return
        with torch.no_grad():
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    s = self.optimizer.state.get(p)
                    if s and "exp_avg_sq" in s:
                        self.denominators[p] = frozen_denominator(s["exp_avg_sq"], _step_of(s), self.beta2, g["eps"])
                        self._base[p] = (self.denominators[p] - g["eps"]).square()


def _plain(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, Tensor) else value


def _aligned(optimizer: torch.optim.Optimizer, values: List[Any], what: str) -> List[tuple]:
    """``(parameter, value)`` for a checkpoint's list in ``param_groups`` order; refuse another model."""
    params = params_of(optimizer)
    if len(values) != len(params):
        raise ValueError(f"the checkpoint's {what} holds {len(values)} parameters, the optimizer {len(params)}: "
                         "load a checkpoint of the same model and optimizer")
    return list(zip(params, values))


def _step_of(param_state: Dict[str, Any]) -> float:
    step = param_state["step"]
    return float(step.item() if isinstance(step, Tensor) else step)


def frozen_denominator(exp_avg_sq: Tensor, step: float, beta2: float, eps: float, floor: float = 0.0) -> Tensor:
    """``sqrt(v) / sqrt(1 - beta2**step) + eps``, as torch's Adam computes its denominator.

    ``floor`` > 0: ``v`` is first raised to at least ``floor`` times its mean
    over the tensor (coordinates the warm-up barely saw).
    """
    if floor > 0 and exp_avg_sq.numel():
        exp_avg_sq = exp_avg_sq.clamp(min=floor * float(exp_avg_sq.mean()))
    return (exp_avg_sq.sqrt() / math.sqrt(1.0 - beta2 ** step)).add_(eps)


def frozen_adam_step(optimizer: torch.optim.Optimizer, denominators: Dict[Tensor, Tensor],
                     max_update_rms: Optional[float] = None, preconditioned: bool = False) -> None:
    """One Adam/AdamW step with the variance frozen; ``.grad`` holds the sum-form momentum ``u``.

    Per parameter with a gradient (see the module doc for the formula)::

        t += 1;  p *= 1 - lr * wd  (AdamW);  exp_avg = (1 - beta1) u
        p -= lr / (1 - beta1**t) * exp_avg / denominator
        exp_avg_sq *= (1 - beta2**t) / (1 - beta2**(t-1))   (keeps exp_avg_sq / (1 - beta2**t) frozen)

    The parameters of a group that share a step count are updated together
    with ``torch._foreach_*`` ops (as torch's own ``foreach`` optimizers):
    a small model's step is a few kernel calls, not a few per tensor.

    Raises:
        RuntimeError: a parameter has a gradient but no frozen denominator
            (it got its first gradient after the freeze).
    """
    with torch.no_grad():
        for g in optimizer.param_groups:
            by_step: Dict[float, List[Tensor]] = {}
            for p in g["params"]:
                if p.grad is None:
                    continue
                if p not in denominators:
                    raise RuntimeError(f"a parameter of shape {tuple(p.shape)} got its first gradient after Adam's "
                                       "variance was frozen; it has no variance to precondition with")
                by_step.setdefault(_step_of(optimizer.state[p]) + 1.0, []).append(p)
            for t, params in by_step.items():
                _frozen_group_step(optimizer, g, params, t, denominators, max_update_rms, preconditioned)


def _frozen_group_step(optimizer: torch.optim.Optimizer, group: Dict[str, Any], params: List[Tensor], t: float,
                       denominators: Dict[Tensor, Tensor], max_update_rms: Optional[float],
                       preconditioned: bool) -> None:
    """:func:`frozen_adam_step` for the parameters of one group whose next step is ``t``."""
    lr, wd = float(group["lr"]), float(group["weight_decay"])
    beta1, beta2 = (float(b) for b in group["betas"])
    states = [optimizer.state[p] for p in params]
    grads = [p.grad for p in params]
    denoms = [denominators[p].view_as(p) for p in params]
    exp_avgs = [s["exp_avg"] for s in states]
    counters = [s["step"] for s in states if isinstance(s["step"], Tensor)]
    if counters:
        torch._foreach_add_(counters, 1)
    for s in states:
        if not isinstance(s["step"], Tensor):
            s["step"] = t
    if wd:
        torch._foreach_mul_(params, 1.0 - lr * wd)
    scale = 1.0 / (1.0 - beta1 ** t)
    if preconditioned:  # .grad holds u / denominator: the update itself
        updates = torch._foreach_mul(grads, 1.0 - beta1)  # type: ignore[arg-type]
        torch._foreach_copy_(exp_avgs, torch._foreach_mul(updates, denoms))
    else:
        torch._foreach_copy_(exp_avgs, torch._foreach_mul(grads, 1.0 - beta1))  # type: ignore[arg-type]
        updates = torch._foreach_div(exp_avgs, denoms)
    if max_update_rms is None:
        torch._foreach_add_(params, updates, alpha=-lr * scale)
    else:
        norms = torch._foreach_norm(updates)
        for p, update, norm in zip(params, updates, norms):
            step = scale
            if p.numel():
                rms = float(norm) * scale / math.sqrt(p.numel())
                if rms > max_update_rms:
                    step *= max_update_rms / rms
            p.add_(update, alpha=-lr * step)
    torch._foreach_mul_([s["exp_avg_sq"] for s in states], (1.0 - beta2 ** t) / (1.0 - beta2 ** (t - 1.0)))


def scheme_for(optimizer: torch.optim.Optimizer, state: CompressionState, adam_warmup: int = DEFAULT_ADAM_WARMUP,
               step_fn: Optional[Callable[..., Any]] = None, **adam: Any) -> OptimizerScheme:
    """The scheme for ``optimizer``: :class:`MomentumSGD` or :class:`FrozenVarianceAdam`.

    ``adam``: further arguments of :class:`FrozenVarianceAdam` (``variance_floor``,
    ``max_update_rms``, ``refresh``, ``group``).

    Raises:
        UnsupportedOptimizer: another optimizer, or a setting no scheme runs (the message says which).
    """
    kind = check_optimizer(optimizer)
    if kind == MomentumSGD.name:
        return MomentumSGD(optimizer, state, step_fn)
    return FrozenVarianceAdam(optimizer, state, adam_warmup, step_fn, **adam)


def params_of(optimizer: torch.optim.Optimizer) -> List[Tensor]:
    """The optimizer's parameters, in param-group order."""
    return [p for g in optimizer.param_groups for p in g["params"]]
