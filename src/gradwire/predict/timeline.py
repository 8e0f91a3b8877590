"""What one training step of one rank is made of, independent of the network: a :class:`StepProfile`.

A DDP step, as the step model sees it (times in seconds):

1. ``forward``: everything before ``backward()`` is called (zero_grad, the
   data, forward, the loss);
2. ``backward``: backward's own compute, from its call to its last gradient.
   During it, DDP's buckets become ready one after another: bucket ``i`` at
   ``buckets[i].ready`` seconds after backward started. Both leave out the
   time comm hooks spent (compression), so that the same profile serves every
   strategy: the step model adds the encode cost of the strategy it prices;
3. ``optimizer``: what follows backward's return until the next step
   (DDP's copy of the averaged buckets back, a strategy's own step work, the
   optimizer), less any waiting for communication.

A step is an optimizer step. With gradient accumulation (``accumulate``
micro-steps per optimizer step, all but the last without synchronising the
gradients: ``no_sync()``), ``micro`` seconds of forward and backward run
``accumulate - 1`` times before the three phases above, which are the
synchronising micro-step's; nothing is communicated during them.
:meth:`StepProfile.accumulating` makes the what-if of another count.

A profile comes from a measured run (``gradwire profile``, or the short
loopback run ``gradwire predict`` makes of the bundled models), or from a
described model (:mod:`gradwire.predict.describe`: parameter layout on the meta
device, backward time given). A measured profile may also carry
:class:`MeasuredExchange` rows: what the run's own exchanges cost besides the
network (the hook's time, the callbacks between collectives, the real inner
collective's duration), used when the strategy priced is the one that ran.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["Bucket", "MeasuredExchange", "StepProfile"]


def _finite(value: Any, what: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{what} must be > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Bucket:
    """One DDP gradient bucket: its size and when backward makes it ready."""

    nbytes: int
    """bytes of the bucket's gradient buffer"""
    ready: float
    """seconds after backward starts when its last gradient is ready (hooks' own time left out)"""
    element_size: int = 4
    """bytes per gradient element (4 for fp32)"""
    shapes: tuple[tuple[int, ...], ...] = ()
    """its parameters' shapes, in bucket order (a described model's; empty when only the size was recorded)"""

    def __post_init__(self) -> None:
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise ValueError(f"bucket nbytes must be an int >= 0, got {self.nbytes!r}")
        object.__setattr__(self, "shapes", tuple(tuple(int(d) for d in s) for s in self.shapes))
        if self.shapes and sum(math.prod(s) for s in self.shapes) * self.element_size != self.nbytes:
            raise ValueError(f"bucket of {self.nbytes} bytes holds parameters of shapes {self.shapes}, "
                             f"{sum(math.prod(s) for s in self.shapes)} elements of {self.element_size} bytes")
        _finite(self.ready, "bucket ready time")
        if self.element_size not in (1, 2, 4, 8):
            raise ValueError(f"bucket element_size must be 1, 2, 4 or 8 bytes, got {self.element_size!r}")

    @property
    def numel(self) -> int:
        return self.nbytes // self.element_size


