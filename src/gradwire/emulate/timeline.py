"""A changing network on real links: which shaper change, and which link going down, at which time. Pure.

The spec's events (:mod:`gradwire.net.schedule`) say what the network is at
any time; an emulated run turns each change into operations on the links it
built (:mod:`gradwire.emulate.controller` applies them):

- a rate (``drop=``, a ``trace=`` row, ``slow=``): the token buckets change
  in place (tbf's parameters, htb's classes), queue and connections kept;
  the bucket follows the rate as at build time (:func:`~gradwire.emulate.plan.default_burst`,
  or the ``--burst`` given);
- ``slow=RANK:link=F``: the uplink of the node that holds ``RANK`` (its
  ``gw-eth`` egress) at ``F`` times its rate; the download side keeps its
  rate. Ranks of one node share its uplink, so the event slows them all, as
  the model's group link (the slowest member's) does for any group that spans
  that node;
- ``outage=`` (and a trace row of bandwidth 0): every switch port goes down.
  Each node's ``gw-eth`` loses its carrier, as with a cable pulled: packets
  queued on the links are dropped, TCP's retransmission timer backs off
  (200 ms, 400 ms, 800 ms, ... while it lasts) and the connections resume on
  the first retransmission after the ports come back up: gloo's all_reduce
  carried on on the same connections, 0.05-0.6 s after 1.5-2 s outages
  (tests/emulate, benchmarks/emulate_schedule.py). That wait is real time
  that the model of an outage (ops resume the moment it ends) does not
  price; `gradwire emulate` reports the timeouts.

A change takes 20-50 ms to apply on a busy 2-core host, now and then 0.5 s
(:mod:`gradwire.emulate.controller`): a schedule of seconds is followed
closely, a Mahimahi trace (a new rate every 100 ms) only coarsely.

What cannot change on these links is refused with the reason
(:func:`gradwire.emulate.plan.event_refusals`): background flows (``cross=``) need traffic of their own;
latency and loss from a trace need netem, and changing netem at run time is
not done here.

Times count from the run's ``t = 0``: the moment the first node's agent is
started, once the network is built (the agents get it as ``time.monotonic()``
in ``GRADWIRE_EMULATE_T0``). The simulated backend's ``t = 0`` is later,
when the job creates its default process group: after torchrun's start,
Python's and torch's imports and the rendezvous, 7-13 s on a busy 2-core
host (benchmarks/emulate_schedule.py records it per run). A spec written for
the simulated backend runs that much earlier in its job here; a script that
needs the two to agree can read the offset from ``GRADWIRE_EMULATE_T0``
once its group is up.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

from gradwire.emulate.plan import EmulationPlan, RateLimit, default_burst
from gradwire.net.schedule import Condition, Schedule
from gradwire.net.units import human_bandwidth

__all__ = ["SHOWN", "Change", "State", "built_state", "changes", "describe", "restore", "state_at"]

#: changes shown by :func:`describe` (a periodic schedule never ends)
SHOWN = 12


@dataclass(frozen=True)
class State:
    """What the links carry over one stretch: each planned port's rate limiter, and whether the ports are up."""

    rates: tuple[RateLimit | None, ...]
    """one per :attr:`EmulationPlan.ports`, in order (None: unshaped)"""
    up: bool = True
    """False during an outage: every switch port is down"""


@dataclass(frozen=True)
class Change:
    """One step of the schedule: at ``at`` s, set these ports' rates (and the ports' link state)."""

    at: float
    """seconds since the run's t = 0"""
    condition: Condition
    """the network's condition from ``at`` on"""
    rates: tuple[tuple[int, RateLimit], ...]
    """(index into the plan's ports, new rate limiter) for each port whose rate changes"""
    up: bool | None
    """the ports' new link state, None when it does not change"""

    def describe(self, plan: EmulationPlan) -> str:
        """One line for a person: the time and what changes on which port."""
        parts = []
        if self.up is False:
            parts.append("every switch port down (outage)")
        by_rate: dict[float, list[str]] = {}
        for i, limit in self.rates:
            port = plan.ports[i]
            by_rate.setdefault(limit.rate, []).append(f"node {port.node} {port.direction}")
        for bits, where in by_rate.items():
            every = len(where) == len(plan.ports)
            parts.append(f"{_rate(bits)} on {'every link' if every else ', '.join(where)}")
        if self.up is True:
            parts.append("switch ports up")
        return f"t={self.at:.3f}s: {'; '.join(parts)}"


