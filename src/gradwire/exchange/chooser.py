"""The chooser behind ``auto``: per exchange, the candidate whose exchange is cheapest on the link it measures.

What it measures, every ``every`` steps (online, on the exchange's own group,
so it works on any backend: gloo, nccl, emulated packets, and the simulated
one, whose collectives take the time its network model says):

1. The link: after a step's exchanges completed, a probe issues three
   all_reduces of one element (the first lines the ranks up; the faster of
   the next two, each timed from issue to completion, is ``alpha``: the
   per-collective cost, latency and the backend's own work) and then
   :data:`PROBE_LARGE` of the step's largest exchange back to back (at
   most :data:`PROBE_NUMEL` elements at first, then as many as cost
   :data:`PROBE_BYTES_SHARE` times ``alpha`` on the agreed link, and at
   least :data:`PROBE_SECONDS`). Their
   time is the median of each one's from issue to completion, all but
   the first, and ``beta`` per bus byte comes from its difference to
   ``alpha``: ``bench --fit``'s two-point fit, online. Not the first: it
   leaves partly from a shaper's token bucket that the ones behind it
   find empty, and the fastest of two picks it. The median leaves out one
   op a busy host delayed. On tc-shaped packets, 2 ranks, 30 probes
   (``benchmarks/probe_estimators.py``), the median error of the bus
   bandwidth at 1 Gbit/s and 512 KiB: the first op +66%, the faster of
   the first two +66%, this median +4%; at 100 Mbit/s and 64 KiB: +122%,
   +122%, +2%.
2. The CPU: each candidate's compress and decompress on a twin, timed on
   this rank once at two sizes and fitted as a line, and the memory work
   a compressed exchange adds to ``none``'s (error feedback's and the
   local correction's fresh copies and passes), timed at the run's largest
   exchange (:meth:`AutoChooser.cpu_seconds`; the coding alone missed four
   fifths of onebit's cost on the default CNN).
3. Agreement: every rank's numbers are averaged by one all_reduce, so every
   rank prices with the same floats and takes the same decision at the same
   step (gloo pairs collectives by order: ranks that chose differently would
   exchange different payloads).

Each exchange (the fused layout of the last step) then takes the candidate
of lowest :func:`gradwire.compress.auto.price`; a current choice is kept
unless another is at least :data:`SWITCH_GAIN` cheaper (noise near a
crossover must not flip it every few steps), and ``none`` unless a
compressor is :data:`LEAVE_NONE_GAIN` cheaper (what the price leaves out
counts against compressing; :data:`FIRST_LEAVE_NONE_GAIN` at the run's
first decision, which no step can judge). Until the first agreement,
every exchange is uncompressed (``none``): what sync does.

4. Trial: a price is a model, and the step is what counts. A changed
   choice runs :data:`TRIAL_SECONDS` of steps at the agreed step period
   (:data:`TRIAL_STEPS` to :data:`TRIAL_MAX_STEPS` of them: a dozen where
   a step takes 10 ms); each rank's median step period
   under it (the time from one step's last exchange to the next's, steps
   with a probe left out) and under the choice it replaced (its steps
   since the link moved: at least :data:`MIN_BEFORE` of them) are averaged by
   one all_reduce, and the proposal stays only if its steps were
   :data:`TRIAL_MARGIN` faster, or :data:`TRIAL_NOISE` times the old
   choice's own step-to-step spread, scaled to a median of the trial's
   steps, where that is more (on a busy host a median of three steps wins
   by several percent from noise alone).
   A reverted proposal, or a choice a kept one replaced, is not proposed
   again until the agreed link moves by :data:`LINK_MOVED` (on the
   simulated backend: until the next stretch of its model's condition); the
   next-cheapest candidate is proposed in its place. What this catches: a reduction the backend runs
   slower in half precision than the bytes say (gloo on CPU), coding that
   takes the cores backward needs, an overlap the price does not see.
   A compressor kept against another compressor is checked against
   ``none`` at the next decision where ``none`` is priced near it (a trial
   only tells which of the two it compared is faster). Such checks, of a
   candidate priced no better than the choice, explore: they wait while
   the trials' steps so far would pass :data:`CHECK_SHARE` of the run's.
   The estimate of a measured link is the median of its last
   :data:`ESTIMATE_PROBES` probes (alpha and beta apart), and the link
   moved only where two probes in a row read it moved to one place (by
   :data:`LINK_MOVED` from the estimate): a probe that reads it elsewhere
   brings the next one ``every`` steps on and changes nothing until then,
   so one probe a busy host slowed switches nothing, and a tenfold drop
   is acted on at its second probe, judged by the old choice's steps
   since the first.
5. Backoff: while the choices and the link stay put, the probes move apart
   (``every``, twice that, ... up to :data:`MAX_BACKOFF` times ``every``
   steps, and no more than :data:`BACKOFF_SECONDS` of steps at the agreed
   step period); a moved link or a change brings them back to ``every``.
   The schedule comes from agreed numbers only, so every rank probes at
   the same step.
6. The simulated backend's network: its group also says what its model's
   link is now and when that may next change (``network_now``); every
   rank adds it to the agreed numbers, and its bandwidth is the probe's:
   only the three small all_reduces are sent, and ``alpha`` is the larger
   of theirs and the model's (an op there also waits for the inner
   backend, whose own cost per collective, 0.25-1 ms on a 2-core host, a
   link modelled without latency does not have; without it the simulated
   run chose onebit at 1 Gbit/s where real packets, 251 us per
   collective, chose ``none``). The probe's large all_reduces are not sent
   (on the default model at 500 Mbit/s they and their bytes were a few
   percent of a short run's time). There a link moved when the model's
   condition did, not when a probe read differently; a condition met
   for the first time starts its estimate afresh from this probe; the
   next probe comes no later than the first step after the next change;
   after each trial the next candidate priced within :data:`UNSURE` of
   the winner meets it (a condition is a fixed link: every near
   candidate gets one trial there, and a loser is not retried until the
   condition comes back: one verdict in noise must not stand all run;
   one that lost by :data:`DECISIVE_LOSS` or more is not retried there);
   and a condition met before gets back, at once and without a trial, the
   choice that last stood there (on a link that drops for seconds every
   few seconds, the right choice for each state is found once). Other
   backends, and an outage, have none of this: their whole probe is sent,
   and their link moved when two probes in a row say so (4.).

Scheduling: the probe and the agreements are collectives on the exchange's
group, so they are issued in turns of its
:class:`~gradwire.exchange.futures.Sequencer`, from the step's first exchange
(never from a completion callback, where they could race the collectives
DDP itself issues on that group during forward). The run's first probe
runs at the first compressing step (the run's second), on the layouts the
last warm-up step showed, and is agreed on and decided at once (probed
twice where its large all_reduce was too small to tell the bandwidth):
that step's exchanges already use the choice. Trap: DDP rebuilds its
buckets after its first iteration, so that step's layouts may not be the
ones decided. An exchange of the same parameters in another order takes
the decided layout's choice; where the buckets hold other parameters (DDP's
first bucket is capped at 1 MiB by default), those exchanges go
uncompressed and the first decision is taken again at the next step, on
the rebuilt layouts and from the same probe (one step later, as if the
first had waited for the rebuild; on the default CNN, one bucket, the
choice starts a step sooner, 33 ms of onebit's gain at 500 Mbit/s). Later ones are
waited for by nobody at once: a probe runs at step ``t``, the agreement on
it at ``t + 1``, the decision applies from ``t + 2``; a trial from
``t + 2`` of ``n`` steps (:func:`trial_steps`) is agreed on at
``t + 2 + n + 1`` and judged at the step after; no probe runs during a trial.

Switching keeps the arithmetic consistent (:class:`CompressionState` does
it): error feedback's residuals are per parameter and carry over; a move to
``none`` sends ``m + e`` exactly and the residual empties, a served chunk's
residual that the new choice does not serve is paid back through the local
correction, so the ranks' mean model is the uncompressed one across the
switch as within a choice.

Trap: the price is of the exchange alone; where DDP overlaps buckets with
backward, or ``delayed`` hides the exchange behind the next step, the
fastest step may tolerate a slower exchange, and ``auto`` may compress
where it was not needed (never the other way round).
"""
from __future__ import annotations