@dataclass(frozen=True)
class MeasuredExchange:
    """What one bucket's exchange cost in the profiled run, the network aside (medians over steps)."""

    ops: tuple[str, ...]
    """the collectives it issued, in order"""
    hook: float
    """seconds the comm hook took on the training thread (encode, momentum, error feedback)"""
    inner: tuple[float, ...]
    """per collective: seconds from its issue to the end of the real inner op (a floor on any network)"""
    gaps: tuple[float, ...]
    """per collective after the first: seconds from the previous one's completion to its issue (callbacks)"""
    tail: float | None = None
    """seconds from the last collective's completion to the hook's future completing (decode); None: not seen"""
    lead: float = 0.0
    """seconds from the hook's return (or, if later, the previous exchange's first collective) to its first
    collective's issue: the hook's work that did not run on the training thread. On the simulated clock a hook
    chained behind the previous bucket's (PyTorch's PowerSGD, one bucket at a time) is priced on the
    communication side: ``hook`` reads 0 and its compression is here. About 0 for a hook that issues at once"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "inner", tuple(float(v) for v in self.inner))
        object.__setattr__(self, "gaps", tuple(float(v) for v in self.gaps))
        if len(self.inner) != len(self.ops) or len(self.gaps) != max(0, len(self.ops) - 1):
            raise ValueError(f"a measured exchange of {len(self.ops)} collectives needs as many inner times and "
                             f"one gap fewer, got {len(self.inner)} and {len(self.gaps)}")
        for v in (self.hook, self.lead, *self.inner, *self.gaps, *(() if self.tail is None else (self.tail,))):
            _finite(v, "a measured exchange time")


@dataclass
class StepProfile:
    """One rank's step without communication, and the buckets it hands to DDP (module doc)."""

    name: str
    """what was profiled: a model name, a script, a factory"""
    forward: float
    backward: float
    optimizer: float
    buckets: tuple[Bucket, ...]
    world: int = 1
    """ranks of the measured run (1 for a described model)"""
    strategy: str | None = None
    """the strategy the measured run used; its exchanges are in ``exchanges``"""
    exchanges: tuple[MeasuredExchange, ...] | None = None
    """one per bucket, for ``strategy`` (None: nothing measured)"""
    batch_size: int | None = None
    """samples per rank per step, for throughput (None: unknown)"""
    source: str = "described"
    """measured (a loopback run of a bundled model), profile (gradwire profile) or described"""
    loop_seconds: float | None = None
    """the measured run's median step (None: not measured)"""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """how the profile was made (the spread of compute, the bucket rule), for reports"""
    stretch: float = 1.0
    """the factor :func:`gradwire.predict.model.calibrated` multiplied its backward by (its every CPU time,
    ``1 / shared``, when its ranks shared cores); 1.0: not calibrated"""
    net: str | None = None
    """the network spec the measured run ran on (None: described, or not recorded)"""
    shared: float = 1.0
    """ranks per CPU core in the measured run, when more than one rank computed on each core of a host
    (CPU training, more ranks than cores): their compute ran that much slower than with a core each"""
    accumulate: int = 1
    """micro-steps (backward passes) per optimizer step: gradient accumulation; 1: none"""
    micro: float | None = None
    """seconds of one micro-step that does not synchronise (its forward and backward) on a typical rank, as
    recorded (for a run without accumulation: its typical forward + backward, before
    :func:`~gradwire.predict.calibrated` stretched them); None: not recorded (forward + backward stand in)"""
    finalize: float = 0.0
    """seconds of ``optimizer`` that are DDP's copy of the exchanged buckets into the gradients (its
    ``finalize_backward``), as recorded. The simulated cluster clock charges that copy before it observes the
    exchange, so a profile recorded on it replays the copy beside the exchange (:attr:`on_sim_clock`)"""

    def __post_init__(self) -> None:
        self.forward = _finite(self.forward, "forward seconds")
        self.backward = _finite(self.backward, "backward seconds")
        self.optimizer = _finite(self.optimizer, "optimizer seconds")
        self.buckets = tuple(b if isinstance(b, Bucket) else Bucket(**b) for b in self.buckets)
        if not self.buckets:
            raise ValueError(f"profile {self.name!r} has no gradient buckets: nothing is communicated, "
                             "so there is nothing to predict (a model with no trainable parameters?)")
        if isinstance(self.world, bool) or not isinstance(self.world, int) or self.world < 1:
            raise ValueError(f"profile world must be an int >= 1, got {self.world!r}")
        if self.exchanges is not None:
            self.exchanges = tuple(e if isinstance(e, MeasuredExchange) else MeasuredExchange(**e)
                                   for e in self.exchanges)
            if len(self.exchanges) != len(self.buckets):
                raise ValueError(f"profile {self.name!r}: {len(self.exchanges)} measured exchanges for "
                                 f"{len(self.buckets)} buckets")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.loop_seconds is not None:
            _finite(self.loop_seconds, "loop_seconds")
        self.notes = tuple(self.notes)
        if _finite(self.shared, "shared (ranks per core)") < 1:
            raise ValueError(f"shared (ranks per core) must be >= 1, got {self.shared!r}")
        if isinstance(self.accumulate, bool) or not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise ValueError(f"accumulate (micro-steps per optimizer step) must be an int >= 1, got "
                             f"{self.accumulate!r}")
        if self.micro is not None:
            self.micro = _finite(self.micro, "micro-step seconds")
        self.finalize = min(_finite(self.finalize, "finalize seconds"), self.optimizer)
        last = max(b.ready for b in self.buckets)
        if last > self.backward * (1 + 1e-9) + 1e-12:
            raise ValueError(f"profile {self.name!r}: a bucket is ready {last:g} s into a backward of "
                             f"{self.backward:g} s")

    @property
    def on_sim_clock(self) -> bool:
        """Whether the run was recorded on the simulated cluster clock (its network's ``clock=sim``)."""
        if self.net is None:
            return False
        from gradwire.net import NetSpec

        try:
            return NetSpec.of(self.net).clock == "sim"
        except ValueError:
            return False

    def scaled(self, factor: float) -> "StepProfile":
        """Every time of the step times ``factor``: compute, ready times, the exchanges' CPU and real
        collectives, the run's own step (the same run on a host ``factor`` times slower)."""
        from dataclasses import replace

        exchanges = None if self.exchanges is None else tuple(
            MeasuredExchange(e.ops, e.hook * factor, tuple(t * factor for t in e.inner),
                             tuple(t * factor for t in e.gaps), None if e.tail is None else e.tail * factor,
                             e.lead * factor)
            for e in self.exchanges)
        return replace(self, forward=self.forward * factor, backward=self.backward * factor,
                       optimizer=self.optimizer * factor, exchanges=exchanges, finalize=self.finalize * factor,
                       micro=None if self.micro is None else self.micro * factor,
                       buckets=tuple(replace(b, ready=b.ready * factor) for b in self.buckets),
                       loop_seconds=None if self.loop_seconds is None else self.loop_seconds * factor)

    def accumulating(self, n: int) -> "StepProfile":
        """The what-if of ``n`` micro-steps per optimizer step: the same micro-step, ``n`` times.

        The micro-step that does not synchronise is the recorded one, or,
        when none was recorded (a job without accumulation), the
        synchronising one's forward + backward. The run's own step
        (``loop_seconds``) describes another job and is dropped.
        """
        from dataclasses import replace

        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"accumulate must be an integer >= 1 (micro-steps per optimizer step; 1: no "
                             f"accumulation), got {n!r}")
        if n == self.accumulate:
            return self
        source = "recorded" if self.accumulate > 1 else "forward + backward"
        note = (f"{n} micro-steps per optimizer step (what-if; {self.accumulate} recorded; micro-step "
                f"{self.micro_seconds * 1e3:.2f} ms: {source})")
        return replace(self, accumulate=n, micro=self.micro_seconds, loop_seconds=None, notes=(*self.notes, note))

    @property
    def micro_seconds(self) -> float:
        """One micro-step that does not synchronise: the recorded one, else forward + backward."""
        return self.micro if self.micro is not None else self.forward + self.backward

    @property
    def accumulation_seconds(self) -> float:
        """The micro-steps before the synchronising one: ``(accumulate - 1) * micro_seconds``."""
        return (self.accumulate - 1) * self.micro_seconds if self.accumulate > 1 else 0.0

    @property
    def compute_seconds(self) -> float:
        """The step on one rank with no communication: the micro-steps, forward + backward + optimizer."""
        return self.accumulation_seconds + self.forward + self.backward + self.optimizer

    @property
    def gradient_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepProfile":
        """The inverse of :meth:`as_dict`; unknown keys are refused (a typo is not silently dropped)."""
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"unknown step profile field(s) {', '.join(extra)}")
        return cls(**d)
