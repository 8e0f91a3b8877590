"""``LocalMomentsAdam``: Adam/AdamW under a 1-bit-class exchange for a script that clips its gradients.

A script that calls ``clip_grad_norm_(params, max_norm)`` between backward and
step means: scale the average gradient by ``c = min(1, max_norm / |g_avg|)``
before Adam sees it. :class:`~gradwire.exchange.schemes.FrozenVarianceAdam`
cannot honour that (``.grad`` holds the exchanged momentum), and giving the
script's AdamW a 1-bit decoded gradient (:meth:`OptimizerScheme.release`)
feeds the decoding noise into both of Adam's moments: on the GPT example that
clips, onebit ended 5-12% above sync's validation loss (benchmarks/README.md,
``onebit_clip_diagnosis.py``). This scheme keeps the noise out of the moments:

1. Backward exchanges nothing: each bucket keeps this rank's own gradient
   ``g_i`` (the DDP hook returns it as it is).
2. The clip's norm is the average gradient's. ``clip_grad_norm_`` asks
   :meth:`LocalMomentsAdam.global_norm` (the injection routes the total norm
   of the DDP's gradients here), which returns an estimate of ``|g_avg|``
   from one small all_reduce: every rank's ``|g_i|^2`` and a count sketch
   ``S g_i`` of ``sketch_size`` floats (one shared random bucket and sign
   per element). ``rho = |S g_avg|^2 / mean_i |S g_i|^2`` estimates how much
   of the ranks' gradients agree (1: identical, ``1/N``: independent noise);
   it is smoothed over steps (``rho_beta``) and the norm is
   ``sqrt(rho * mean_i |g_i|^2)``: exact local norms, a smoothed agreement.
   The script's own clip then scales ``.grad`` (this rank's gradient) by
   torch's factor for that norm, the same factor on every rank, so the
   average of the clipped gradients is the clipped average.
3. The step. Every rank runs Adam's moments on its own clipped gradient
   (``m_i``, ``v_i``, in the parameter's precision, at least fp32) and forms its Adam direction
   ``d_i = m_hat_i / (sqrt(v_hat_i) + eps)``. The directions are averaged by
   the compressed exchange (:class:`CompressionState`, error feedback on
   ``d_i``): elements of one Adam direction have nearly one magnitude, which a
   sign with one scale per block represents well, where raw gradients mix
   magnitudes by orders. A rank's ``v_i`` holds its own batch noise, larger
   than the average's by up to ``N``, so the averaged direction is divided by
   ``sqrt(rho)``. Every rank applies the same decoded average (AdamW's
   decoupled decay first, ``lr`` read from ``param_groups`` every step): the
   replicas stay identical.

The first step: under ``gradwire compare`` the injection keeps the first
step's buckets local until the script shows whether it clips by norm (a
script that does not gets them averaged exactly at its step, as the warm-up
would have), so the first step is compressed like the others and ``rho``
starts from that step's sketch. Made with ``exact_first=True`` (``.grad``
holding the exact average at the first step), that step's norm is torch's
own and its step torch's Adam step on the average, sent by no exchange.

Measured (``benchmarks/onebit_clip_diagnosis.py``, a replay of
``examples/gpt_adamw.py --steps 150 --clip 1.0`` at 2 ranks, seeds 0 and 1,
``onebit:allgather:block=64``): validation loss 1.5% and 1.7% above sync with
20.5x fewer bytes, where the script's AdamW on the decoded gradient was 4.7% and
4.5% above; blocks of 512 (``onebit``'s default) 3.1% and 2.8%. The sketch adds
``sketch_size + 2`` floats per step.

In a hand-written loop (``gradwire compare`` does all of this itself)::

    from gradwire.exchange import CompressionState, LocalMomentsAdam
    from gradwire.hooks import scheme_hook
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4, weight_decay=0.1)
    scheme = LocalMomentsAdam(opt, CompressionState("onebit:allgather:block=64"), exact_first=False)
    ddp.register_comm_hook(scheme, scheme_hook)          # buckets stay local
    for x, y in batches:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        params = list(ddp.parameters())
        norm = scheme.global_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
        scheme.step()                                    # instead of opt.step()

Traps:
- Only a clip by norm (``norm_type=2``) means the same here: a clip by value
  clamps each element of the average, which no rank holds; the injection keeps
  the released exchange for it.
- The norm the script sees (and logs) is an estimate: within a few percent of
  the average's on the GPT example; its agreement ``rho`` lags by about
  ``1 / (1 - rho_beta)`` steps.
- ``.grad`` after backward is this rank's gradient, not the average: a script
  that reads it for anything but the clip (a hand-written norm, a gradient
  logger) sees the local value.
- The exchange moves from backward to the step: it no longer overlaps
  backward (a 1-bit payload is small; on a fast network the step waits for it).
- The optimizer's own state is not used (its moments would be of one rank);
  checkpoints save :meth:`state_dict`, a collective gathering every rank's
  moments and residuals (:mod:`gradwire.exchange.checkpoint`).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from gradwire.compress.none import NoneCompressor

from .schemes import OptimizerScheme, UnsupportedOptimizer, check_optimizer, params_of
from .state import CompressionState

__all__ = ["SKETCH_SIZE", "LocalMomentsAdam", "sketch_ratio"]

#: floats in the count sketch of each rank's gradient (the agreement ``rho``)
SKETCH_SIZE = 256
#: smoothing of the agreement ``rho`` over steps
RHO_BETA = 0.9


def sketch_ratio(total: Tensor, world: int, sum_sketch_sq: float) -> float:
    """``|S g_avg|^2 / mean_i |S g_i|^2`` from the summed sketch, clamped to ``(0, 1]`` (pure).

    ``total`` is ``sum_i S g_i``; ``sum_sketch_sq`` is ``sum_i |S g_i|^2``.
    By Cauchy-Schwarz the exact ratio is at most 1; a sketch can overshoot.
    """
    if sum_sketch_sq <= 0.0:
        return 1.0
    ratio = float(total.double().square().sum()) / (world * sum_sketch_sq)
    return min(1.0, max(ratio, 1e-6))


class LocalMomentsAdam(OptimizerScheme):
    """Adam/AdamW with each rank's own moments and the Adam directions averaged compressed (module doc).

    Args:
        optimizer: the script's Adam or AdamW (``weight_decay`` decoupled, or 0).
        state: the compressed exchange (error feedback on; its momentum is set to 0).
        step_fn: unused (the scheme applies every step itself); kept for the common signature.
        sketch_size: floats of the count sketch (the agreement ``rho``).
        rho_beta: smoothing of ``rho`` over steps.
        seed: the sketch's buckets and signs (the same on every rank).
        exact_first: the first step's ``.grad`` holds the exact average already.
    """

    name = "LocalMomentsAdam"
    #: the DDP hook returns each rank's own bucket: the exchange happens in :meth:`step`
    local_gradients = True

    def __init__(self, optimizer: torch.optim.Optimizer, state: CompressionState,
                 step_fn: Optional[Callable[..., Any]] = None, sketch_size: int = SKETCH_SIZE,
                 rho_beta: float = RHO_BETA, seed: int = 0, exact_first: bool = True, delayed: bool = False) -> None:
        if check_optimizer(optimizer) != "FrozenVarianceAdam":
            raise UnsupportedOptimizer(f"LocalMomentsAdam runs torch.optim.Adam/AdamW, got {type(optimizer).__name__}")
        exact = isinstance(state.compressor, NoneCompressor)
        if not exact and (state.error_feedback is None or not state.compressor.averages):
            raise UnsupportedOptimizer(f"{state.compressor.name}: LocalMomentsAdam averages Adam directions "
                                       "with error feedback; this exchange has none (or votes)")
        if delayed and exact_first:
            raise ValueError("delayed=True applies this rank's own direction at once: exact_first must be False")
        if sketch_size < 1:
            raise ValueError(f"sketch_size must be >= 1 float, got {sketch_size}")
        if not 0.0 <= rho_beta < 1.0:
            raise ValueError(f"rho_beta must be in [0, 1), got {rho_beta}")
        super().__init__(optimizer, state, step_fn)
        self.beta1, self.beta2 = (float(b) for b in optimizer.param_groups[0]["betas"])
        self.sketch_size = int(sketch_size)
        self.rho_beta = float(rho_beta)
        self.seed = int(seed)
        #: the agreement of the ranks' gradients (None until measured)
        self.rho: Optional[float] = None
        #: the last norm returned, and the step it was measured at
        self.last_norm: Optional[float] = None
        self._measured_at = -1
        self._local_sq = 0.0
        self._exact = bool(exact_first)
        self.m: Dict[Tensor, Tensor] = {}
        self.v: Dict[Tensor, Tensor] = {}
        self._buckets: Dict[Tensor, Tensor] = {}
        #: apply this rank's own direction now and the average a step later (``delayed``'s form)
        self.delayed = bool(delayed)
        #: delayed: the exchange in flight, this rank's directions it carries and their scale
        self._pending: Optional[tuple] = None
        #: delayed: what each parameter is still owed (``D_{t-1} - s d_i,t-1``), once the average arrived
        self._owed: Dict[Tensor, Tensor] = {}
        #: encloses every wait for the network, given the tags of the background launches it waits for (a
        #: strategy's ``waiting``: the simulated clock observes them there, reports count exposed communication)
        self.waiting: Callable[..., ContextManager[Any]] = _no_context
        #: encloses a launch left in flight (``delayed``), yielding its tag (a strategy's ``background``: on the
        #: simulated clock only the wait for that tag observes it, so the next step's compute overlaps it)
        self.background: Callable[[], ContextManager[Any]] = _no_context
        state.momentum = 0.0
        state.momentum_buffers.clear()
        state.local_correction = False
        state.warmup_iters = 0

    # -- the clip's norm -----------------------------------------------------------
    def global_norm(self, grads: Sequence[Tensor], norm_type: float = 2.0) -> Tensor:
        """The norm of the average gradient, estimated (module doc, 2); a collective of every rank.

        Raises:
            UnsupportedOptimizer: ``norm_type`` is not 2 (the sketch estimates the L2 norm).
        """
        if float(norm_type) != 2.0:
            raise UnsupportedOptimizer(f"clip_grad_norm_ with norm_type={norm_type:g}: {self.name} estimates the "
                                       "average gradient's L2 norm; use norm_type=2 (the default)")
        grads = [g for g in grads if g is not None]
        local = float(_norm_sq(grads)) if grads else 0.0
        if self._exact:  # .grad holds the average: torch's own norm
            norm = math.sqrt(local)
        elif self._measured_at == self.steps and self._local_sq > 0.0:
            # asked again in the same step (a script that logs the norm, then clips): every rank's gradients
            # changed by the same factor (or not at all), so the average's norm did too; no second collective
            norm = (self.last_norm or 0.0) * math.sqrt(local / self._local_sq)
        else:
            norm = self._measure(grads)
        self.last_norm, self._measured_at, self._local_sq = norm, self.steps, local
        if not grads:
            return torch.tensor(norm)
        return torch.tensor(norm, dtype=grads[0].dtype, device=grads[0].device)  # as torch's total norm

    def _measure(self, grads: Sequence[Tensor]) -> float:
        """One all_reduce of the sketch and the squared norms; update ``rho``; the estimated norm.

        ``delayed``: the exchange in flight is waited for first (the step would wait for it next anyway):
        a two-phase exchange issues its second collective from a callback, and on the same group the
        sketch's all_reduce could otherwise be paired with it on one rank and not on another.
        """
        with torch.no_grad():
            self._settle()
        params = [p for p in params_of(self.optimizer) if p.grad is not None]
        k = self.sketch_size
        device = params[0].device if params else torch.device("cpu")
        buf = torch.zeros(2 * k + 2, dtype=torch.float64, device=device)
        with torch.no_grad():
            for p in params:
                buf[:2 * k].index_add_(0, self._bucket_of(p), _grad(p).reshape(-1).double())
            sketch = buf[:k] - buf[k:2 * k]  # a bucket in the upper half carries the sign -1
            out = torch.cat([sketch, torch.stack([_norm_sq(_grad(p) for p in params), sketch.square().sum()])])
        world = 1
        if dist.is_available() and dist.is_initialized():
            with self.waiting():
                dist.all_reduce(out, group=self.state.process_group)
            world = dist.get_world_size(self.state.process_group)
        ratio = sketch_ratio(out[:k], world, float(out[k + 1]))
        self.rho = ratio if self.rho is None else self.rho_beta * self.rho + (1.0 - self.rho_beta) * ratio
        return math.sqrt(self.rho * float(out[k]) / world)

    def _bucket_of(self, p: Tensor) -> Tensor:
        """Each element's sketch bucket in ``[0, 2k)`` (the upper half: sign -1), the same on every rank."""
        idx = self._buckets.get(p)
        if idx is None:
            position = next(i for i, q in enumerate(params_of(self.optimizer)) if q is p)
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + position)
            idx = torch.randint(0, 2 * self.sketch_size, (p.numel(),), generator=gen).to(p.device)
            self._buckets[p] = idx
        return idx

    # -- the step ------------------------------------------------------------------
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Moments on this rank's clipped gradient, the Adam directions averaged compressed, one update everywhere."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for p in params_of(self.optimizer) if p.grad is not None]
        if self._measured_at != self.steps and not self._exact:
            self._measure([_grad(p) for p in params])  # no clip this step: rho still follows
        t = self.steps + 1
        with torch.no_grad():
            directions = self._directions(params, t)
            flat = torch.cat([d.reshape(-1) for d in directions]) if directions else torch.zeros(0)
            scale = 1.0 / math.sqrt(self.rho) if self.rho is not None else 1.0
            if self._exact:
                pass
            elif self.delayed:
                flat = self._delayed_update(flat, params, scale)
            else:
                _, fut = self.state.reduce_params(flat, params, last=True)
                with self.waiting():
                    flat = fut.wait()
                self.state.end_step()
                flat.mul_(scale)
            self._apply(params, flat)
        self.steps += 1
        self._exact = False
        return loss

    def _delayed_update(self, flat: Tensor, params: List[Tensor], scale: float) -> Tensor:
        """``s_t d_i,t + (D_{t-1} - s_{t-1} d_i,t-1)``: launch this step's exchange, apply what the last one owes.

        Summed over steps, every rank has applied the same averages ``D_s``
        (``s_s`` times the decoded average of the ranks' directions) and its
        own latest scaled direction: the ranks differ by ``lr`` times their
        latest directions' differences, never accumulating (as ``delayed``).
        """
        own = flat.mul(scale)
        with self.background() as tag:
            _, fut = self.state.reduce_params(flat, params, last=True)
        self.state.end_step()
        self._settle()
        self._pending = (fut, own, scale, list(params), tag)
        update = own.clone()
        offset = 0
        for p in params:
            owed = self._owed.pop(p, None)
            if owed is not None:
                update[offset:offset + p.numel()].add_(owed)
            offset += p.numel()
        self._owed.clear()
        return update

    def _settle(self) -> None:
        """Wait for the exchange in flight and turn it into what each parameter is owed."""
        if self._pending is None:
            return
        fut, own, scale, params, tag = self._pending
        self._pending = None
        with self.waiting(*([] if tag is None else [tag])):
            done = fut.wait()
        owed = done.mul(scale).sub_(own)
        offset = 0
        for p in params:
            self._owed[p] = owed[offset:offset + p.numel()]
            offset += p.numel()

    def in_flight(self) -> List[Any]:
        """The exchange still in flight (``delayed``), for a caller about to tear the group down."""
        return [] if self._pending is None else [self._pending[0]]

    def finish(self) -> None:
        """``delayed``: apply what the last exchange owes at the last ``lr``, then average the parameters exactly,
        so that every rank ends with the same model (a collective; call it once after the last step)."""
        if not self.delayed:
            return
        with torch.no_grad():
            self._settle()
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    owed = self._owed.pop(p, None)
                    if owed is not None:
                        p.sub_(owed.view_as(p).to(p.dtype), alpha=float(g["lr"]))
            world = dist.get_world_size(self.state.process_group)
            for p in params_of(self.optimizer):
                dist.all_reduce(p.data, group=self.state.process_group)
                p.data.div_(world)

    def _directions(self, params: List[Tensor], t: int) -> List[Tensor]:
        """``m_hat_i / (sqrt(v_hat_i) + eps)`` per parameter, after this rank's moments took its gradient."""
        grads = [_grad(p).detach().reshape(-1).to(_moment_dtype(p)) for p in params]
        ms = [self._moment(self.m, p) for p in params]
        vs = [self._moment(self.v, p) for p in params]
        torch._foreach_mul_(ms, self.beta1)
        torch._foreach_add_(ms, grads, alpha=1.0 - self.beta1)
        torch._foreach_mul_(vs, self.beta2)
        torch._foreach_addcmul_(vs, grads, grads, value=1.0 - self.beta2)
        eps = {p: float(g["eps"]) for g in self.optimizer.param_groups for p in g["params"]}
        c1, c2 = 1.0 - self.beta1 ** t, math.sqrt(1.0 - self.beta2 ** t)
        return [m.div(v.sqrt().div_(c2).add_(eps[p])).div_(c1) for p, m, v in zip(params, ms, vs)]

    def _apply(self, params: List[Tensor], flat: Tensor) -> None:
        """``p *= 1 - lr wd; p -= lr d`` with each group's ``lr`` and decoupled ``weight_decay``."""
        offset: Dict[Tensor, int] = {}
        o = 0
        for p in params:
            offset[p] = o
            o += p.numel()
        for g in self.optimizer.param_groups:
            lr, wd = float(g["lr"]), float(g["weight_decay"])
            for p in g["params"]:
                if p not in offset:
                    continue
                if wd:
                    p.mul_(1.0 - lr * wd)
                d = flat[offset[p]:offset[p] + p.numel()].view_as(p)
                p.add_(d.to(p.dtype), alpha=-lr)

    @staticmethod
    def _moment(store: Dict[Tensor, Tensor], p: Tensor) -> Tensor:
        buf = store.get(p)
        if buf is None:
            buf = store[p] = torch.zeros(p.numel(), dtype=_moment_dtype(p), device=p.device)
        return buf

    # -- reports and checkpoints -------------------------------------------------------
    def describe(self) -> str:
        how = ("exactly" if isinstance(self.state.compressor, NoneCompressor)
               else f"by {self.state.compressor.name} with error feedback")
        late = ", applied a step late (this rank's own at once)" if self.delayed else ""
        return (f"{type(self.optimizer).__name__}: each rank's own moments of its clipped gradient, the Adam "
                f"directions averaged {how}{late}; the clip's norm estimated from a {self.sketch_size}-float sketch")

    def short(self) -> str:
        exact = isinstance(self.state.compressor, NoneCompressor)
        return f"Adam: rank moments, directions {'averaged' if exact else 'compressed'}" + (
            ", a step late" if self.delayed else "")

    def local_state_dict(self) -> Dict[str, Any]:
        """The base's, with this rank's moments (in ``param_groups`` order; None where absent) and ``rho``."""
        params = params_of(self.optimizer)
        with torch.no_grad():
            self._settle()  # delayed: the average in flight becomes what each parameter is owed
        return {**super().local_state_dict(), "rho": self.rho, "exact": self._exact,
                "m": [_copy(self.m.get(p)) for p in params], "v": [_copy(self.v.get(p)) for p in params],
                "owed": [_copy(self._owed.get(p)) for p in params]}

    def merge_parts(self, parts: List[Dict[str, Any]], rank: int) -> Dict[str, Any]:
        """For another world size: the ranks' mean moments (the base merges the exchange)."""
        merged = super().merge_parts(parts, rank)
        for name in ("m", "v", "owed"):
            columns = zip(*(part.get(name, [None] * len(part["m"])) for part in parts))
            merged[name] = [None if any(x is None for x in col) else torch.stack(col).mean(0) for col in columns]
        return merged

    def load_local_state_dict(self, saved: Dict[str, Any]) -> None:
        super().load_local_state_dict(saved)
        params = params_of(self.optimizer)
        for name, store in (("m", self.m), ("v", self.v), ("owed", self._owed)):
            if name not in saved:
                continue
            if len(saved[name]) != len(params):
                raise ValueError(f"the checkpoint's moments hold {len(saved[name])} parameters, the optimizer "
                                 f"{len(params)}: load a checkpoint of the same model and optimizer")
            store.clear()
            for p, value in zip(params, saved[name]):
                if value is not None:
                    store[p] = value.to(p.device, _moment_dtype(p)).clone()
        self.rho = saved["rho"]
        self._exact = bool(saved["exact"])


@contextlib.contextmanager
def _no_context(*tags: Any) -> Iterator[None]:
    """What :attr:`LocalMomentsAdam.waiting` and ``background`` are without a strategy: nothing (no tag)."""
    yield None


def _moment_dtype(p: Tensor) -> torch.dtype:
    """Moments in the parameter's precision, at least fp32 (torch's AdamW keeps them in the parameter's)."""
    return torch.promote_types(p.dtype, torch.float32)


def _grad(p: Tensor) -> Tensor:
    """``p.grad``, which the caller's filter on ``p.grad is not None`` guarantees."""
    assert p.grad is not None
    return p.grad


def _norm_sq(grads: Any) -> Tensor:
    """``sum |g|^2`` over the tensors, in float64, on their device."""
    squares = [g.detach().double().square().sum() for g in grads]
    return torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)


def _norm(grads: Sequence[Tensor]) -> float:
    return math.sqrt(float(_norm_sq(grads)))


def _copy(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.detach().clone()
