"""Compression under the user's optimizer: SGD with momentum, Adam and AdamW.

Error feedback in front of an optimizer's momentum collapses training
(:mod:`gradwire.hooks.state`): the exchange must own the momentum and compress
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
2. At the end of the warm-up the variance freezes. With ``v`` frozen, Adam's
   update is momentum SGD with a fixed diagonal preconditioner
   ``P = 1 / (sqrt(v_hat) + eps)``, and Adam's EMA momentum
   ``m = beta1 m + (1 - beta1) g`` is ``(1 - beta1)`` times the sum-form
   momentum ``u = beta1 u + g`` the exchange keeps. So the exchange takes the
   momentum (``state.momentum = beta1``), seeded with ``exp_avg / (1 - beta1)``
   so that nothing jumps, and compression starts.
3. Each later step applies, per parameter (``u`` arrives in ``.grad``)::

       p *= 1 - lr * wd                                  (AdamW's decoupled decay)
       exp_avg = (1 - beta1) * u
       p -= lr / (1 - beta1**t) * exp_avg / (sqrt(v_t0) / sqrt(1 - beta2**t0) + eps)

   which is torch's AdamW step with the variance held at its bias-corrected
   value at the freeze (step ``t0``). ``lr`` is read from ``param_groups``
   every step, so learning-rate schedulers keep working.

Bias correction (a choice, and why). DeepSpeed's 1-bit Adam applies none: it
freezes after thousands of steps, where ``1 - beta2**t0`` is 1. Here the
freeze may come after a hundred steps, where ``1 - 0.999**100 = 0.095``:
without the correction the preconditioner would be ``1/sqrt(0.095) = 3.2``
times too large. So ``v_hat = v_t0 / (1 - beta2**t0)`` is frozen, corrected
once, and held (torch's formula, if ``v`` merely stopped changing, would let
the correction decay towards the uncorrected value as ``t`` grows). The
momentum's correction ``1 - beta1**t`` is torch's, with ``t`` the optimizer's
own step count (it is 1 to within ``beta1**t0`` after any useful warm-up).

The optimizer's state stays meaningful for checkpoints: ``exp_avg`` holds
``(1 - beta1) * u``, ``step`` counts every step, and ``exp_avg_sq`` is kept at
``v_hat * (1 - beta2**t)``, so ``exp_avg_sq / (1 - beta2**t)``, what torch's
AdamW reads, is the frozen ``v_hat``: the checkpoint resumes in a plain AdamW
with the same preconditioner. Save :meth:`OptimizerScheme.state_dict` too
(the warm-up position and the exchange's momentum and residuals).

Warm-up length: the variance is worth freezing once it is stable; 1-bit
Adam spent 15-25% of training in warm-up. :data:`DEFAULT_ADAM_WARMUP` steps
is where the variance of the small models measured here had settled
(benchmarks/README.md); set it for your run.

Traps:
- Between ``backward()`` and the step, ``.grad`` holds the exchanged
  momentum ``u``, not the gradient: gradient clipping (``clip_grad_norm_``)
  would clip the momentum, about ``1 / (1 - beta)`` times larger than a
  gradient. Clip inside a hook of your own before the exchange, or not at all.
- Every parameter group must share one ``beta`` (``betas[0]`` for Adam): the
  exchange keeps one momentum.
- The scheme reads and writes ``param_groups`` once, at construction: an
  optimizer whose momentum is changed later by the script (a momentum
  schedule) is not followed.
- With local correction (the DDP hook's default) the ranks' parameters differ
  by ``lr`` times their residual differences; average them once when identical
  replicas matter (:mod:`gradwire.hooks.state`).
- Adam's step count ``t`` is per parameter in torch; all parameters of the
  DDP model step together here.

Example (a hand-written loop)::

    state = CompressionState("onebit")
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4, weight_decay=0.1)
    scheme = scheme_for(opt, state, adam_warmup=100)
    ddp.register_comm_hook(scheme, scheme_hook)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        scheme.step()                      # instead of opt.step()
"""
# No ``from __future__ import annotations`` here: DDP's register_comm_hook checks
# the hook's annotations against the real dist.GradBucket and Future[Tensor].
import logging
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from gradwire.compress import StateKey

