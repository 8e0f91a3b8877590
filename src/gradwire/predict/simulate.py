"""Replay one training step on a modelled network: buckets, the link queue, overlap. Pure, no process group.

The step (see :mod:`gradwire.predict.timeline` for its parts) runs on three
resources of one rank, as it does in the ``gradwire`` backend:

- the training thread: forward, then backward, during which bucket ``i``
  becomes ready at ``ready[i]``; the comm hook then runs on that thread
  (``Exchange.encode``: compression, momentum, error feedback) and pushes the
  rest of backward back by as much;
- the link of the exchange's process group, a FIFO queue (the backend's
  ``busy_until``): a collective issued at ``t`` starts at
  ``max(t, link free)``, holds the link for its modelled seconds and
  completes at ``max(start + seconds, end of the real collective)``: a
  simulated network never completes sooner than the real collective under
  it. The real collectives (``Phase.floor`` seconds each, measured where the
  profile was taken; zero for a described cluster) run one at a time, in
  issue order, as gloo runs a group's collectives;
- the callback thread that completes futures: a two-phase exchange's server
  step between its collectives (``Phase.before``) and the decode after the
  last one (``Exchange.decode``) run there, one at a time.

Exchanges issue in bucket order, each after the previous one issued its last
collective (the hooks' ``Sequencer``; DDP's own buckets are issued in order
anyway). What a step waits for depends on :class:`Kind`:

- ``BLOCKING`` (DDP, compressed or not): ``backward()`` returns when its
  compute is over and every bucket's exchange completed (decode included);
  then the optimizer;
- ``NEXT_STEP`` (``delayed``): backward never waits; after the next step's
  backward, the step waits for this step's exchanges, then the optimizer;
- ``AVERAGE`` (model averaging every ``period`` steps): one exchange of all
  parameters after the optimizer; ``localsgd`` waits for it at once,
  ``async-average`` at its next launch.

A blocking step leaves the link and the callback thread idle when it ends, so
one step is the steady state. The others carry work into the next step: they
are replayed for several periods and the mean step of the last period is
returned.

A hook that runs one bucket at a time (``Plan.serial``: PyTorch's PowerSGD
through :func:`gradwire.exchange.futures.one_bucket_at_a_time`) starts bucket
``k``'s exchange only once bucket ``k-1``'s completed: on the training
thread when bucket ``k`` is ready later than that, else on the callback
thread, at that completion (backward goes on meanwhile).

On the simulated cluster clock (``Plan.chained``: a profile recorded on it,
:mod:`gradwire.backend.simclock`), the chain of such a hook follows the
clock's rules, not this host's threads:

- each bucket's hook is a stage chained on the previous bucket's
  (:func:`gradwire.exchange.futures.then_async`): the clock prices it on the
  communication side, never on the training thread, from the latest of its
  bucket's ready instant, the previous hook's end and the previous
  exchange's completion (as in real time); ``Exchange.encode`` is that
  off-thread work, and backward's compute goes on beside it;
- a collective the hook waits for with ``Future.wait()`` inside a callback
  (PyTorch's PowerSGD waits so for its P and Q all_reduces) holds the work
  after it until it completes, as everywhere else: the clock sees that wait.

Busy cores (``simulate(..., busy_cores=True)``): when every core of the host
runs a training rank (a CPU job with a rank per core), the background work
of a rank, its real collectives and its callbacks, has no core of its own:
it takes its time from the compute it overlaps (work conserving: the
training thread computes nothing while a background job of its rank runs).
A real collective holds the core for the CPU it uses (``Phase.held``, what
its threads and the kernel spend for this rank), not for all of its wall
time, which also waits for the peer and for the sockets. ``delayed``'s exchanges, which overlap the next step, then
cost that step their CPU; a blocking exchange after backward costs nothing
more than its own time. Off, background work is free (a GPU job, or spare
cores).

Trap: callbacks are served in the order their exchanges were issued, not
strictly by the time each became runnable; a decode that becomes runnable
after the next exchange's server step would in reality run second. The error
is at most one callback's duration per bucket.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from gradwire.net import NetSpec, NetworkModel
from gradwire.net.algorithms import choose
from gradwire.net.spec import AUTO_TOPOLOGY

__all__ = ["Epochs", "Exchange", "Kind", "MAX_REPLAYED_STEPS", "Phase", "Plan", "Price", "Pricer", "SimResult",
           "advance", "simulate", "spec_for_world"]

#: steps replayed for the strategies that carry work into the next step (NEXT_STEP), and the
#: number of trailing steps averaged; AVERAGE replays three periods and averages the last
_CARRY_STEPS, _MEASURED_STEPS = 8, 4


class Kind(enum.Enum):
    """When a step waits for its communication (module doc)."""

    BLOCKING = "blocking"
    NEXT_STEP = "next_step"
    AVERAGE = "average"


@dataclass(frozen=True)
class Phase:
    """One collective of an exchange."""

    op: str
    nbytes: int
    """bytes by the nccl-tests convention of ``op`` (see :mod:`gradwire.net.model`)"""
    before: float = 0.0
    """callback-thread seconds between the previous collective's completion and this one's issue"""
    floor: float = 0.0
    """seconds the real collective took where the profile was measured (never faster than that)"""
    held: float | None = None
    """CPU seconds the real collective takes from its rank, with busy cores (None: all of its ``floor``)"""


@dataclass(frozen=True)
class Exchange:
    """One bucket's exchange: the hook's time on the training thread, its collectives, the decode."""

    encode: float
    phases: tuple[Phase, ...]
    decode: float = 0.0


@dataclass(frozen=True)
class Plan:
    """How a strategy communicates one step: the kind of wait and the exchanges.

    ``exchanges`` has one entry per bucket (BLOCKING, NEXT_STEP) or a single
    one (AVERAGE: all parameters, every ``period`` steps, ``overlapped`` for
    async-average).
    """

    kind: Kind
    exchanges: tuple[Exchange, ...]
    period: int = 1
    overlapped: bool = False
    serial: bool = False
    """bucket k's exchange starts once bucket k-1's completed (module doc)"""
    chained: bool = False
    """a serial plan on the simulated cluster clock: each hook runs off the training thread, from the latest of
    its bucket's ready instant, the previous hook's end and the previous exchange's completion (module doc)"""


