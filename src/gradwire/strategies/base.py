"""What every strategy shares: the loop contract, exposed-time accounting, flat reduction.

The contract a training loop follows (``gradwire.train.loop`` does exactly this)::

    strategy = build_strategy("onebit+delayed", momentum=0.9)
    module = strategy.wrap(model)            # DDP for sync; the model itself otherwise
    opt = SGD(model.parameters(), lr, momentum=strategy.optimizer_momentum)
    strategy.attach(opt)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(module(x), y).backward()
        strategy.step(opt)                   # communicates, then opt.step() (or not)
        waits = strategy.pop_waits()         # (start, end) of every wait of this step
    strategy.finish(opt)                     # drain: every rank ends with the same model

Exposed communication is the time the training thread spent *waiting* for a
collective: everything a strategy waits on goes through :meth:`Strategy.waiting`,
which keeps each wait as a ``(start, end)`` window (``time.perf_counter()``
seconds, the backend's realtime clock). DDP waits inside ``backward()`` in
C++, so ``sync`` records its window differently (see
:mod:`gradwire.strategies.sync`). A wait is not all network: the other rank may
reach the collective late (CPU contention) and compression callbacks take CPU
time; :func:`gradwire.strategies.metrics.split_exposed` splits the windows by
the backend's event log.

Momentum and compression: error feedback feeding a momentum optimizer
collapses training (:mod:`gradwire.exchange.state`). With a compressor, gradient
strategies let their :class:`~gradwire.exchange.CompressionState` keep the
momentum (``m = beta m + g``, compress ``m``) and the optimizer runs without
it: ``optimizer_momentum`` says which.
"""
from __future__ import annotations

import enum
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, ClassVar, Iterator, Mapping, Protocol, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire import backend
from gradwire.exchange import CompressionState, Compressor, get_compressor
from gradwire.exchange.state import warmup_steps

from .clipping import GradientClip

__all__ = ["CannotApply", "DDPAttachment", "ExchangeModel", "ExchangeTraits", "Strategy", "Timing", "average_parameters",
           "broadcast_module", "flatten", "group_timeout", "unflatten_into"]


class Timing(enum.Enum):
    """Where a strategy's exchanges sit in a training step: what ``gradwire predict`` replays."""

    #: DDP buckets, each exchanged during backward; ``backward()`` waits for the last one
    BLOCKING = "blocking"
    #: the same exchanges, each waited for after the *next* step's backward
    NEXT_STEP = "next_step"
    #: one exchange of every parameter every H steps, blocking
    AVERAGE = "average"
    #: one exchange of every parameter every H steps, overlapped with the next steps
    AVERAGE_OVERLAPPED = "average_overlapped"


class ExchangeModel(Protocol):
    """A comm hook of someone else's, as ``gradwire predict`` replays one bucket's exchange of it.

    gradwire's own hook is replayed from its compressor (the pattern and the
    stages of :class:`~gradwire.exchange.CompressionState`); a hook that is not
    gradwire's says here which collectives it issues, in order, and what
    tensor work it does before, between and after them, as plain callables
    that need no process group (predict times them on the machine).
    """

    @property
    def name(self) -> str:
        """Names the exchange and its parameters (a calibration's records are kept by it)."""
        ...

    def __hash__(self) -> int:
        ...

    def collectives(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int) -> list[tuple[str, int]]:
        """``(op, bytes)`` of each collective for a bucket of ``numel`` elements (``shapes``: its parameters',
        in bucket order; empty when unknown), bytes in the nccl-tests convention of each op."""
        ...

    def stages(self, numel: int, shapes: Sequence[tuple[int, ...]], world: int,
               device: str) -> list[Callable[[], object]]:
        """One more callable than :meth:`collectives`: the hook's work before the first collective (on the
        training thread), between each two (a completion callback) and after the last (the decode)."""
        ...