import copy
import math
import statistics
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from gradwire.compress import (AlphaBeta, AutoCompressor, Compressor, Pattern, StateKey, get_compressor, payload_bits,
                               price)

from .futures import Sequencer, then, wait_before_exit

__all__ = ["DECISIVE_LOSS", "ESTIMATE_PROBES", "FIRST_LEAVE_NONE_GAIN", "LEAVE_NONE_GAIN", "SWITCH_GAIN",
           "AutoChooser", "Decision", "live_choosers", "probe_numel", "trace_events", "trial_margin", "trial_steps"]

#: a new candidate must be this much cheaper than the current one to replace it
SWITCH_GAIN = 0.05
#: ... and a compressor this much cheaper than ``none`` to replace it: what the price leaves out (DDP overlaps
#: the uncompressed all_reduces of the first buckets with backward; coding runs on the training thread)
#: counts against compressing
LEAVE_NONE_GAIN = 0.2
#: ... and this much at the run's first decision, which no step can judge (it is taken as priced, and its
#: exposure of the uncompressed exchanges rests on one step): a near call stays uncompressed until a later
#: decision can put it on trial
FIRST_LEAVE_NONE_GAIN = 0.4
#: the probe's larger all_reduce starts at the largest exchange, at most this many elements (512 KiB of fp32),
PROBE_NUMEL = 1 << 17
#: then takes the size whose bytes cost PROBE_BYTES_SHARE x alpha on the agreed link, and no less than
#: PROBE_SECONDS (fewer would be lost in the noise of alpha, and in a busy host's delays of an op by a few
#: milliseconds: single probes of a tc-shaped 1 Gbit/s link with ops of 3 ms read it at 0.65-1.5 Gbit/s, with
#: ops of 8 ms at 0.96-1.05; more would cost the step for nothing), between these bounds (64 KiB and 4 MiB of
#: fp32) and at most twice the largest exchange (the first probe after a drop is sized on the fast link it
#: left: its large all_reduces cost the step that much at the slow one)
PROBE_MIN_NUMEL = 1 << 14
PROBE_MAX_NUMEL = 1 << 20
PROBE_BYTES_SHARE = 8.0
PROBE_SECONDS = 8e-3
#: the probe's large all_reduces, issued back to back: their time is the median of all but the first (module
#: doc), so it needs at least two
PROBE_LARGE = 4
#: the run's first probe is sized without a link; where its large all_reduce took less than this many times the
#: small one's seconds beyond them, its bytes were lost in alpha's noise and it runs again, sized (auto's doc)
FIRST_PROBE_CLEAR = 1.0
#: the sizes each candidate's coding is timed at (then fitted as a line)
CPU_SIZES = (1 << 12, 1 << 16)
#: the largest size the exchange's copies are timed at (per element beyond it): 4 MiB of fp32
COPY_MAX_NUMEL = 1 << 20
#: elementwise passes over the bucket a compressed exchange makes beyond ``none``'s and its coding (a torch
#: profile of one onebit exchange of 601 k elements: about 1.2 ms of such ops at 0.054 ms a pass)
EXCHANGE_PASSES = 20
#: steps a proposed choice runs before it is judged by the steps it took against the choice it would replace: at
#: least this many ...
TRIAL_STEPS = 3
#: ... and as many as last this many seconds at the agreed step period, up to :data:`TRIAL_MAX_STEPS`: on a busy
#: 2-core host one step of a 10 ms training swings by 20-40%, and three of them judged a small model's exchange
#: by noise (a run of 28 k parameters on 200 Mbit/s ended uncompressed in two seeds of three, where onebit's
#: steps were 1.3x faster); a dozen steps of 10 ms cost what three of 40 ms do
TRIAL_SECONDS = 0.12
TRIAL_MAX_STEPS = 16
#: a trial's steps must be this much faster than the old choice's for it to stay (per-step noise on a busy host
#: is several percent: a near tie keeps what runs) ...
TRIAL_MARGIN = 0.03
#: ... or this many times the old choice's own spread (the median absolute deviation of its steps, a share of
#: their median), where that is larger: a median of TRIAL_STEPS steps moves by about one such spread from
#: noise alone, and a trial that won by noise would keep a slower choice for the rest of the run; a median of
#: ``n`` steps by about ``sqrt(TRIAL_STEPS / n)`` of it (:func:`trial_margin`)
TRIAL_NOISE = 1.5
#: a choice that lost its trial is not proposed again until the agreed link moves by this share (beta; twice
#: that in alpha)
LINK_MOVED = 0.3
#: on the simulated backend a loser is tried again when its condition comes back (one verdict in noise must not
#: stand all run), unless its steps were this share slower than the winner's: such a loss is no noise. In the
#: changing network of ``benchmarks/auto_choice.py`` (10 seeds, 3 drops) the losses were 1.40-1.86x (onebit on
#: 1 Gbit/s), 1.43-1.64x (int8), 1.55-3.1x (none on 100 Mbit/s) and the near ones within 1.12x; each stretch of a
#: condition tried the far ones again, 16 steps of a choice 1.4-3x slower per visit
DECISIVE_LOSS = 0.3
#: the estimate of the link is the median of this many of the last probes on it (alpha and beta apart): one
#: probe a busy host slowed or sped moves it not at all (the half-and-half average it replaced put a tc-shaped
#: 1 Gbit/s link on real packets at 0.41 Gbit/s after one slow reading; single probes there read 0.65-1.5)
ESTIMATE_PROBES = 5
#: while the link and the choices stay put, probes move apart, up to this many times ``every`` steps
MAX_BACKOFF = 8
#: ... and never further apart than this many seconds of steps (the agreed step period says how many steps)
BACKOFF_SECONDS = 2.0
#: step periods kept for the trials' medians (a trial's own and the old choice's before it)
_PERIODS = 4 * TRIAL_MAX_STEPS
#: a run's first steps are slower than the rest (allocations, the backend's first ops, DDP's rebuild): no trial
#: is judged by them
WARM_STEPS = 5
#: a choice taken without a trial is checked once against the next-cheapest candidate, when that one's price is
#: within this factor of its own
UNSURE = 2.0
#: such checks explore (what they try was priced no better): they start only while every trial's steps so far,
#: the check's own included, are at most this share of the steps since the first. A check of 5 steps waits
#: for step 100. In the default comparison at 10 Gbit/s (about 120 steps of 28 ms) checks of fp16 and onebit
#: after ``none`` ran steps 4-35% slower than none's, and auto ended 0.90-0.99x sync with sync's choice; a
#: small model's first choice (onebit, its best) was checked against three others by turns, and noise ended
#: it uncompressed. Proposals the price makes (a cheaper candidate, a link that moved) are not held back
CHECK_SHARE = 0.05
#: a trial's baseline is the current choice's median over at least this many clean steps on the agreed link
#: (one step may be an epoch's last, of a partial batch); fewer: a change waits for the next probe (``_decide``)
MIN_BEFORE = 3
#: all-uncompressed steps whose exposure is kept (the fastest counts)
_EXPOSURE_STEPS = 8
#: repeats of each CPU timing (the fastest counts: the rest is other work on the core)
_CPU_REPEATS = 3