@dataclass(frozen=True)
class SimResult:
    """Mean per step of the replayed steady state."""

    step_seconds: float
    comm_seconds: float
    """seconds the link was busy (modelled collective time)"""
    wire_bytes: float
    """bytes on the wire, the busiest rank's share with framing"""
    codec_seconds: float
    """encode, server and decode seconds (CPU the strategy adds)"""
    durations: tuple[float, ...] = ()
    """each replayed step's seconds, on a network that changes (``simulate(..., horizon=...)``)"""


def spec_for_world(spec: NetSpec | str, world: int) -> NetSpec:
    """``spec`` with its topology scaled to ``world`` ranks: the ranks per node stay, the nodes follow.

    ``topology=NxM`` describes the node (M ranks each); N is ignored.

    Raises:
        ValueError: ``world`` is not a multiple of M, or the topology is ``auto``.
    """
    spec = NetSpec.of(spec)
    if spec.topology == AUTO_TOPOLOGY:
        raise ValueError("topology=auto is read from torchrun when a job runs; to predict, write "
                         "topology=NODESxRANKS (the ranks per node are kept, the nodes follow the world size)")
    if isinstance(spec.topology, tuple):
        per_node = spec.topology[1]
        if world % per_node:
            raise ValueError(f"world size {world} does not fit nodes of {per_node} ranks (topology "
                             f"{spec.topology[0]}x{per_node}); use multiples of {per_node}")
        spec = replace(spec, topology=(world // per_node, per_node))
    return spec


class Pricer:
    """``(op, nbytes) -> (seconds, wire bytes)`` on ``world`` ranks: :class:`NetworkModel` prices, cached.

    The whole world is one group (DDP's). ``NetworkModel.cost`` builds that
    group again on every call (linear in the world size: half a millisecond
    at 1024 ranks); without jitter a price depends on nothing else, so the
    group is built once here and the same algorithm choice
    (``gradwire.net.algorithms.choose``) prices each size once. With jitter
    every call goes to ``NetworkModel.cost`` with the next sequence number,
    drawing what the backend would draw.
    """

    def __init__(self, spec: NetSpec | str, world: int) -> None:
        self.spec = spec_for_world(spec, world)
        self.world = world
        self.model = NetworkModel(self.spec, world)
        self._group = self.model.group(range(world)) if self.spec.jitter == 0 and not self.spec.events else None
        self._cache: dict[tuple[str, int], tuple[float, int]] = {}
        self._seq = 0

    @property
    def changes(self) -> bool:
        """Whether the network changes over time (then every price depends on when the op starts)."""
        return self.model.schedule is not None

    def __call__(self, op: str, nbytes: int, start: float = 0.0) -> tuple[float, int]:
        if self.changes:
            cost = self.model.cost(op, nbytes, seq=self._seq, start=start)
            self._seq += 1
            return cost.seconds, cost.wire_bytes
        if self._group is None:
            cost = self.model.cost(op, nbytes, seq=self._seq)
            self._seq += 1
            return cost.seconds, cost.wire_bytes
        key = (op, nbytes)
        hit = self._cache.get(key)
        if hit is None:
            _, base = choose(op, self.spec.algorithm, self._group, nbytes)
            seconds = 0.0 if self.model.is_zero or self.world == 1 else max(base.seconds, 0.0)
            hit = self._cache[key] = (seconds, base.wire_bytes if base.sent_bytes > 0 else 0)
        return hit


class _State:
    """The link, the callback thread and the sequencer, carried from exchange to exchange.

    ``background``: with busy cores, the intervals the rank's background work
    (real collectives, callbacks) held a core, in the order they were made.
    """

    __slots__ = ("link", "inner", "callbacks", "gate", "busy", "wire", "codec", "background")

    def __init__(self, busy_cores: bool = False) -> None:
        self.link = self.inner = self.callbacks = self.gate = 0.0
        self.busy = self.wire = self.codec = 0.0
        self.background: list[tuple[float, float]] | None = [] if busy_cores else None

    def hold(self, start: float, end: float) -> None:
        """Background work on ``[start, end)`` (kept only with busy cores)."""
        if self.background is not None and end > start:
            self.background.append((start, end))

    def compute(self, t: float, seconds: float) -> float:
        """When ``seconds`` of training-thread work started at ``t`` end (module doc, busy cores).

        The training thread's work is asked for in time order (each step's
        start is past the last compute of the step before), so an interval
        that ended before ``t`` can meet no later work: it is dropped, and a
        replay over a horizon of thousands of steps stays linear in them.
        """
        if self.background is None or seconds <= 0:
            return t + max(0.0, seconds)
        if self.background and self.background[0][1] <= t:
            self.background = [iv for iv in self.background if iv[1] > t]
        return advance(t, seconds, self.background)


def advance(t: float, seconds: float, held: Sequence[tuple[float, float]]) -> float:
    """The end of ``seconds`` of work started at ``t`` on a core that ``held`` intervals take first.

    Pure: the work runs in the gaps between the held intervals (overlapping
    ones count once), so it ends later by the held time it meets.
    """
    end = t + seconds
    merged: list[list[float]] = []
    for a, b in sorted(iv for iv in held if iv[1] > t):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    for a, b in merged:
        a = max(a, t)
        if a >= end:
            break
        end += b - a
    return end


#: ``(op, nbytes, start) -> (seconds, wire bytes)``: a collective's price when it starts at ``start``
Price = Callable[[str, int, float], tuple[float, int]]
#: the most steps a replay over a horizon takes (a step of microseconds over minutes of a trace)
MAX_REPLAYED_STEPS = 20_000


def _run(ex: Exchange, issue: float, st: _State, price: Price) -> float:
    """Issue ``ex``, whose hook ended at ``issue``; return when its result is in place.

    The work after a collective (the next one's ``before``, the decode)
    starts at its completion; the result is in place when that work and
    every collective are done.
    """
    issue = max(issue, st.gate)
    done = after = issue  # the latest completion; when the next callback may start
    st.codec += ex.encode
    for j, ph in enumerate(ex.phases):
        if j:
            begin = max(after, st.callbacks)
            issue = begin + ph.before
            st.hold(begin, issue)
            st.callbacks = issue
            st.codec += ph.before
        start = max(issue, st.link)
        seconds, wire = price(ph.op, ph.nbytes, start)
        st.link = start + seconds
        st.busy += seconds
        st.wire += wire
        end = start + seconds
        if ph.floor:
            begin = max(issue, st.inner)
            st.inner = begin + ph.floor
            st.hold(begin, begin + (ph.floor if ph.held is None else min(ph.held, ph.floor)))
            end = max(end, st.inner)
        done = max(done, end)
        after = end
        st.gate = issue
    if ex.decode:
        begin = max(after, st.callbacks)
        st.hold(begin, begin + ex.decode)
        st.callbacks = begin + ex.decode
        st.codec += ex.decode
        done = max(done, st.callbacks)
    return done


def _backward(b0: float, backward: float, ready: Sequence[float], plan: Plan, st: _State,
              price: Price) -> tuple[float, list[float]]:
    """One backward from ``b0``: when its compute ends, and when each bucket's exchange completes."""
    t, at, fins, hooked = b0, 0.0, list[float](), b0
    for r, ex in zip(ready, plan.exchanges):
        t, at = st.compute(t, r - at), r
        if plan.chained:  # the simulated clock: the hook off the training thread, after the previous exchange
            begin = max(t, hooked, fins[-1] if fins else t)
            hooked = begin + ex.encode
            st.hold(begin, hooked)
            fins.append(_run(ex, hooked, st, price))
            continue
        if plan.serial and fins and fins[-1] > t:  # the hook runs when the previous exchange completed
            begin = max(fins[-1], st.callbacks)
            st.callbacks = begin + ex.encode
            st.hold(begin, st.callbacks)
            fins.append(_run(ex, st.callbacks, st, price))
            continue
        t = st.compute(t, ex.encode)  # the hook, on the training thread
        fins.append(_run(ex, t, st, price))
    return st.compute(t, backward - at), fins


@dataclass(frozen=True)
class Epochs:
    """A run's shape around its steps, for a replay over a horizon that is to meet a schedule as the run did.

    Every ``steps``-th step ends an epoch: its compute is ``last`` of a full
    step's (a partial last batch), and the training thread then works
    ``pause`` seconds before the next epoch's first step (an evaluation, the
    next epoch's shuffle), while exchanges still in flight (``delayed``) go
    on; between two steps of an epoch it works ``gap`` seconds (the loop's
    fetch of the next batch, which it times in neither step). On a network that
    changes with a period close to an epoch's, this decides which steps meet
    the change: steps that lock to the period see one phase of it, epoch after
    epoch, and a replay of back-to-back steps would average over all phases.
    """

    steps: int
    pause: float = 0.0
    last: float = 1.0
    start: float = 0.0
    """the first step's instant on the schedule (the set-up before it: DDP's first broadcast, a barrier)"""
    offset: int = 0
    """the run's step the replay's first one is (a replay that starts past a run's first steps)"""
    gap: float = 0.0
    """seconds of the training thread between two steps of an epoch, outside both (the next batch's fetch)"""

    def __post_init__(self) -> None:
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ValueError(f"Epochs.steps must be a whole number of steps >= 1, got {self.steps!r}")
        if not (self.pause >= 0 and self.gap >= 0 and self.start >= 0 and 0 < self.last <= 1):
            raise ValueError(f"Epochs: pause, gap and start must be >= 0 s and last a share in (0, 1], got "
                             f"{self.pause!r}, {self.gap!r}, {self.start!r}, {self.last!r}")
        if not (isinstance(self.offset, int) and self.offset >= 0):
            raise ValueError(f"Epochs.offset must be a whole number of steps >= 0, got {self.offset!r}")

    def ends(self, k: int) -> bool:
        """Whether the replay's step ``k`` (from 0) is an epoch's last."""
        return (k + self.offset) % self.steps == self.steps - 1


def simulate(forward: float, backward: float, optimizer: float, ready: Sequence[float], plan: Plan,
             price: Price, horizon: float | None = None, busy_cores: bool = False,
             finalize: float = 0.0, epochs: Epochs | None = None, first: tuple[Plan, int] | None = None) -> SimResult:
    """The mean steady-state step of ``plan`` (module doc); ``ready`` are the buckets' ready times.

    ``horizon``: on a network that changes, replay consecutive steps from
    ``t = 0`` until ``horizon`` seconds (at most :data:`MAX_REPLAYED_STEPS`)
    and return their mean and each step's seconds (``durations``).
    ``busy_cores``: every core runs a rank, so background work takes compute's time (module doc).
    ``finalize``: seconds of ``optimizer`` that run before a BLOCKING step observes its exchanges, beside them
    (the simulated cluster clock's rule for DDP's copy of the results into the gradients); 0: after them.
    ``epochs``: with a ``horizon``, replay the run's epochs (partial last batches, the pause after each;
    :class:`Epochs`); a step's seconds leave the pause and the gap out, as a training loop times its steps.
    ``first``: with ``epochs``, ``(plan, n)``: the run's first ``n`` steps exchange with that plan (a
    strategy's warm-up on the plain all_reduce), so that the steps after them meet the schedule where the
    run's did.
    """
    st = _State(busy_cores)
    if plan.kind is Kind.AVERAGE:
        return _simulate_average(forward + backward + optimizer, plan, st, price, horizon)
    shape = epochs if horizon is not None else None
    warm, warm_steps = first if first is not None and shape is not None else (plan, 0)
    for p in (plan, warm):
        if len(ready) != len(p.exchanges):
            raise ValueError(f"{len(ready)} buckets but {len(p.exchanges)} exchanges")
    steps = 1 if plan.kind is Kind.BLOCKING else _CARRY_STEPS
    if horizon is not None:
        steps = MAX_REPLAYED_STEPS
    start, starts, ends = (shape.start if shape is not None else 0.0), list[float](), list[float]()
    previous: list[float] = []
    for k in range(steps):
        if horizon is not None and start >= horizon and len(starts) > _CARRY_STEPS:
            break
        starts.append(start)
        closes = shape is not None and shape.ends(k)  # an epoch's last step: its partial batch, then the pause
        scale = shape.last if closes and shape is not None else 1.0
        this = warm if k < warm_steps else plan
        computed, fins = _backward(st.compute(start, forward * scale), backward * scale,
                                   [r * scale for r in ready] if scale != 1.0 else ready, this, st, price)
        if this.kind is Kind.BLOCKING:
            early = min(finalize, optimizer)
            start = st.compute(max([st.compute(computed, early), *fins]), optimizer - early)
        else:
            start = st.compute(max([computed, *previous]), optimizer)
            previous = fins
        ends.append(start)
        between = 0.0 if shape is None else shape.pause if closes else shape.gap  # the loop's work outside steps
        if between:
            start = st.compute(start, between)
    starts.append(start)
    if horizon is not None:
        return _over(starts, st, ends)
    measured = 1 if plan.kind is Kind.BLOCKING else _MEASURED_STEPS
    return _result(starts, measured, steps, st)


def _simulate_average(compute: float, plan: Plan, st: _State, price: Price,
                      horizon: float | None = None) -> SimResult:
    (ex,) = plan.exchanges
    h = plan.period
    steps = 3 * h if horizon is None else MAX_REPLAYED_STEPS
    start, starts = 0.0, list[float]()
    pending = 0.0
    for k in range(steps):
        if horizon is not None and start >= horizon and k >= 3 * h and k % h == 0:
            break
        starts.append(start)
        end = start + compute
        if (k + 1) % h == 0:  # every H-th step ends with an average
            if plan.overlapped:
                launch = max(end, pending)  # the previous average is applied before the next one leaves
                pending = _run(ex, launch + ex.encode, st, price)
                end = launch + ex.encode
            else:
                end = _run(ex, end + ex.encode, st, price)
        start = end
    starts.append(start)
    if horizon is not None:
        return _over(starts, st)
    return _result(starts, h, steps, st)


def _over(starts: list[float], st: _State, ends: list[float] | None = None) -> SimResult:
    """Every replayed step of a run over a horizon, the mean per step, and the totals per step.

    ``ends``: each step's end where it is not the next one's start (a pause between epochs).
    """
    durations = tuple(b - a for a, b in zip(starts, ends if ends is not None else starts[1:]))
    n = max(1, len(durations))
    return SimResult(sum(durations) / n, st.busy / n, st.wire / n, st.codec / n, durations)


def _result(starts: list[float], measured: int, steps: int, st: _State) -> SimResult:
    per_step = (starts[-1] - starts[-1 - measured]) / measured
    return SimResult(per_step, st.busy / steps, st.wire / steps, st.codec / steps)