@dataclass(frozen=True)
class ExchangeTraits:
    """What a strategy's exchange of a DDP bucket really does, for ``gradwire predict`` to replay it.

    Every strategy answers with one of these (:meth:`Strategy.exchange_traits`),
    so predict never asks for a strategy by name.
    """

    codec: str | ExchangeModel | None
    """each bucket's exchange: a gradwire compressor's name (the compressor's pattern and CPU work, as
    :class:`~gradwire.exchange.CompressionState` runs them), an :class:`ExchangeModel` for a hook of someone
    else's, or None for DDP's plain all_reduce"""
    bucket_cap_mb: float | None = None
    """the ``bucket_cap_mb`` the strategy builds its DDP with (None: DDP's default). Trap: DDP caps the
    first bucket at 1 MiB only when the cap is left to it; an explicit cap applies to every bucket"""
    warmup_steps: int = 0
    """steps at the start of training whose buckets take the plain all_reduce instead of ``codec``"""
    one_bucket_at_a_time: bool = False
    """bucket k's hook runs only once bucket k-1's exchange completed
    (:func:`gradwire.exchange.futures.one_bucket_at_a_time`): no two exchanges overlap"""
    copies: int = 0
    """passes over each bucket the strategy makes on the training thread outside its comm hook (an update's
    add and subtract); the hook's own work is the codec's, or measured with the hook"""


class CannotApply(RuntimeError):
    """The strategy cannot run on what the script built; the message is the reason, in the user's terms."""


@dataclass
class DDPAttachment:
    """What a strategy puts on a DDP model that a script built itself (:meth:`Strategy.attach_ddp`)."""

    #: the comm hook to register, with its state; None leaves DDP's own all_reduce
    hook: Callable[[Any, dist.GradBucket], Future] | None
    state: Any
    #: what was applied, in words (the comparison's table)
    description: str


def flatten(tensors: Sequence[Tensor]) -> Tensor:
    """A new contiguous 1-D copy of ``tensors`` (so later writes to them cannot race a send)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def unflatten_into(flat: Tensor, tensors: Sequence[Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``tensors`` (in place)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


def group_timeout(group: dist.ProcessGroup | None = None) -> timedelta | None:
    """The timeout ``group``'s collectives run under (None when the backend does not say).

    A group made with ``dist.new_group`` and no timeout gets the backend's
    default (30 minutes for gloo), not its parent's: a strategy that makes a
    group of its own passes this on, so a stalled peer fails it as soon as
    it fails the training's group.
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    timeout = getattr(pg, "timeout", None) or getattr(pg, "_timeout", None)
    if isinstance(timeout, timedelta):
        return timeout
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (RuntimeError, AttributeError):
        return None


def average_parameters(params: Sequence[Tensor], group: dist.ProcessGroup | None = None) -> Tensor:
    """Replace ``params`` by their exact (uncompressed, blocking) average over ``group``; return it flat."""
    with torch.no_grad():
        x = flatten(params)
        dist.all_reduce(x, group=group)
        x.div_(dist.get_world_size(group))
        unflatten_into(x, params)
    return x


#: how many :func:`strategy_optimizers` blocks are open (optimizers made in one are a strategy's own)
_OWN_OPTIMIZERS = 0


@contextmanager
def strategy_optimizers() -> Iterator[None]:
    """Optimizers made in this block are a strategy's own (an outer optimizer), not the script's.

    A script's injection (:mod:`gradwire.compare.inject`) looks for the one
    optimizer that steps the DDP's parameters and refuses a second; a
    strategy's outer optimizer holds the same parameters and must not count.
    """
    global _OWN_OPTIMIZERS
    _OWN_OPTIMIZERS += 1
    try:
        yield
    finally:
        _OWN_OPTIMIZERS -= 1


def making_strategy_optimizer() -> bool:
    """Whether an optimizer made now is a strategy's own (:func:`strategy_optimizers`)."""
    return _OWN_OPTIMIZERS > 0