@dataclass(frozen=True)
class Decision:
    """What ``auto`` chose at ``step``: per exchange (its label), the candidate, on the agreed link."""

    step: int
    choices: dict[str, str]
    alpha_s: float
    bus_gbit_s: float
    #: Unix seconds when it was taken (for the Chrome trace)
    unix: float = 0.0
    #: "decided" (no trial: the first, or one without a step to judge by), "trial" (a proposal runs
    #: :func:`trial_steps` steps), "kept" (its steps were faster), "reverted" (they were not), "recalled" (the
    #: simulated network is back on a condition met before: the choice that stood there)
    event: str = "decided"
    #: a judged trial: the agreed median step (ms) of the choice before it and of the trial
    steps_ms: tuple[float, float] | None = None
    #: a judged trial: how much faster its steps had to be to stay (a share of the old choice's)
    margin: float | None = None

    def as_plain(self) -> dict[str, Any]:
        out = {"step": self.step, "choices": dict(self.choices), "alpha_us": round(self.alpha_s * 1e6, 1),
               "bus_gbit_s": round(self.bus_gbit_s, 4), "unix": self.unix, "event": self.event}
        if self.steps_ms is not None:
            out["steps_ms"] = [round(t, 3) for t in self.steps_ms]
        if self.margin is not None:
            out["margin"] = round(self.margin, 4)
        return out

    @classmethod
    def from_plain(cls, d: dict[str, Any]) -> "Decision":
        steps = d.get("steps_ms")
        return cls(d["step"], dict(d["choices"]), d["alpha_us"] / 1e6, d["bus_gbit_s"], d.get("unix", 0.0),
                   d.get("event", "decided"), None if steps is None else (float(steps[0]), float(steps[1])),
                   d.get("margin"))


@dataclass
class _Trial:
    """A proposed choice on trial: what it replaced, from which step, and that choice's median step."""

    incumbent: dict[StateKey, Compressor]
    proposal: tuple[str, ...]
    start: int
    """the step whose exchanges first used the proposal (its own period is not judged: it switched)"""
    before: float
    """this rank's median period of the incumbent's clean steps before it (nan: none seen)"""
    spread: float
    """their median absolute deviation as a share of ``before`` (0: fewer than three steps)"""
    check: bool = False
    """the incumbent compresses and was taken as priced, never judged by its steps, and the proposal is ``none``:
    the faster of the two stays (no margin; ``none``, what sync does, keeps its margin against a compressor, and
    so does the incumbent against another compressor: :func:`_against_none`)"""
    steps: int = TRIAL_STEPS
    """the steps it runs before it is judged (:func:`trial_steps` of the agreed step period: every rank's same)"""


_LIVE: "weakref.WeakSet[AutoChooser]" = weakref.WeakSet()


def _in_flight() -> list[Future]:
    """Every chooser's probes and agreements that no step waited for: a run that ends right after one was
    issued leaves it in flight, and the interpreter's exit waits for it (:func:`~.futures.wait_before_exit`)."""
    return [fut for chooser in list(_LIVE) for fut in chooser.in_flight()]


wait_before_exit(_in_flight)


def live_choosers(since: float = 0.0) -> list["AutoChooser"]:
    """The choosers of this process's ``auto`` exchanges made after ``since`` (perf_counter) that decided."""
    return sorted((c for c in list(_LIVE) if c.decisions and c.created >= since), key=lambda c: c.created)


def trace_events(pid: int) -> list[dict[str, Any]]:
    """Chrome trace instant events of this process's ``auto`` decisions (Unix microseconds, as the network's)."""
    out = []
    for chooser in live_choosers():
        for d in chooser.decisions:
            out.append({"name": "auto: " + ", ".join(sorted(set(d.choices.values()))), "cat": "gradwire.auto",
                        "ph": "i", "s": "p", "pid": pid, "tid": "auto", "ts": d.unix * 1e6,
                        "args": {"step": d.step, "choices": d.choices, "alpha_us": round(d.alpha_s * 1e6, 1),
                                 "bus_gbit_s": round(d.bus_gbit_s, 4)}})
    return out


def _network_now(group: dist.ProcessGroup | None) -> tuple[float, float, float] | None:
    """The simulated backend's ``network_now()`` of ``group`` (its model's link now); None on any other backend."""
    now = getattr(group if group is not None else dist.group.WORLD, "network_now", None)
    return tuple(now()) if callable(now) else None


def _states_link(modelled: tuple[float, ...] | None) -> bool:
    """Whether the simulated backend's ``network_now()`` states the link (not another backend, not an outage):
    then the probe's bandwidth is the model's (module doc, 6.)."""
    return modelled is not None and math.isfinite(modelled[0])


def _fitted(numbers: Tensor) -> AlphaBeta:
    """The link of an agreed probe (its first three numbers: small seconds, large seconds, large bus bytes)."""
    small, large, busbytes = numbers[:3].tolist()
    return AlphaBeta(alpha=max(0.0, small), beta=max(0.0, (large - small) / busbytes) if busbytes else 0.0)


def probe_numel(link: AlphaBeta, world: int, largest: int) -> int:
    """Elements of the probe's large all_reduce on ``link``: bytes worth :data:`PROBE_BYTES_SHARE` x alpha, at
    least :data:`PROBE_SECONDS` of them, within :data:`PROBE_MIN_NUMEL` .. :data:`PROBE_MAX_NUMEL` and at most
    twice the ``largest`` exchange."""
    if world < 2 or largest < 1 or not link.beta > 0:
        raise ValueError(f"probe_numel needs a world of 2 or more ranks, an exchange of 1 element or more and a link "
                         f"with a cost per byte (beta > 0); got world={world}, largest={largest}, beta={link.beta}")
    per_element = link.beta * 2 * (world - 1) / world * 4
    wanted = int(max(PROBE_BYTES_SHARE * link.alpha, PROBE_SECONDS) / per_element)
    return max(PROBE_MIN_NUMEL, min(wanted, 2 * largest, PROBE_MAX_NUMEL))


def trial_steps(period: float) -> int:
    """How many steps a trial runs at an agreed step period of ``period`` seconds: :data:`TRIAL_SECONDS` of them,
    at least :data:`TRIAL_STEPS` and at most :data:`TRIAL_MAX_STEPS` (an unknown period: the fewest).

    Pure, and fed agreed numbers only: every rank judges at the same step.
    """
    if not period > 0 or not math.isfinite(period):
        return TRIAL_STEPS
    return max(TRIAL_STEPS, min(TRIAL_MAX_STEPS, math.ceil(TRIAL_SECONDS / period - 1e-9)))


def trial_margin(spread: float, steps: int) -> float:
    """How much faster a trial of ``steps`` steps must be than the old choice's, whose steps swing by ``spread``
    (their median absolute deviation, a share of their median): :data:`TRIAL_MARGIN`, or :data:`TRIAL_NOISE`
    times the spread scaled to the trial's median, ``sqrt(TRIAL_STEPS / steps)`` of it, where that is more."""
    if steps < 1 or not spread >= 0 or not math.isfinite(spread):
        raise ValueError(f"trial_margin needs a trial of 1 step or more and a spread that is a finite share >= 0; "
                         f"got steps={steps}, spread={spread}")
    return max(TRIAL_MARGIN, TRIAL_NOISE * spread * math.sqrt(TRIAL_STEPS / steps))


def _spread(times: list[float]) -> float:
    """The median absolute deviation of step periods, as a share of their median (0: fewer than three)."""
    if len(times) < 3:
        return 0.0
    mid = statistics.median(times)
    return statistics.median(abs(t - mid) for t in times) / mid if mid > 0 else 0.0