from .hook import compression_hook
from .state import CompressionState

__all__ = [
    "DEFAULT_ADAM_WARMUP", "FrozenVarianceAdam", "MomentumSGD", "OptimizerScheme", "UnsupportedOptimizer",
    "check_optimizer", "scheme_for", "scheme_hook",
]

log = logging.getLogger(__name__)

#: optimizer steps of full-precision Adam before the variance freezes (see the module doc)
DEFAULT_ADAM_WARMUP = 100

#: warm-up of a state that waits for a scheme to switch compression on
_NEVER = sys.maxsize


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

    def _seed(self, params_and_values: Sequence[tuple]) -> None:
        """Install each parameter's momentum in the exchange (keyed by the parameter's segment name)."""
        for p, value in params_and_values:
            key = StateKey.of(self.state.names.name(p), p.numel())
            self.state.momentum_buffers.set(key, value.detach().reshape(-1).to(p.dtype).clone())

    def state_dict(self) -> Dict[str, Any]:
        """The scheme's position and the exchange's state (save it beside the optimizer's)."""
        return {"name": self.name, "steps": self.steps, "momentum": self.state.momentum,
                "warmup_iters": self.state.warmup_iters, "exchange": self.state.state_dict()}

    def load_state_dict(self, saved: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
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

    def describe(self) -> str:
        wd = f", weight_decay {'/'.join(f'{w:g}' for w in self.weight_decay)}" if self.weight_decay else ""
        return f"SGD: momentum {self.momentum:g}{wd} moved into the exchange"

    def short(self) -> str:
        return f"SGD: momentum {self.momentum:g}{' + decay' if self.weight_decay else ''} in the exchange"


class FrozenVarianceAdam(OptimizerScheme):
    """Adam/AdamW: full-precision warm-up, then frozen variance and the momentum in the exchange.

    Args:
        warmup_steps: optimizer steps of plain Adam before the freeze (>= 1).
    """

    name = "FrozenVarianceAdam"

    def __init__(self, optimizer: torch.optim.Optimizer, state: CompressionState,
                 warmup_steps: int = DEFAULT_ADAM_WARMUP, step_fn: Optional[Callable[..., Any]] = None,
                 variance_floor: float = 0.01, max_update_rms: Optional[float] = 1.0, refresh: bool = True,
                 group: Optional[dist.ProcessGroup] = None) -> None:
        if check_optimizer(optimizer) != self.name:
            raise UnsupportedOptimizer(f"FrozenVarianceAdam runs torch.optim.Adam/AdamW, got {type(optimizer).__name__}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (Adam needs a variance to freeze), got {warmup_steps}")
        if not state.compressor.averages:
            raise UnsupportedOptimizer(f"{state.compressor.name}'s exchange is a vote, not an average of the "
                                       "momentum, which the frozen-variance Adam step needs")
        super().__init__(optimizer, state, step_fn)
        self.beta1, self.beta2 = (float(b) for b in _group_value(optimizer, "betas", "betas"))
        self.warmup_steps = int(warmup_steps)
        self.variance_floor = float(variance_floor)
        self.max_update_rms = max_update_rms
        #: the frozen denominators ``sqrt(v_t0) / sqrt(1 - beta2**t0) + eps`` by parameter (after the freeze)
        self.denominators: Dict[Tensor, Tensor] = {}
        self.frozen = False
        self.refresh = bool(refresh) and dist.is_available() and dist.is_initialized()
        #: the group the refreshes average on (None: the default group); never one with collectives in flight
        self.group = group
        #: this rank's own second moment (EMA with beta2 of its local gradients, from prepare())
        self.local_v: Dict[Tensor, Tensor] = {}
        #: per parameter, mean exact v / mean local v at the freeze (local gradients carry more noise)
        self.correction: Dict[Tensor, float] = {}
        #: variance refreshes done after the freeze
        self.refreshes = 0
        # warm-up: plain averages of the gradients, no momentum in the exchange
        state.momentum = 0.0
        state.warmup_iters = _NEVER
        done = [int(_step_of(s)) for s in optimizer.state.values() if "step" in s]
        self.steps = max(done, default=0)  # a resumed optimizer: its steps count towards the warm-up
        if self.steps >= self.warmup_steps:
            self._freeze()

    def prepare(self, buffer: Tensor, params: Sequence[Tensor]) -> None:
        """Keep this rank's own variance: ``v_i = beta2 v_i + (1 - beta2) g_i^2`` from the bucket's local gradients."""
        if not self.refresh:
            return
        flat, offset = buffer.view(-1), 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                g = flat[offset:offset + n]
                v = self.local_v.get(p)
                if v is None:
                    v = self.local_v[p] = torch.zeros(n, dtype=torch.float32, device=p.device)
                v.mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
                offset += n

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
        frozen_adam_step(self.optimizer, self.denominators, self.max_update_rms)
        self.steps += 1
        if self.refresh and self._refresh_due():
            self._refresh()
        return loss

    def _refresh_due(self) -> bool:
        """At 2, 4, 8, ... times the warm-up: the variance changes fast early and slowly later."""
        ratio, rest = divmod(self.steps, self.warmup_steps)
        return rest == 0 and ratio >= 2 and ratio & (ratio - 1) == 0

    def _averaged_local_v(self) -> Dict[Tensor, Tensor]:
        """The ranks' mean local variance, bias-corrected (one bf16 all_reduce on ``self.group``)."""
        params = [p for p in self.denominators if p in self.local_v]
        if not params:
            return {}
        flat = torch.cat([self.local_v[p] for p in params]).to(torch.bfloat16)
        dist.all_reduce(flat, group=self.group)
        world = dist.get_world_size(self.group)
        flat = flat.float().div_(world * (1.0 - self.beta2 ** self.steps))
        out, offset = {}, 0
        for p in params:
            out[p] = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
        return out

    def _refresh(self) -> None:
        """Replace the frozen variance by the ranks' averaged own variance, scaled by the freeze's correction."""
        averaged = self._averaged_local_v()
        with torch.no_grad():
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    v = averaged.get(p)
                    if v is None:
                        continue
                    v_hat = v * self.correction.get(p, 1.0)
                    if self.variance_floor > 0 and v_hat.numel():
                        v_hat = v_hat.clamp(min=self.variance_floor * float(v_hat.mean()))
                    self.denominators[p] = v_hat.sqrt().add_(g["eps"])
                    s = self.optimizer.state[p]
                    s["exp_avg_sq"].copy_(v_hat * (1.0 - self.beta2 ** _step_of(s)))
        self.refreshes += 1

    def _freeze(self) -> None:
        """Freeze ``v_hat``, seed the exchange's momentum with ``exp_avg / (1 - beta1)``, start compressing."""
        seeds = []
        with torch.no_grad():
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    s = self.optimizer.state.get(p)
                    if not s or "exp_avg_sq" not in s:
                        continue
                    self.denominators[p] = frozen_denominator(s["exp_avg_sq"], _step_of(s), self.beta2, g["eps"],
                                                              self.variance_floor)
                    seeds.append((p, s["exp_avg"] / (1.0 - self.beta1)))
            if self.refresh:
                for p, local in self._averaged_local_v().items():
                    exact = float(self.optimizer.state[p]["exp_avg_sq"].mean()) / (1.0 - self.beta2 ** self.steps)
                    mean_local = float(local.mean())
                    self.correction[p] = exact / mean_local if mean_local > 0 else 1.0
        self._seed(seeds)
        self.state.momentum = self.beta1
        self.state.warmup_iters = self.state.step  # the next exchange compresses
        self.frozen = True
        log.info("variance frozen after %d steps; the exchange keeps the momentum (beta1=%g) and compresses",
                 self.steps, self.beta1)

    def describe(self) -> str:
        return (f"{type(self.optimizer).__name__}: {self.warmup_steps} steps of full-precision warm-up, then "
                f"variance frozen and momentum (beta1 {self.beta1:g}) compressed in the exchange")

    def short(self) -> str:
        return f"{type(self.optimizer).__name__}: frozen variance after {self.warmup_steps} steps"

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "frozen": self.frozen}

    def load_state_dict(self, saved: Dict[str, Any]) -> None:
        """Restore the position; the frozen denominators come back from the optimizer's own state."""
        super().load_state_dict(saved)
        self.frozen = False
        self.denominators = {}
        if saved["frozen"]:
            with torch.no_grad():
                for g in self.optimizer.param_groups:
                    for p in g["params"]:
                        s = self.optimizer.state.get(p)
                        if s and "exp_avg_sq" in s:
                            # exp_avg_sq was kept at v_hat * (1 - beta2**t): dividing recovers v_hat
                            self.denominators[p] = frozen_denominator(s["exp_avg_sq"], _step_of(s), self.beta2,
                                                                      g["eps"], self.variance_floor)
            self.frozen = True


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
                     max_update_rms: Optional[float] = None) -> None:
    """One Adam/AdamW step with the variance frozen; ``.grad`` holds the sum-form momentum ``u``.

    Per parameter with a gradient (see the module doc for the formula)::

        t += 1;  p *= 1 - lr * wd  (AdamW);  exp_avg = (1 - beta1) u
        p -= lr / (1 - beta1**t) * exp_avg / denominator
        exp_avg_sq *= (1 - beta2**t) / (1 - beta2**(t-1))   (keeps exp_avg_sq / (1 - beta2**t) frozen)

    Raises:
        RuntimeError: a parameter has a gradient but no frozen denominator
            (it got its first gradient after the freeze).
    """
    with torch.no_grad():
        for g in optimizer.param_groups:
            lr = float(g["lr"])
            wd = float(g["weight_decay"])
            beta1, beta2 = (float(b) for b in g["betas"])
            for p in g["params"]:
                if p.grad is None:
                    continue
                denom = denominators.get(p)
                if denom is None:
                    raise RuntimeError(f"a parameter of shape {tuple(p.shape)} got its first gradient after Adam's "
                                       "variance was frozen; it has no variance to precondition with")
                s = optimizer.state[p]
                t = _step_of(s) + 1.0
                if isinstance(s["step"], Tensor):
                    s["step"].add_(1)
                else:
                    s["step"] = t
                if wd:
                    p.mul_(1.0 - lr * wd)
                torch.mul(p.grad, 1.0 - beta1, out=s["exp_avg"])
                scale = 1.0 / (1.0 - beta1 ** t)
                if max_update_rms is not None and p.numel():
                    rms = float((s["exp_avg"] / denom).norm()) * scale / math.sqrt(p.numel())
                    if rms > max_update_rms:
                        scale *= max_update_rms / rms
                p.addcdiv_(s["exp_avg"], denom, value=-lr * scale)
                s["exp_avg_sq"].mul_((1.0 - beta2 ** t) / (1.0 - beta2 ** (t - 1.0)))


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


def scheme_hook(scheme: OptimizerScheme, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: :meth:`OptimizerScheme.prepare` the bucket, then :func:`compression_hook` on its state."""
    scheme.prepare(bucket.buffer(), bucket.parameters())
    return compression_hook(scheme.state, bucket)


def params_of(optimizer: torch.optim.Optimizer) -> List[Tensor]:
    """The optimizer's parameters, in param-group order."""
    return [p for g in optimizer.param_groups for p in g["params"]]