def broadcast_module(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Give every rank the parameters and buffers of the group's first rank."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


class Strategy:
    """Base class of the strategies; see the module docstring for the loop contract.

    Subclasses set ``name`` and implement :meth:`step`; most override
    :meth:`wrap` and :meth:`finish`.
    """

    name = "base"
    #: whether the strategy communicates gradients (True) or parameters (False)
    averages_gradients = True

    # -- traits: what the rest of gradwire asks of a strategy (the registry entry reads them) ------
    #: how ``gradwire predict`` prices a step; None: predict cannot price it
    timing: ClassVar[Timing | None] = None
    #: whether every optimizer step goes through :meth:`step` (which ends in the optimizer's own)
    owns_step: ClassVar[bool] = True
    #: whether a compressor's exchange owns the optimizer's momentum (an optimizer scheme splits it)
    compressor_owns_momentum: ClassVar[bool] = True
    #: DDP constructor arguments the strategy needs when it runs on a script's own DDP
    ddp_arguments: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def exchange_traits(cls, params: Mapping[str, float], compressor: str | None) -> ExchangeTraits:
        """What the exchange of each bucket does (:class:`ExchangeTraits`), for ``parse_strategy``'s parameters.

        The default: ``compressor`` through :class:`~gradwire.exchange.CompressionState`, with its warm-up.
        """
        return ExchangeTraits(compressor, warmup_steps=warmup_steps(compressor))

    def __init__(self, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        #: the compressor (parsed once, here, when given by name); None: uncompressed
        self.compressor: Compressor | None = None if compressor is None else get_compressor(compressor)
        self.momentum = momentum
        self.group = group
        self.steps = 0
        self._waits: list[tuple[float, float]] = []
        self.params: list[nn.Parameter] = []

    @property
    def optimizer_momentum(self) -> float:
        """Momentum the optimizer should use: 0 when a compressing strategy owns it."""
        if self.compressor is not None and self.averages_gradients:
            return 0.0
        return self.momentum

    def exchange_state(self, group: dist.ProcessGroup | None, momentum: float = 0.0) -> CompressionState:
        """The exchange this strategy averages through: its compressor, or the plain average without one.

        Every rank applies the same average (no local correction): the
        strategies that use it keep identical replicas, or correct locally
        in their own way (``delayed``).
        """
        return CompressionState("none" if self.compressor is None else self.compressor, group,
                                momentum=momentum, local_correction=False)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Prepare ``model`` (identical start on every rank); return the module to call forward on."""
        broadcast_module(model, self.group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        return model

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook into the optimizer (e.g. to refuse a step with gradients in flight)."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Communicate after ``backward()`` and step the optimizer (or deliberately not)."""
        raise NotImplementedError

    # -- on a script's own DDP (``gradwire compare -- CMD``) ------------------------------------
    def dedicated_group(self) -> dist.ProcessGroup:
        """A new group of ``self.group``'s ranks for the strategy's own collectives.

        Trap: gloo pairs collectives by the order each rank issues them. DDP
        issues collectives of its own on its group from the autograd thread
        (the unused-parameter map with ``find_unused_parameters=True``, the
        buffers with ``broadcast_buffers``), while an exchange issues its
        second phase from a completion callback on another thread: on one
        group the ranks could pair different collectives and hang (on plain
        gloo too). On a group of its own the exchange keeps its one order
        (:class:`gradwire.exchange.futures.Sequencer`) and DDP keeps its. The
        simulated network prices both on the ranks' one link. Every rank must
        call this at the same point (it runs ``dist.new_group``).
        """
        ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
        return dist.new_group(ranks, timeout=group_timeout(self.group))

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        """Run on ``ddp``, which the script built; return the comm hook to register (if any).

        Raises:
            CannotApply: the strategy cannot run on this DDP (the reason says why).
        """
        raise CannotApply(f"strategy {self.name} cannot be applied to a script's own DDP")

    def scheme_exchange(self) -> CompressionState | None:
        """The compressed exchange whose momentum an optimizer scheme hands over, once attached."""
        return None

    def check_optimizer(self, optimizer: torch.optim.Optimizer, scheme: bool) -> None:
        """Raise :class:`CannotApply` when this strategy cannot step ``optimizer`` (``scheme``: one splits it)."""
        if self.owns_step and isinstance(optimizer, torch.optim.LBFGS):
            raise CannotApply(f"{type(optimizer).__name__} evaluates its closure several times per step; "
                              f"{self.name} owns the step and averages one gradient per step: use sync")

    def grads_read(self, scheme: bool) -> None:
        """Called when the script reads ``.grad`` between backward and step (gradient clipping).

        Make ``.grad`` hold what the script means (the average gradient the
        step will use, compressed as the strategy compresses it) or raise
        :class:`CannotApply` with the reason. ``scheme``: an optimizer scheme
        still owns the momentum, so ``.grad`` holds the exchanged momentum,
        not a gradient (the injection gives the optimizer back first,
        :meth:`~gradwire.exchange.schemes.OptimizerScheme.release`, and
        passes False once it has).
        """
        if scheme:
            raise CannotApply("the script reads .grad between backward and step (gradient clipping), but under "
                              f"{self.compressor.name if self.compressor else self.name} it holds the exchanged "
                              "momentum, not the gradient; clipping it would not clip what the script means. "
                              "Clip from the first step, or use a strategy without a compressor")

    def clipped(self, clip: GradientClip) -> None:
        """Called after the script clipped ``.grad`` (``clip``: how), before its step.

        Nothing to do where the step applies ``.grad`` as the script left it;
        a strategy that applies something else (``delayed``: the average one
        step later) applies the same clip to that.
        """

    def grad_scaler(self, scheme: bool) -> None:
        """Called when a ``GradScaler`` unscales the gradients; raise :class:`CannotApply` if that is wrong here."""
        if scheme:
            raise CannotApply("a GradScaler scales the loss, so the exchange's momentum and error feedback would "
                              "mix scaled gradients of changing scale (and keep the inf/NaN of a skipped step); "
                              "use bf16 autocast without a scaler, or a strategy without a compressor")

    def accumulates(self) -> None:
        """Called when the script enters ``DDP.no_sync()``; raise :class:`CannotApply` if accumulation is wrong here."""

    def close(self) -> None:
        """Release what the strategy started besides collectives (servers, threads), after its last step.

        A script's own loop (``gradwire compare -- CMD``) has no place for
        :meth:`finish`; the injection calls this before the process group goes.
        """

    def in_flight(self) -> list[Future]:
        """Futures of collectives this strategy still has in flight (waited for before the group goes)."""
        return []

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        """Wait for what is in flight and leave every rank with the same parameters."""

    @contextmanager
    def background(self) -> Iterator[Any]:
        """Launch the enclosed exchanges in the background; yields the tag to hand :meth:`waiting` later.

        On the simulated clock such ops are observed only where the strategy
        waits for them (:mod:`gradwire.backend.simclock`): issued inside a
        DDP hook, they would otherwise be taken as waited for at the end of
        backward, and the overlap would not be credited.
        """
        with backend.detached(self.name) as tag:
            yield tag

    @contextmanager
    def waiting(self, *tags: Any) -> Iterator[None]:
        """Count the enclosed time as exposed communication (one wait window).

        ``tags``: the :meth:`background` launches waited for; on the simulated
        clock the rank's time moves to their end here, and to the end of any
        other op it waited for in the block.
        """
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._waits.append((t0, time.perf_counter()))
            for tag in tags:
                backend.observe(tag)
            backend.observe()  # the ops waited for in the block that no tag names

    def add_wait(self, start: float, end: float) -> None:
        """Record a wait measured elsewhere (``time.perf_counter()`` seconds)."""
        if end > start:
            self._waits.append((start, end))

    def pop_waits(self) -> list[tuple[float, float]]:
        """The wait windows since the last call (the loop calls it once per step)."""
        out, self._waits = self._waits, []
        return out

    def pop_exposed(self) -> float:
        """Seconds waited since the last call (consumes the same windows as :meth:`pop_waits`)."""
        return sum(end - start for start, end in self.pop_waits())

    def grads(self) -> list[Tensor]:
        """This rank's gradients, zeros for parameters that got none (every rank sends the same layout)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        return grads

    def __repr__(self) -> str:
        comp = f"{self.compressor.name}+" if self.compressor is not None else ""
        return f"<strategy {comp}{self.name}>"