def _slower(loser: float, winner: float) -> float:
    """How many times the loser's median step the winner's is (nan where either is unknown or not positive)."""
    return loser / winner if winner > 0 and loser > 0 else math.nan


def _against_none(current: tuple[str, ...], proposal: tuple[str, ...]) -> bool:
    """Whether a check of ``current`` (a choice taken as priced) asks if compressing pays at all: some exchange
    compresses now and every exchange the proposal changes goes to ``none``. Such a check has no margin (the
    faster stays: :meth:`AutoChooser._judge`); a check against another compressor, priced behind the choice,
    keeps the trial's margin (on a small AdamW model at 200 Mbit/s, 1000 steps, fp16 checked against onebit
    without one stayed in 4 seeds of 10, in three on steps 1-11% faster, within the host's noise, and those
    seeds ran 0.74-0.94x a twin of onebit)."""
    changed = [p for c, p in zip(current, proposal) if c != p]  # an exchange that goes to none compressed
    return bool(changed) and all(p == "none" for p in changed)


def _condition(modelled: list[float]) -> tuple[float, float] | None:
    """The simulated backend's agreed condition (alpha, beta, seconds to its next change) as a key: the link to
    four digits (ranks that straddled a change average two links: a key of its own, seen once). None where
    there is none (another backend) or nothing moves (an outage)."""
    if len(modelled) != 3 or not all(math.isfinite(v) for v in modelled[:2]):
        return None
    return float(f"{modelled[0]:.4g}"), float(f"{modelled[1]:.4g}")


def _moved(old: AlphaBeta, new: AlphaBeta) -> bool:
    """Whether ``new`` differs from ``old`` by :data:`LINK_MOVED` or more (of the larger) in beta, or twice that
    in alpha (one small collective on a busy host is the noisier figure)."""
    def far(a: float, b: float, share: float) -> bool:
        return abs(b - a) > share * max(a, b) if max(a, b) > 0 else False

    return far(old.beta, new.beta, LINK_MOVED) or far(old.alpha, new.alpha, 2 * LINK_MOVED)