def _rate(bits: float) -> str:
    return human_bandwidth(bits).split(" (")[0]  # "100 Mbit/s", without the GB/s beside it


def state_at(plan: EmulationPlan, cond: Condition) -> State:
    """The links under ``cond``: every port at the condition's rate, uplinks times their ranks' ``slow`` factors."""
    lay = plan.layout
    base = plan.spec.bandwidth if cond.bandwidth is None else cond.bandwidth
    slow = dict(cond.links)
    rates: list[RateLimit | None] = []
    for port in plan.ports:
        built = port.rate
        if built is None:
            rates.append(None)
            continue
        ranks = range(port.node * lay.per_node, (port.node + 1) * lay.per_node)
        # the built rate holds the spec's static stragglers; scale it as the base rate moved
        rate = built.rate * base / plan.spec.bandwidth
        if port.direction == "upload":
            rate *= min((slow.get(r, 1.0) for r in ranks), default=1.0)
        if rate == built.rate:
            rates.append(built)
            continue
        bucket = default_burst(rate) if plan.burst is None else plan.burst
        rates.append(RateLimit(built.kind, rate, bucket, int(rate / 8 * _queue_seconds(built)) + bucket))
    return State(tuple(rates), up=not cond.down)


def _queue_seconds(built: RateLimit) -> float:
    """The queue behind the bucket, in line time, of a built limiter (it follows the rate)."""
    return (built.limit - built.burst) / (built.rate / 8)


def built_state(plan: EmulationPlan) -> State:
    """The links as :func:`gradwire.emulate.netlink.build` leaves them."""
    return State(tuple(p.rate for p in plan.ports), up=True)


def changes(plan: EmulationPlan, start: float = 0.0) -> Iterator[Change]:
    """Every change of the links from ``start`` on, against the built network; a periodic schedule never ends.

    A stretch that changes nothing on the links (a condition that only
    differs in what they do not carry) yields nothing. The first change may be
    at ``start`` itself, when the schedule's condition there differs from the
    spec's (an event ``at=0``).
    """
    if not plan.spec.events:
        return
    schedule = Schedule(plan.spec.events)
    current = built_state(plan)
    for begin, (end, cond) in _stretches(schedule, start, plan.spec.bandwidth):
        new = state_at(plan, cond)
        if not new.up and cond.bandwidth is None:  # a trace's down row says no rate: the ports keep theirs
            new = State(current.rates, up=False)
        rates = tuple((i, r) for i, (r, old) in enumerate(zip(new.rates, current.rates))
                      if r is not None and r != old)
        up = new.up if new.up != current.up else None
        if rates or up is not None:
            yield Change(begin, cond, rates, up)
        current = new
        if math.isinf(end):
            return


def _stretches(schedule: Schedule, start: float, bandwidth: float) -> Iterator[tuple[float, tuple[float, Condition]]]:
    begin = start
    for end, cond in schedule.segments(start, bandwidth):
        yield begin, (end, cond)
        begin = end


def describe(plan: EmulationPlan, shown: int = SHOWN) -> list[str]:
    """Lines for ``--plan``: the first ``shown`` changes the run would apply, and whether more follow."""
    if not plan.spec.events:
        return []
    lines = [f"schedule from t=0 (the first node's start): {', '.join(e.to_string() for e in plan.spec.events)}"]
    it = changes(plan)
    for n, change in enumerate(it):
        if n == shown:
            lines.append(f"  ... and more (the schedule goes on; {shown} shown)")
            break
        lines.append(f"  {change.describe(plan)}")
    else:
        if len(lines) == 1:
            lines.append("  (nothing on the links changes)")
    return lines


def restore(plan: EmulationPlan) -> Change:
    """The change back to the built network (rates of the plan, ports up), applied when a run ends."""
    built = built_state(plan)
    return Change(math.inf, Condition(), tuple((i, r) for i, r in enumerate(built.rates) if r is not None), True)