class AutoChooser:
    """Which candidate each exchange of a :class:`CompressionState` uses (module doc)."""

    def __init__(self, auto: AutoCompressor) -> None:
        _LIVE.add(self)
        self._largest = 0
        #: seconds per element of a compressed exchange's copies and passes (:meth:`_memory_per_element`)
        self._memory: float | None = None
        self.created = time.perf_counter()
        self.auto = auto
        self.none = get_compressor("none")
        self.candidates: list[Compressor] = [self.none, *auto.candidates]
        #: why some candidates were dropped (:meth:`restrict`), and which
        self.restricted: tuple[str, list[str]] | None = None
        #: the current choice per exchange key (missing: none)
        self.choice: dict[StateKey, Compressor] = {}
        #: the layouts the last decision priced (an exchange of another layout is a rebuilt bucket: module doc)
        self._decided: set[StateKey] = set()
        #: the first decision is taken again at the next step, on the layouts DDP rebuilt (module doc)
        self._redo = False
        #: every decision that changed something, in order
        self.decisions: list[Decision] = []
        self.link: AlphaBeta | None = None
        #: the agreed probes on the link as it is now (their median is ``link``), and a probe that read it moved,
        #: with its step, until the next probe confirms or contradicts it
        self._readings: list[AlphaBeta] = []
        self._far: tuple[AlphaBeta, int] | None = None
        self._lines: dict[tuple[str, int], tuple[float, float]] = {}
        self._samples: dict[int, Tensor] = {}
        self._probe_numel: int | None = None
        #: (exposed seconds, keys) of the last all-uncompressed steps; the agreed exposed share of their price
        self._exposed: list[tuple[float, list[StateKey]]] = []
        self._exposed_share = 1.0
        #: (small seconds, large seconds, large bus bytes) of the last probe, when it completed
        self._probed: list[float] | None = None
        self._agreement: tuple[Future, list[StateKey], int, int] | None = None
        self._probe_future: Future | None = None
        #: (agree, probe, judge a trial) at the next step's first exchange; the keys and step they are for
        self._due: tuple[bool, bool, bool] | None = None
        self._keys: list[StateKey] = []
        self._step = 0
        self._dtypes: dict[StateKey, torch.dtype] = {}
        self._first: int | None = None
        #: the schedule, in steps since the first: the next probe, the last one, and the probes' interval
        self._next_probe = 0
        self._probed_at: int | None = None
        self._interval = auto.every
        #: (step, choice names, seconds since the previous step's end, clean: no probe in it), the last few
        self._periods: list[tuple[int, tuple[str, ...], float, bool]] = []
        self._last_end: float | None = None
        #: the step the last probe ran in (probes are steps apart: the only one a period can contain)
        self._last_probe = -1
        #: the first step on the agreed link: the one after the probe that saw it move (trials' baseline)
        self._link_since = 0
        self._trial: _Trial | None = None
        self._trial_agreement: tuple[Future, int] | None = None
        #: whether the current choice was judged by a trial (else one checks it at a later decision)
        self._verified = False
        #: steps run under trials so far (the checks' budget: :data:`CHECK_SHARE`)
        self._explored = 0
        #: proposals whose trial lost, with the agreed link and the model's condition then (tried again once it moved)
        #: and how many times the winner's median step its own was (:func:`_slower`)
        self._rejected: dict[tuple[str, ...], tuple[AlphaBeta, tuple[float, float] | None, int, float]] = {}
        #: the simulated backend's condition at the last decision (the modelled link, rounded; None elsewhere),
        #: the step at which it next changes, and per condition met: its last standing choice and link estimate
        self._condition: tuple[float, float] | None = None
        self._next_change = math.inf
        self._visit = 0
        self._conditions: dict[tuple[float, float], tuple[dict[StateKey, Compressor], AlphaBeta]] = {}

    def in_flight(self) -> list[Future]:
        """The chooser's own collectives that no step has waited for yet (the probe, the agreements)."""
        pending = [self._probe_future] + [a[0] for a in (self._agreement, self._trial_agreement) if a is not None]
        return [f for f in pending if f is not None and not f.done()]

    def compressor_for(self, key: StateKey, flat: Tensor) -> Compressor:
        """The candidate ``key``'s exchange uses now (``none`` until decided)."""
        self._dtypes[key] = flat.dtype
        self._largest = max(self._largest, flat.numel())
        choice = self.choice.get(key)
        if choice is None and self._decided and key not in self._decided:
            choice = self._reordered(key)
        return self.none if choice is None else choice

    def _reordered(self, key: StateKey) -> Compressor | None:
        """A decided layout's choice for ``key``, a layout of the same parameters in another order (DDP rebuilt
        its bucket in the order the gradients came); None where no decided layout holds them."""
        names = key.names()
        old = next((k for k in self._decided if k.names() == names), None)
        if old is None:
            return None
        choice = self.choice.get(old, self.none)
        if choice is not self.none:
            self.choice[key] = choice
        self._decided.add(key)
        return choice

    def _rebuilt(self, keys: list[StateKey]) -> bool:
        """Whether the run's first decision priced layouts that this step's exchanges did not use (module doc)."""
        return (len(self.decisions) == 1 and bool(self._decided) and self._trial is None
                and self._agreement is None and any(k not in self._decided for k in keys))

    def _restart(self) -> None:
        """Forget the first decision and the link it read: the next step takes it again, as the first (the probe
        it was priced from stays, and is agreed on again with the rebuilt layouts)."""
        self.choice, self.decisions, self._decided, self._conditions = {}, [], set(), {}
        self.link, self._readings, self._far, self._condition = None, [], None, None
        self._next_change, self._verified, self._redo = math.inf, False, True

    # -- the state's step --------------------------------------------------------
    def begin_exchange(self, sequencer: Sequencer, group: dist.ProcessGroup | None) -> None:
        """At every exchange; at a step's first: decide, agree, probe, as the schedule says (module doc).

        Everything is issued here, from the exchange's own thread and before
        the step's first exchange takes its turn, never from a completion
        callback: a collective of the probe issued while the script's next
        forward runs could race the collectives DDP issues on the same group
        there (its buffers' broadcast, the rebuilt buckets' order).
        """
        if self._due is None:
            return
        agree, probe, judge = self._due
        self._due = None
        if self._redo:
            self._redo = False
            self._decide_now(sequencer, group)
        if self._trial_agreement is not None:
            fut, step = self._trial_agreement
            self._trial_agreement = None
            self._judge(fut.wait(), step)
        if self._agreement is not None:
            fut, keys, step, world = self._agreement
            self._agreement = None
            self._decide(fut.wait(), keys, step, world)
        if judge:
            self._agree_trial(sequencer, group)
        if agree and self._probe_future is not None:
            self._probe_future.wait()
            self._agree(self._keys, sequencer, group)
        if probe:
            self._last_probe = self._step
            self._probe(self._keys, sequencer, group)
            if self.link is None:
                self._decide_now(sequencer, group)

    def _decide_now(self, sequencer: Sequencer, group: dist.ProcessGroup | None) -> None:
        """The run's first probe, agreed on and decided at once: its step's exchanges already use the choice.

        Waiting here costs the probe and one small all_reduce, which the
        step's exchanges would wait behind anyway (they take their turns
        after them); deciding two steps later, as every later probe is,
        would cost two more uncompressed steps where compressing pays.
        The first probe runs at the second step in DDP's rebuilt buckets
        (the layouts priced, seen in the first, are the ones the step sends).

        Its large all_reduce has no link to be sized by: where it took less
        than :data:`FIRST_PROBE_CLEAR` times the small one's time beyond it,
        or no longer than it (a fast link, where its bytes are lost in
        alpha's noise: such a probe put a 1 Gbit/s link at infinity), the probe
        runs again at once, sized on that first estimate as later probes
        are, and the decision takes the second (on a 10 Gbit/s link the
        first alone put the bandwidth at a third of the line rate).
        """
        for again in (True, False):
            assert self._probe_future is not None
            self._probe_future.wait()
            self._agree(self._keys, sequencer, group)
            assert self._agreement is not None
            fut, keys, step, world = self._agreement
            self._agreement = None
            numbers = fut.wait()
            small, large = numbers[0].item(), numbers[1].item()
            # the simulated backend's bandwidth is its model's, whatever the size: nothing to probe again
            fast = small > 0 and large - small < FIRST_PROBE_CLEAR * small
            if again and fast and not _states_link(_network_now(group)):
                self.link = _fitted(numbers)  # sizes the second probe; the decision takes the second alone
                self._probe(keys, sequencer, group)
                self.link = None
                continue
            self._decide(numbers, keys, step, world)
            break
        self._probed_at = None  # agreed already: the next step has nothing to agree on

    def end_step(self, step: int, keys: list[StateKey], group: dist.ProcessGroup | None,
                 futures: list[Future] | None = None) -> None:
        """After step ``step``'s exchanges were issued: what the next step's first exchange does.

        ``futures``: the step's exchanges. When every one went uncompressed,
        the time from now (the last one was just issued, backward is done)
        until the last completes is what the step waited for them: DDP
        overlapped the rest with backward (:meth:`_exposure`).
        """
        if futures and all(self.choice.get(k, self.none) is self.none for k in keys):
            self._time_exposure(keys, futures)
        self._record_period(step, keys)
        if not keys or not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) < 2:
            return
        if self._first is None:
            self._first = step
        since = step - self._first
        self._keys, self._step = list(keys), step + 1
        if self._rebuilt(keys):
            self._restart()
        trial = self._trial
        judge = trial is not None and step == trial.start + trial.steps
        # a probe waits for a trial to end: its steps must be the proposal's own
        probe = trial is None and self._agreement is None and since >= self._next_probe
        if probe:
            self._probed_at, self._next_probe = since, since + self._interval  # the decision sets it again
        self._due = (self._probed_at is not None and since == self._probed_at + 1, probe, judge)

    def _record_period(self, step: int, keys: list[StateKey]) -> None:
        """The seconds since the previous step's end, under this step's choices (what a trial is judged by)."""
        now = time.perf_counter()
        if self._last_end is not None:
            self._periods.append((step, self._names(self.choice, keys), now - self._last_end,
                                  step != self._last_probe))
            del self._periods[:-_PERIODS]
        self._last_end = now

    def _median_period(self, names: tuple[str, ...], first: int, last: int) -> float:
        """This rank's median period of steps ``first..last`` under ``names``: the clean ones, else all (nan: none)."""
        times = self._step_periods(names, first, last)
        return statistics.median(times) if times else math.nan

    def _step_periods(self, names: tuple[str, ...], first: int, last: int) -> list[float]:
        mine = [(t, clean) for step, n, t, clean in self._periods if n == names and first <= step <= last]
        return [t for t, clean in mine if clean] or [t for t, _ in mine]

    # -- measuring -----------------------------------------------------------------
    def _time_exposure(self, keys: list[StateKey], futures: list[Future]) -> None:
        """Record the exposed seconds of this all-uncompressed step's exchanges, and their summed price."""
        start = time.perf_counter()
        done = torch.futures.collect_all(list(futures))
        keys = list(keys)

        def record(_: Any) -> None:
            self._exposed.append((time.perf_counter() - start, keys))
            del self._exposed[:-_EXPOSURE_STEPS]

        then(done, record)

    def _exposure(self, world: int) -> float:
        """The uncompressed exchanges' exposed share of their price (1: nothing overlapped; last measured).

        The fastest of the last few all-uncompressed steps, over the sum of
        their exchanges' prices on the current link: DDP overlaps the first
        buckets' all_reduces with backward, so sync pays only part of the
        price. A compressed choice is priced whole (fused, it leaves at the
        end of backward, and its coding runs on the training thread).
        """
        if not self._exposed or self.link is None:
            return self._exposed_share
        seconds, keys = min(self._exposed, key=lambda e: e[0])
        full = sum(price(self.none, k.total, world, self.link) for k in keys)
        return min(1.0, seconds / full) if full > 0 else 1.0

    def _probe(self, keys: list[StateKey], sequencer: Sequencer, group: dist.ProcessGroup | None) -> None:
        """Time all_reduces of 1 element and of the largest exchange (module doc), in a turn of their own.

        The large one's size comes from the agreed link only (every rank
        computes the same size: :func:`probe_numel`).
        """
        world = dist.get_world_size(group)
        largest = max(k.total for k in keys)
        if self._probe_numel is None:
            self._probe_numel = min(largest, PROBE_NUMEL)
        elif self.link is not None and self.link.beta > 0:
            self._probe_numel = probe_numel(self.link, world, largest)
        large = self._probe_numel
        small_t, large_t = torch.zeros(1), torch.zeros(max(2, large))
        busbytes = 2 * (world - 1) / world * large_t.numel() * 4
        modelled = _network_now(group)
        # the simulated backend's model states the bandwidth: only the small all_reduces go (module doc, 6.)
        model = _states_link(modelled)
        times: list[float] = []
        turn = sequencer.turn()

        def timed(tensor: Tensor) -> Any:
            def launch(_: Any) -> Future:
                start = time.perf_counter()
                fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
                return then(fut, lambda _: times.append(time.perf_counter() - start))
            return launch

        # the first small all_reduce lines the ranks up (it waits for the slowest); the first probe of a run
        # also sends an untimed large one (a backend's first op of a size sets up its buffers); the rest are timed
        untimed = [] if model or self.link is not None else [large_t]
        larges = [] if model else [large_t] * PROBE_LARGE
        calls = [small_t] + untimed + [small_t, small_t] + larges
        fut = turn.issue(timed(calls[0]), last=False)
        for j, tensor in enumerate(calls[1:], start=1):
            fut = turn.issue(timed(tensor), after=fut, last=j == len(calls) - 1)

        def record(_: Any) -> None:  # the faster small one is alpha (a delay only adds); the large ones: module doc
            first = len(times) - len(larges)
            small = min(times[first - 2], times[first - 1])
            if model:
                assert modelled is not None
                alpha = max(small, modelled[0])  # an op there waits for the model and for the inner backend
                self._probed = [alpha, alpha + modelled[1] * busbytes, busbytes]
            else:
                self._probed = [small, statistics.median(times[first + 1:]), busbytes]

        self._probe_future = then(fut, record)

    def cpu_seconds(self, compressor: Compressor, numel: int, world: int) -> float:
        """This rank's CPU seconds for one exchange of ``numel`` elements with ``compressor``, beyond ``none``'s.

        The coding, timed once per compressor on a twin (the fastest of a
        few runs at :data:`CPU_SIZES`, fitted as a line): compress ``c`` and
        decompress ``d``; two-phase compresses the bucket and then the served
        chunk (``c (1 + 1/w)``) and decodes the worker's approximation, the
        chunk's ``w`` rows and the gathered rows (``3 d``); all_gather decodes
        every rank's payload (``w d``); an all_reduce pattern ``d`` per round
        (PowerSGD's second round is in ``c``). And the exchange's own memory
        work, which ``none`` does not do, timed at the run's largest exchange
        (at most :data:`COPY_MAX_NUMEL`): the local correction copies the
        residuals into fresh tensors (2 copies), and error feedback, the
        correction and the exchange's buffers pass over the bucket about
        :data:`EXCHANGE_PASSES` times (counted in a profile of one onebit
        exchange of the default CNN: copies into the exchange's buffers, the
        residuals' updates, the correction, the scales' sums and norms). On
        the default CNN's 601 k elements a whole onebit
        exchange on one rank cost 3.4 ms more than ``none``'s where its coding
        alone took 0.7 ms (the copies' fresh 2.4 MB allocations 0.5 ms each): a
        price of the coding alone put onebit ahead of ``none`` on a 10 Gbit/s
        link, where its steps were 4 ms slower.
        """
        if compressor is self.none or numel == 0:
            return 0.0
        fixed, per_element = self._cpu_line(compressor, world)
        return fixed + (per_element + self._memory_per_element()) * numel

    def _cpu_line(self, compressor: Compressor, world: int) -> tuple[float, float]:
        """``(fixed, per element)`` seconds of the coding (:meth:`cpu_seconds`), cached per compressor and world."""
        key = (compressor.name, world)
        if key not in self._lines:
            costs = []
            for n in CPU_SIZES:
                c, d = self._coding(compressor, n)
                if compressor.pattern is Pattern.TWO_PHASE:
                    costs.append(c * (1 + 1 / world) + 3 * d)
                elif compressor.pattern is Pattern.ALLGATHER:
                    costs.append(c + world * d)
                else:
                    costs.append(c + d)
            (n1, n2), (t1, t2) = CPU_SIZES, costs
            slope = max(0.0, (t2 - t1) / (n2 - n1))
            self._lines[key] = (max(0.0, t1 - slope * n1), slope)
        return self._lines[key]

    def _coding(self, compressor: Compressor, numel: int) -> tuple[float, float]:
        """The fastest of a few compress ``c`` and decompress ``d`` of ``numel`` random values on a twin of
        ``compressor`` (its random streams and warm starts stay untouched)."""
        twin = copy.deepcopy(compressor)
        x = self._samples.get(numel)
        if x is None:  # drawn once per size for every candidate (65 k normal draws take 0.6 ms, the coding 0.1-0.7)
            x = self._samples[numel] = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
        c = d = float("inf")
        for _ in range(_CPU_REPEATS):
            t0 = time.perf_counter()
            payload, ctx = twin.compress(x)
            for _round in range(twin.rounds - 1):
                payload = twin.next_round(payload, ctx)
            t1 = time.perf_counter()
            twin.decompress(payload, ctx)
            t2 = time.perf_counter()
            c, d = min(c, t1 - t0), min(d, t2 - t1)
        return c, d

    def _memory_per_element(self) -> float:
        """Seconds per element of a compressed exchange's memory work beyond ``none``'s (:meth:`cpu_seconds`):
        2 fresh copies and :data:`EXCHANGE_PASSES` passes, timed once at the largest exchange seen (at most
        :data:`COPY_MAX_NUMEL`)."""
        if self._memory is None:
            n = max(CPU_SIZES[1], min(self._largest, COPY_MAX_NUMEL))
            x = torch.ones(n)  # a copy's speed does not depend on the values (random ones took 5 ms to draw)
            y = torch.empty_like(x)
            fresh = each = float("inf")
            for _ in range(_CPU_REPEATS):
                t0 = time.perf_counter()
                copied = x.clone()  # a new tensor: at this size, pages the allocator maps afresh
                t1 = time.perf_counter()
                torch.add(x, copied, out=y)
                t2 = time.perf_counter()
                del copied
                fresh, each = min(fresh, t1 - t0), min(each, t2 - t1)
            self._memory = (2 * fresh + EXCHANGE_PASSES * each) / n
        return self._memory

    def _agree(self, keys: list[StateKey], sequencer: Sequencer, group: dist.ProcessGroup | None) -> None:
        """All_reduce (mean) of the probe, the exposure, the recent step period and every candidate's CPU cost
        per exchange, read next step."""
        assert self._probed is not None
        small, large, busbytes = self._probed
        world = dist.get_world_size(group)
        cpu = [self.cpu_seconds(c, k.total, world) for k in keys for c in self.candidates]
        share = self._exposure(world)
        recent = [t for _, _, t, clean in self._periods[-8:] if clean]
        period = statistics.median(recent) if recent else 0.0
        # the simulated backend says what its network model's link is now (the module doc's 6.), any other none
        modelled = list(_network_now(group) or ())
        numbers = torch.tensor([small, large, busbytes, share, period, *cpu, *modelled], dtype=torch.float64) / world
        turn = sequencer.turn()
        fut = turn.issue(lambda _: dist.all_reduce(numbers, group=group, async_op=True).get_future())
        self._agreement = (then(fut, lambda _: numbers), list(keys), self._step, world)

    # -- deciding --------------------------------------------------------------------
    def _decide(self, numbers: Tensor, keys: list[StateKey], step: int, world: int) -> None:
        """Price every candidate per exchange on the agreed link; a different choice goes on trial.

        A change runs :func:`trial_steps` steps and is judged by them
        against the current choice's clean steps on this link (:meth:`_judge`):
        the price leaves out what the step alone shows (a reduction the
        backend runs slower in half precision, coding that competes with
        backward for the cores, what DDP overlaps). "On this link": the
        steps since the probe that first read the agreed link where it is
        now (module doc, 4.), past the warm-up: at least :data:`MIN_BEFORE`
        of them (a step of a partial batch at an epoch's end must not judge
        alone); where there are fewer, the change waits for the next probe.
        A single probe that reads the link elsewhere changes nothing (a busy
        host makes one now and then); the next, ``every`` steps on, confirms
        or drops it. The run's first decision has
        no step to wait for: it is taken as priced, and checked at a later
        decision against ``none`` if its price is within :data:`UNSURE` of
        it, else against the next-cheapest candidate if that one's is.
        """
        values = numbers.tolist()
        self._decided = set(keys)
        measured = _fitted(numbers)
        previous = self.link
        per = len(self.candidates)
        cpu = values[5:5 + len(keys) * per]
        condition = _condition(values[5 + len(keys) * per:])
        pending = False  # this probe read the link moved, and the last one did not read it there
        if condition is None:  # a measured link: it moved where two probes in a row read it moved to one place
            far = previous is not None and _moved(previous, measured)
            moved = previous is None or (far and self._far is not None and not _moved(self._far[0], measured))
            pending = far and not moved
        else:  # the model's: it moved if the model's condition did, whatever a noisy probe says
            moved = previous is None or condition != self._condition
            # an op there ends at max(model, inner backend): no probe can find the link faster than the model's
            # (on a loaded host a probe's small all_reduce read slow put a 100 Mbit/s link at 133 Mbit/s)
            measured = AlphaBeta(max(measured.alpha, values[-3]), max(measured.beta, values[-2]))
            self._next_change = self._step + values[-1] / values[4] if values[4] > 0 else math.inf
        recalled = self._conditions.get(condition) if moved and condition is not None else None
        if condition is not None and moved:
            self._visit += 1  # a stretch of the model's condition (a drop, the link back): verdicts hold within one
        self._condition = condition
        if moved:
            # the estimate of the old link has nothing to add: the new one starts from the probe that first read
            # it there, or, where the model's condition was met before, from the estimate kept then
            origin = self._far if condition is None else None
            self._readings = [recalled[1]] if recalled is not None else [] if origin is None else [origin[0]]
            # the steps before that probe ran on another link
            self._link_since = (self._last_probe if origin is None else origin[1]) + 1
        if pending:  # the estimate stays; the next probe, ``every`` steps on, says which link it is
            self._far = (measured, self._last_probe)
        else:
            self._far = None
            self._readings = [*self._readings, measured][-ESTIMATE_PROBES:]
            self.link = AlphaBeta(statistics.median(r.alpha for r in self._readings),
                             statistics.median(r.beta for r in self._readings))
        self._exposed_share, period = values[3], values[4]
        since = (self._step - self._first) if self._first is not None else 0
        if recalled is not None and self.decisions:
            self._recall(recalled[0], keys, step, since)
            return
        # the cheapest proposal that has not lost its trial on this link: a loser's candidate is priced out and
        # the next-cheapest is proposed (the price is a model: on 100 Mbit/s it put onebit ahead of fp16, whose
        # steps were faster, and stopping at the loser kept the exchange uncompressed there)
        current = self._names(self.choice, keys)
        excluded: dict[StateKey, set[str]] = {}
        steps = trial_steps(period)
        may_check = since > WARM_STEPS and self._explored + steps <= CHECK_SHARE * since
        for _ in range(per):
            proposal, unsure = self._propose(keys, cpu, world, excluded)
            if self._names(proposal, keys) == current and not self._verified and may_check:
                proposal = unsure  # a choice taken as priced, checked once against the next-cheapest
            names = self._names(proposal, keys)
            if names == current or not self._lost(names):
                break
            for key in keys:
                if proposal.get(key, self.none) is not self.choice.get(key, self.none):
                    excluded.setdefault(key, set()).add(proposal[key].name)
        if self._lost(names):
            proposal, names = dict(self.choice), current
        changed = names != current
        steady = not changed and not moved and not pending  # a pending reading: the next probe soon
        longest = MAX_BACKOFF * self.auto.every
        if period > 0:
            longest = min(longest, max(self.auto.every, int(BACKOFF_SECONDS / period)))
        self._schedule(since, min(self._interval * 2, longest) if steady else self.auto.every)
        if changed:
            # the old choice's steps on the link the proposal was priced on, past the warm-up
            first = max(self._link_since, (self._first or 0) + WARM_STEPS)
            times = self._step_periods(current, first, self._step - 1)
            if len(times) >= MIN_BEFORE:
                self._trial = _Trial(dict(self.choice), names, self._step, statistics.median(times), _spread(times),
                                     check=not self._verified and _against_none(current, names),
                                     steps=steps)
                self._explored += steps
            elif self.decisions:
                return  # a link that just moved: the next probe, ``every`` steps on, confirms it (module doc)
            else:
                self._verified = False  # the run's first: taken as priced, checked at a later decision
            self.choice = proposal
            self._record(step, keys, "trial" if self._trial is not None else "decided")
        elif not self.decisions:
            self._record(step, keys, "decided")
        if not changed:
            self._remember()

    def _propose(self, keys: list[StateKey], cpu: list[float], world: int,
                 excluded: dict[StateKey, set[str]]) -> tuple[dict[StateKey, Compressor], dict[StateKey, Compressor]]:
        """Per exchange, the cheapest candidate not in ``excluded`` where it beats the current choice by the gain
        the switch needs; and the check of a choice taken as priced (``none`` or the next-cheapest, within
        :data:`UNSURE` of it)."""
        assert self.link is not None
        per = len(self.candidates)
        proposal, unsure = dict(self.choice), dict(self.choice)
        for i, key in enumerate(keys):
            size = torch.empty(0, dtype=self._dtypes.get(key, torch.float32)).element_size()
            prices = [price(c, key.total, world, self.link, cpu[i * per + j], size)
                      for j, c in enumerate(self.candidates)]
            prices[0] *= self._exposed_share  # none: only what backward does not hide (_exposure)
            current = self.choice.get(key, self.none)
            allowed = [j for j in range(per) if self.candidates[j] is current
                       or self.candidates[j].name not in excluded.get(key, ())]
            best = min(allowed, key=prices.__getitem__)
            now = prices[self.candidates.index(current)] if current in self.candidates else float("inf")
            gain = SWITCH_GAIN if current is not self.none else (
                LEAVE_NONE_GAIN if self.decisions else FIRST_LEAVE_NONE_GAIN)
            if self.candidates[best] is not current and prices[best] < now * (1 - gain):
                proposal[key] = self.candidates[best]
            # the check of a choice taken as priced: against none first (whether compressing pays at all),
            # else the next-cheapest; either only when priced within UNSURE of it
            others = [j for j in allowed if self.candidates[j] is not current]
            runner = min(others, key=prices.__getitem__, default=None)
            if current is not self.none and 0 in others and prices[0] < UNSURE * now:
                runner = 0
            if runner is not None and prices[runner] < UNSURE * now:
                unsure[key] = self.candidates[runner]
        return proposal, unsure

    def _lost(self, names: tuple[str, ...]) -> bool:
        """Whether the choice ``names`` lost (or was beaten in) a trial on this link: on the simulated backend in
        this stretch of its model's condition (the next stretch of the same condition tries it again: one trial's
        verdict on a host whose steps swing by 15% must not stand for the whole run), or in any stretch of it
        where it lost by :data:`DECISIVE_LOSS` or more; elsewhere on an estimate within :data:`LINK_MOVED` of
        the one then."""
        lost = self._rejected.get(names)
        if lost is None or self.link is None:
            return False
        link, condition, visit, slower = lost
        if condition is not None:
            return condition == self._condition and (visit == self._visit or slower >= 1 + DECISIVE_LOSS)
        return not _moved(link, self.link)

    def _agree_trial(self, sequencer: Sequencer, group: dist.ProcessGroup | None) -> None:
        """All_reduce (mean) of the trial's median step, the incumbent's and its spread, judged at the next step."""
        trial = self._trial
        assert trial is not None
        world = dist.get_world_size(group)
        after = self._median_period(trial.proposal, trial.start + 1, trial.start + trial.steps)
        numbers = torch.tensor([trial.before, after, trial.spread], dtype=torch.float64) / world
        turn = sequencer.turn()
        fut = turn.issue(lambda _: dist.all_reduce(numbers, group=group, async_op=True).get_future())
        self._trial_agreement = (then(fut, lambda _: numbers), self._step)

    def _judge(self, numbers: Tensor, step: int) -> None:
        """Keep the trial's choice if its steps were faster than the incumbent's (every rank's mean) by
        :func:`trial_margin` (the incumbent's spread scaled to the trial's steps); else revert.
        The check of a compressor taken as priced against ``none`` has no margin: the faster stays (a first
        choice of onebit on a 10 Gbit/s link, 17% slower than ``none`` there, stayed for a whole run when its
        steps' spread of 12% made the margin 18%); against another compressor it has (:func:`_against_none`).

        A rank that saw no step of one of them makes the mean nan: the trial is kept (as priced).
        """
        trial, self._trial = self._trial, None
        assert trial is not None
        before, after, spread = numbers.tolist()
        keys = list(self._keys)
        # the margin protects a choice its steps once judged from noise; one taken as priced has no such claim
        margin = 0.0 if trial.check else trial_margin(spread, trial.steps)
        faster = math.isnan(before) or math.isnan(after) or after < before * (1 - margin)
        # a compressor that beat another compressor has not met ``none``'s steps (after a slow stretch of a
        # changing network, fp16 beats onebit on the fast link where none beats both): the next decision
        # checks it against none, as a choice taken as priced is checked (UNSURE)
        incumbent = self._names(trial.incumbent, keys)
        self._verified = not faster or all("none" in pair for pair in zip(incumbent, trial.proposal))
        if self._condition is not None:  # the model's condition holds still: every candidate priced near meets
            self._verified = False       # the winner in turn (each loser is priced out on it: _decide, _lost)
        if not faster:
            self.choice = trial.incumbent
            if self.link is not None:
                self._rejected[trial.proposal] = (self.link, self._condition, self._visit, _slower(after, before))
            self._interval = self.auto.every
        elif self.link is not None:  # a kept trial's loser: not here
            self._rejected[incumbent] = (self.link, self._condition, self._visit, _slower(before, after))
        self._record(step, keys, "kept" if faster else "reverted", (before * 1e3, after * 1e3), margin)
        self._remember()

    # -- the simulated backend's conditions ---------------------------------------------
    def _remember(self) -> None:
        """The current choice and link estimate, as what the model's current condition is met with next time."""
        if self._condition is not None and self.link is not None:
            self._conditions[self._condition] = (dict(self.choice), self.link)

    def _recall(self, choice: dict[StateKey, Compressor], keys: list[StateKey], step: int, since: int) -> None:
        """Back on a condition met before: its last standing choice, at once (it stood its trials there)."""
        self._schedule(since, self.auto.every)
        self._verified = True
        if self._names(choice, keys) != self._names(self.choice, keys):
            self.choice = {k: c for k, c in choice.items() if k in keys}
            self._record(step, keys, "recalled")

    def _schedule(self, since: int, interval: int) -> None:
        """The next probe ``interval`` steps after this one; where the model says when its condition next
        changes, no later than the first step after that."""
        self._interval = interval
        self._next_probe = (self._probed_at if self._probed_at is not None else since) + interval
        if math.isfinite(self._next_change):
            at = int(math.ceil(self._next_change)) + 1 - (self._first or 0)
            self._next_probe = max(since + 1, min(self._next_probe, at))

    def _names(self, choice: dict[StateKey, Compressor], keys: list[StateKey]) -> tuple[str, ...]:
        return tuple(choice.get(k, self.none).name for k in keys)

    def _record(self, step: int, keys: list[StateKey], event: str,
                steps_ms: tuple[float, float] | None = None, margin: float | None = None) -> None:
        assert self.link is not None
        bw = self.link.bus_bandwidth * 8 / 1e9
        self.decisions.append(Decision(step, {str(k): self.choice.get(k, self.none).name for k in keys},
                                       self.link.alpha, bw, time.time(), event, steps_ms, margin))

    def state_dict(self) -> dict[str, Any]:
        """The choices and the schedule's position (plain types).

        A resumed run continues with these choices until its next decision;
        decisions come from timings, so they are not bit-for-bit those of an
        uninterrupted run.
        """
        choice = self.choice if self._trial is None else self._trial.incumbent  # a trial is not saved
        return {"choice": [(k.as_plain(), c.name) for k, c in choice.items()], "first": self._first,
                "next_probe": self._next_probe, "interval": self._interval, "explored": self._explored,
                "decisions": [d.as_plain() for d in self.decisions]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        by_name = {c.name: c for c in self.candidates}
        self.choice = {StateKey.from_plain(k): by_name[name] for k, name in state["choice"] if name in by_name}
        self._first = state.get("first")
        self._next_probe = int(state.get("next_probe", 0))
        self._interval = int(state.get("interval", self.auto.every))
        self._explored = int(state.get("explored", 0))
        self.decisions = [Decision.from_plain(d) for d in state.get("decisions", [])]
        self._probed, self._agreement, self._probe_future, self._due = None, None, None, None
        self._decided, self._redo = set(), False  # decided in this process only (a resumed run's are saved)
        self._trial, self._trial_agreement, self._probed_at = None, None, None
        self._periods, self._last_end, self._last_probe, self._link_since = [], None, -1, 0

    def describe(self) -> str:
        """A few words: what the exchanges use now, and what was chosen before."""
        if not self.decisions:
            return "auto: no decision yet (every exchange uncompressed)"
        now = Counter(self.decisions[-1].choices.values())
        parts = ", ".join(f"{name} for {n} of {sum(now.values())}" for name, n in now.most_common())
        source = "the network model's" if self._condition is not None else "a measured"
        link = "" if self.link is None else (f" on {source} link of {self.link.alpha * 1e6:.0f} us + "
                                             f"{self.link.bus_bandwidth * 8 / 1e9:.3g} Gbit/s")
        events = Counter(d.event for d in self.decisions)
        switches = events["decided"] + events["kept"] + events["recalled"] - 1  # the first that stuck is not one
        tail = [f"{switches} switch(es)"] if switches > 0 else []
        if events["reverted"]:
            tail.append(f"{events['reverted']} trial(s) reverted: their steps were slower")
        if self.restricted is not None:
            tail.append(f"without {'/'.join(self.restricted[1])} ({self.restricted[0]})")
        return f"auto: {parts} exchanges{link}" + "".join(f", {t}" for t in tail)

    def restrict(self, min_bits: float, why: str) -> list[str]:
        """Keep only the candidates whose first-round payload holds at least ``min_bits`` bits per element.

        For an exchange whose decoded average a script's own optimizer steps
        on (a script that clips, :meth:`~gradwire.exchange.schemes.OptimizerScheme.release`):
        a sign per element feeds its noise into Adam's moments, a byte per
        element does not measurably (benchmarks/README.md, clip_acceptance).
        ``none`` always stays. Returns the names dropped, which the summary
        lists with ``why``.
        """
        kept: list[Any] = []
        dropped: list[Any] = []
        for c in self.candidates:
            (kept if c is self.none or payload_bits(c) >= min_bits else dropped).append(c)
        self.candidates = kept
        self.choice = {k: c for k, c in self.choice.items() if c in kept}
        self.restricted = (why, [c.name for c in dropped]) if dropped else None
        return [c.name for c in dropped]

    def summary(self) -> dict[str, Any]:
        """The decisions and the last agreed link, as plain types (for reports)."""
        return {"describe": self.describe(), "decisions": [d.as_plain() for d in self.decisions],
                "link": None if self.link is None else {"alpha_us": round(self.link.alpha * 1e6, 1),
                                                         "bus_gbit_s": round(self.link.bus_bandwidth * 8 / 1e9, 4)}}
