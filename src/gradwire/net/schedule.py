"""Networks that change: conditions over time, and the price of an op that runs across a change.

A real link is not constant: its bandwidth drops for seconds, it goes down,
other flows share it. Each of those is a :class:`NetworkChange` of the spec (a token
of the spec grammar, see :mod:`gradwire.net.spec`)::

    drop=100mbit:for=5s:every=30s[:at=T]      bandwidth falls to 100 Mbit/s for 5 s in every 30 s
    outage=5s:at=20s[:every=60s]              the link carries nothing for 5 s (ops in flight wait)
    slow=RANK:link=F:for=5s:every=30s[:at=T]  one rank's uplink at F times its speed for a while
    cross=RATE[:flows=N][:on=T:off=T][:at=T]  N background flows of RATE each share the bottleneck
    trace=FILE[:repeat]                       conditions from a file (CSV, or a Mahimahi packet trace)

Times count from the moment the job's default group was created (``t = 0``);
a periodic event first starts at ``at`` (default: one period in, so a job
starts on the spec's own link). Events compose: the trace sets the base,
drops take the lower rate, background flows take their share of what is
left, an outage stops everything.

Pricing across a change (:func:`finish_time`). An op that would take
``T(c)`` seconds on a constant condition ``c`` progresses at ``1 / T(c)`` of
its work per second while ``c`` holds, so it ends at the first ``t`` with
``sum over segments of duration / T(c) = 1``. On a constant network that is
``start + T``; across a drop the bytes before it go at the old rate and the
rest at the new one; during an outage (``T = inf``) nothing moves and the op
resumes after it. The latency part is spread over the op like its bytes: for
ops of many latency steps that is how they spread, and for a single message
the error is at most one latency.

Fair share (``cross``): TCP flows on one bottleneck converge to max-min fair
shares. With ``N`` background flows that each want ``RATE``, the job's flow
gets ``max(B / (N + 1), B - N * RATE)`` of a link of ``B``: all that is left
when they are slow, its equal share when they are not.

Trace formats:

- CSV, one row per change, with a header or without:
  ``time,bandwidth[,latency[,loss]]`` (``0s,1gbit,50us,0%``; bare numbers are
  seconds, bits/s and fractions). A row holds until the next one; the last
  row holds for ever, unless ``:repeat`` is given: then the trace repeats and
  the last row only marks where its period ends.
- Mahimahi's packet-delivery traces (Netravali et al., USENIX ATC 2015): one
  integer per line, the millisecond at which one 1500-byte packet can leave;
  the trace repeats with the period of its last timestamp. It is read as the
  rate of delivery opportunities in 100 ms bins.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Sequence, TypeVar

from gradwire.net.units import format_bandwidth, format_time, parse_bandwidth, parse_fraction, parse_time

__all__ = [
    "CHANGE_KINDS", "RESERVED_KEYS", "Condition", "Cross", "Drop", "NetworkChange", "Outage", "Schedule", "Slow", "Trace",
    "finish_time", "parse_event", "register_change",
]

#: Mahimahi delivery opportunities are MTU-sized
MAHIMAHI_PACKET_BYTES = 1500
#: bin width when a Mahimahi trace is read as a rate
MAHIMAHI_BIN = 0.1
#: most segments one op may cross before the model gives up (a run of ever shorter segments is a bug)
MAX_SEGMENTS = 1_000_000


@dataclass(frozen=True)
class Condition:
    """The network over one interval: what it overrides of the static spec."""

    bandwidth: float | None = None
    """inter-node line rate, bits/s (None: the spec's)"""
    latency: float | None = None
    """one-way latency, s (None: the spec's)"""
    loss: float | None = None
    """packet-loss probability (None: the spec's)"""
    down: bool = False
    """an outage: nothing moves"""
    links: tuple[tuple[int, float], ...] = ()
    """(rank, factor) of uplinks slower than the spec says, sorted by rank"""


def _window(t: float, at: float, duration: float, every: float | None) -> tuple[bool, float]:
    """Whether ``t`` falls in a window ``[at + k every, at + k every + duration)``, and when that next changes."""
    if t < at:
        return False, at
    if every is None:
        return (True, at + duration) if t < at + duration else (False, math.inf)
    # floor((t - at) / every) can land one period off at a boundary (0.03 / 0.01 = 2.9999999999999996):
    # correct k so that at + k every <= t < at + (k + 1) every in the very floats returned, or a caller
    # stepping from change to change would be handed t itself as the next change and never advance
    k = math.floor((t - at) / every)
    if at + k * every > t:
        k -= 1
    elif at + (k + 1) * every <= t:
        k += 1
    start = at + k * every
    return (True, start + duration) if t < start + duration else (False, at + (k + 1) * every)


def _check_window(what: str, duration: float, every: float | None, at: float) -> None:
    if not duration > 0:
        raise ValueError(f"{what}: for= must be a time > 0, got {format_time(duration)}")
    if every is not None and not every > duration:
        raise ValueError(f"{what}: every= ({format_time(every)}) must be longer than for= ({format_time(duration)})")
    if at < 0:
        raise ValueError(f"{what}: at= must be a time >= 0")


#: the stages at which :class:`Schedule` applies the kinds of change (lower first): a base condition, then
#: rates, then per-rank links, then shares of what is left, then down
BASE, RATE, LINKS, SHARE, DOWN = 0, 10, 20, 30, 40


class NetworkChange:
    """One source of change; :class:`Schedule` composes them.

    A kind of change is a subclass registered with :func:`register_change`:
    it names its spec key (``key``), the stage at which the schedule applies
    it (``stage``: :data:`RATE`, :data:`LINKS`, :data:`SHARE`, :data:`DOWN`,
    or :data:`BASE` for one that sets the base condition, as ``trace=``
    does, through :meth:`base`), and reads its own token (:meth:`parse`).
    """

    #: the spec key of this kind (``drop`` in ``drop=100mbit:for=5s``)
    key: ClassVar[str]
    #: when :meth:`Schedule.condition` applies this kind, relative to the others (the stages above)
    stage: ClassVar[int]
    #: the token's grammar, shown when one is wrong
    grammar: ClassVar[str] = ""

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "NetworkChange":
        """Read a token ``key=head[:rest...]``; ValueError with the grammar otherwise."""
        raise NotImplementedError

    def state(self, t: float) -> tuple[bool, float]:
        """Whether the event is active at ``t``, and the next time that may change."""
        raise NotImplementedError

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        """``cond`` with this (active) event applied; ``bandwidth`` is the rate it found."""
        raise NotImplementedError

    def base(self, t: float) -> Condition:
        """The base condition at ``t`` (only a kind of stage :data:`BASE` sets one)."""
        raise NotImplementedError

    def to_string(self) -> str:
        raise NotImplementedError


#: every kind of network change by its spec key (:func:`register_change` adds one)
CHANGE_KINDS: dict[str, type[NetworkChange]] = {}
#: spec keys the grammar uses for something else (:mod:`gradwire.net.spec` fills it): no kind may take one
RESERVED_KEYS: set[str] = set()

_Kind = TypeVar("_Kind", bound=type[NetworkChange])


def register_change(cls: _Kind) -> _Kind:
    """Class decorator: make ``cls`` a kind of network change the spec grammar and :class:`Schedule` know.

    Raises ValueError if its key is taken (by another kind, or by the rest of the spec grammar), or if it lacks
    a key, a stage or a parser.
    """
    key = getattr(cls, "key", None)
    if not isinstance(key, str) or not key.isidentifier() or key != key.lower():
        raise ValueError(f"{cls.__name__}: a kind of network change needs a lower-case spec key, got {key!r}")
    if not isinstance(getattr(cls, "stage", None), int):
        raise ValueError(f"{cls.__name__}: a kind of network change needs a stage (BASE, RATE, LINKS, SHARE or DOWN)")
    if cls.parse.__func__ is NetworkChange.parse.__func__:  # type: ignore[attr-defined]
        raise ValueError(f"{cls.__name__}: a kind of network change reads its own token (classmethod parse)")
    if key in RESERVED_KEYS:
        raise ValueError(f"{cls.__name__}: the spec key {key!r} already means something else in a network spec")
    if CHANGE_KINDS.get(key, cls) is not cls:
        raise ValueError(f"{cls.__name__}: the spec key {key!r} is taken by {CHANGE_KINDS[key].__name__}")
    CHANGE_KINDS[key] = cls
    return cls


class _Windowed(NetworkChange):
    """An event active in windows of ``duration`` every ``every`` (once without), first at ``at``.

    Without ``at`` the first window opens one period in (at 0 when the event happens once): a job starts
    on the spec's own link.
    """

    duration: float
    every: float | None
    at: float | None

    @property
    def start(self) -> float:
        return self.at if self.at is not None else (self.every or 0.0)

    def state(self, t: float) -> tuple[bool, float]:
        return _window(t, self.start, self.duration, self.every)


@register_change
@dataclass(frozen=True)
class Drop(_Windowed):
    """``drop=RATE:for=T:every=T[:at=T]``: the bandwidth falls to ``rate`` for a while (the lower of the two)."""

    key = "drop"
    stage = RATE
    grammar = "drop=100mbit:for=5s:every=30s"

    rate: float
    duration: float
    every: float | None = None
    at: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.rate < math.inf:
            raise ValueError(f"drop: the rate must be a finite bandwidth > 0, got {self.rate!r}")
        _check_window("drop", self.duration, self.every, self.start)

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "Drop":
        opts = _options("drop", rest, ("for", "every", "at"))
        if "for" not in opts:
            raise ValueError("drop needs for=: e.g. drop=100mbit:for=5s:every=30s")
        return cls(parse_bandwidth(head), parse_time(opts["for"]), _time(opts, "every"), _time(opts, "at"))

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        return replace(cond, bandwidth=min(bandwidth, self.rate))

    def to_string(self) -> str:
        return "drop=" + ":".join([format_bandwidth(self.rate), f"for={format_time(self.duration)}"]
                                  + _when(self.every, self.at))


@register_change
@dataclass(frozen=True)
class Outage(NetworkChange):
    """``outage=T:at=T[:every=T]``: the link is down; ops in flight wait and resume."""

    key = "outage"
    stage = DOWN
    grammar = "outage=5s:at=20s[:every=60s]"

    duration: float
    at: float
    every: float | None = None

    def __post_init__(self) -> None:
        _check_window("outage", self.duration, self.every, self.at)

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "Outage":
        opts = _options("outage", rest, ("at", "every"))
        if "at" not in opts:
            raise ValueError("outage needs at=: e.g. outage=5s:at=20s[:every=60s]")
        return cls(parse_time(head), parse_time(opts["at"]), _time(opts, "every"))

    def state(self, t: float) -> tuple[bool, float]:
        return _window(t, self.at, self.duration, self.every)

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        return replace(cond, down=True)

    def to_string(self) -> str:
        return "outage=" + ":".join([format_time(self.duration), f"at={format_time(self.at)}"]
                                    + ([f"every={format_time(self.every)}"] if self.every is not None else []))


@register_change
@dataclass(frozen=True)
class Slow(_Windowed):
    """``slow=RANK:link=F:for=T:every=T[:at=T]``: a straggler link that comes and goes."""

    key = "slow"
    stage = LINKS
    grammar = "slow=3:link=0.2:for=5s:every=30s"

    rank: int
    factor: float
    duration: float
    every: float | None = None
    at: float | None = None

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"slow: the rank must be >= 0, got {self.rank}")
        if not 0 < self.factor < math.inf:
            raise ValueError(f"slow: link= must be a factor > 0 (0.2 = a fifth of the speed), got {self.factor!r}")
        _check_window("slow", self.duration, self.every, self.start)

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "Slow":
        opts = _options("slow", rest, ("link", "for", "every", "at"))
        if "link" not in opts or "for" not in opts:
            raise ValueError("slow needs link= and for=: e.g. slow=3:link=0.2:for=5s:every=30s")
        try:
            rank, factor = int(head), float(opts["link"])
        except ValueError:
            raise ValueError(f"slow={':'.join([head, *rest])!r}: RANK is an integer and link= a number") from None
        return cls(rank, factor, parse_time(opts["for"]), _time(opts, "every"), _time(opts, "at"))

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        links = dict(cond.links)
        links[self.rank] = links.get(self.rank, 1.0) * self.factor
        return replace(cond, links=tuple(sorted(links.items())))

    def to_string(self) -> str:
        return "slow=" + ":".join([str(self.rank), f"link={self.factor:g}", f"for={format_time(self.duration)}"]
                                  + _when(self.every, self.at))


@register_change
@dataclass(frozen=True)
class Cross(NetworkChange):
    """``cross=RATE[:flows=N][:on=T:off=T][:at=T]``: background flows on the bottleneck take their fair share."""

    key = "cross"
    stage = SHARE
    grammar = "cross=400mbit:flows=2:on=10s:off=20s"

    rate: float
    flows: int = 1
    on: float | None = None
    off: float | None = None
    at: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.rate:
            raise ValueError(f"cross: the rate of a background flow must be > 0 (inf: as fast as it can), "
                             f"got {self.rate!r}")
        if self.flows < 1:
            raise ValueError(f"cross: flows= must be >= 1, got {self.flows}")
        if (self.on is None) != (self.off is None):
            raise ValueError("cross: give on= and off= together (on/off traffic), or neither (always on)")
        if self.on is not None and self.off is not None and not (self.on > 0 and self.off > 0):
            raise ValueError("cross: on= and off= must be times > 0")

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "Cross":
        opts = _options("cross", rest, ("flows", "on", "off", "at"))
        try:
            flows = int(opts.get("flows", "1"))
        except ValueError:
            raise ValueError(f"cross: flows= must be an integer, got {opts['flows']!r}") from None
        return cls(parse_bandwidth(head), flows, _time(opts, "on"), _time(opts, "off"), _time(opts, "at") or 0.0)

    def state(self, t: float) -> tuple[bool, float]:
        if self.on is None or self.off is None:
            return (t >= self.at, self.at if t < self.at else math.inf)
        return _window(t, self.at, self.on, self.on + self.off)

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        share = max(bandwidth / (self.flows + 1), bandwidth - self.flows * self.rate)
        return replace(cond, bandwidth=share)

    def to_string(self) -> str:
        parts = [format_bandwidth(self.rate)] + ([f"flows={self.flows}"] if self.flows != 1 else [])
        if self.on is not None and self.off is not None:
            parts += [f"on={format_time(self.on)}", f"off={format_time(self.off)}"]
        if self.at:
            parts.append(f"at={format_time(self.at)}")
        return "cross=" + ":".join(parts)


@register_change
@dataclass(frozen=True)
class Trace(NetworkChange):
    """``trace=FILE[:repeat]``: conditions read from a file (module doc: CSV or Mahimahi)."""

    key = "trace"
    stage = BASE
    grammar = "trace=FILE[:repeat]"

    path: str
    repeat: bool = False
    #: read as Mahimahi's packet-delivery trace (which always repeats)
    mahimahi: bool = False
    #: (time, bandwidth, latency, loss) per change, time ascending from 0
    rows: tuple[tuple[float, float, float | None, float | None], ...] = field(default=(), compare=False, repr=False)
    period: float = field(default=math.inf, compare=False)

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "Trace":
        if rest not in ([], ["repeat"]):
            raise ValueError(f"trace={':'.join([head, *rest])!r}: write trace=FILE or trace=FILE:repeat")
        return cls.load(head, repeat=bool(rest))

    @classmethod
    def load(cls, path: str, repeat: bool = False) -> "Trace":
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"trace {path!r}: no such file (write trace=PATH to a CSV or a Mahimahi trace)")
        text = file.read_text()
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if lines and all(ln.isdigit() for ln in lines):
            rows, period = _mahimahi(lines, path)
            return cls(path, True, True, rows, period)
        rows = _csv_rows(lines, path)
        if repeat:
            if len(rows) < 2 or rows[-1][0] <= 0:
                raise ValueError(f"trace {path!r}: a repeating trace needs two rows or more; its last row's time is "
                                 "the period")
            return cls(path, True, False, rows[:-1], rows[-1][0])
        return cls(path, False, False, rows)

    def _index(self, t: float) -> tuple[int, float, float]:
        """The row in force at ``t``, the start of the current period, and the row's end (absolute)."""
        base = 0.0
        if self.repeat and math.isfinite(self.period):
            base = math.floor(t / self.period) * self.period
        local = t - base
        i = max(0, _bisect_right([r[0] for r in self.rows], local) - 1)
        end = self.rows[i + 1][0] if i + 1 < len(self.rows) else (self.period if self.repeat else math.inf)
        return i, base, base + end

    def state(self, t: float) -> tuple[bool, float]:
        return True, self._index(t)[2]

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        raise AssertionError("a trace sets the base condition (Schedule.condition)")

    def base(self, t: float) -> Condition:
        i, _, _ = self._index(t)
        _, bw, lat, loss = self.rows[i]
        if bw == 0:
            return Condition(down=True)
        return Condition(bandwidth=bw, latency=lat, loss=loss)

    def to_string(self) -> str:
        return f"trace={self.path}" + (":repeat" if self.repeat and not self.mahimahi else "")


def _bisect_right(values: Sequence[float], x: float) -> int:
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _number_or(parse: Callable[[str], float], text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return parse(text)


def _csv_rows(lines: list[str], path: str) -> tuple[tuple[float, float, float | None, float | None], ...]:
    rows: list[tuple[float, float, float | None, float | None]] = []
    for n, cells in enumerate(csv.reader(lines), 1):
        cells = [c.strip() for c in cells]
        if n == 1 and cells and cells[0].lower() in ("time", "t", "seconds"):
            continue  # a header
        if len(cells) < 2 or len(cells) > 4:
            raise ValueError(f"trace {path!r} line {n}: expected time,bandwidth[,latency[,loss]], got {cells}")
        try:
            t = _number_or(parse_time, cells[0])
            bw = 0.0 if cells[1] in ("0", "down") else _number_or(parse_bandwidth, cells[1])
            lat = _number_or(parse_time, cells[2]) if len(cells) > 2 and cells[2] else None
            loss = parse_fraction(cells[3]) if len(cells) > 3 and cells[3] else None
        except ValueError as exc:
            raise ValueError(f"trace {path!r} line {n}: {exc}") from None
        if bw < 0 or (lat is not None and lat < 0) or (loss is not None and not 0 <= loss < 1):
            raise ValueError(f"trace {path!r} line {n}: bandwidth and latency must be >= 0, loss in [0, 1)")
        if rows and t <= rows[-1][0]:
            raise ValueError(f"trace {path!r} line {n}: times must increase, got {t:g} s after {rows[-1][0]:g} s")
        rows.append((t, bw, lat, loss))
    if not rows:
        raise ValueError(f"trace {path!r} has no rows")
    if rows[0][0] != 0:
        raise ValueError(f"trace {path!r}: the first row must be at time 0, got {rows[0][0]:g} s")
    return tuple(rows)


def _mahimahi(lines: list[str], path: str) -> tuple[tuple[tuple[float, float, float | None, float | None], ...], float]:
    stamps = [int(ln) for ln in lines]
    if any(b < a for a, b in zip(stamps, stamps[1:])):
        raise ValueError(f"trace {path!r}: Mahimahi timestamps must not decrease")
    period = stamps[-1] / 1000
    if period <= 0:
        raise ValueError(f"trace {path!r}: a Mahimahi trace must last more than 0 ms")
    bin_ms = round(MAHIMAHI_BIN * 1000)
    bins = max(1, math.ceil(stamps[-1] / bin_ms))
    counts = [0] * bins
    for ms in stamps:  # the packet of millisecond ms leaves during (ms - 1, ms]
        counts[min(bins - 1, (max(ms, 1) - 1) // bin_ms)] += 1
    width = [min(MAHIMAHI_BIN, period - k * MAHIMAHI_BIN) for k in range(bins)]
    rows = tuple((k * MAHIMAHI_BIN, counts[k] * MAHIMAHI_PACKET_BYTES * 8 / width[k], None, None)
                 for k in range(bins))
    return rows, period


def _when(every: float | None, at: float | None) -> list[str]:
    return ([f"every={format_time(every)}"] if every is not None else []) + \
        ([f"at={format_time(at)}"] if at is not None else [])


def _options(kind: str, parts: list[str], allowed: tuple[str, ...]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"{kind}: unknown part {part!r}; valid: {', '.join(k + '=' for k in allowed)}")
        opts[key] = value
    return opts


def _time(opts: dict[str, str], key: str) -> float | None:
    return parse_time(opts[key]) if key in opts else None


def parse_event(key: str, value: str) -> NetworkChange:
    """Read one change token (``drop=...``) with its registered kind; ValueError with the grammar otherwise."""
    kind = CHANGE_KINDS.get(key)
    if kind is None:
        raise ValueError(f"unknown kind of network change {key!r}; valid: {', '.join(CHANGE_KINDS)}")
    head, *rest = value.split(":")
    return kind.parse(head, rest)


@dataclass(frozen=True)
class Schedule:
    """The spec's events composed: the condition at any time, and where it next changes."""

    events: tuple[NetworkChange, ...]
    #: the events that change a condition, in the order they apply (by stage, then as given)
    _staged: tuple[NetworkChange, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for event in self.events:
            if CHANGE_KINDS.get(getattr(type(event), "key", "")) is not type(event):
                raise TypeError(f"{type(event).__name__} is not a registered kind of network change: decorate its "
                                "class with @register_change (gradwire.net.schedule) so that schedules know when "
                                "to apply it")
        bases = [e for e in self.events if e.stage == BASE]
        if len(bases) > 1:
            raise ValueError(f"one base condition per network, got {', '.join(e.key + '=' for e in bases)}")
        object.__setattr__(self, "_staged", tuple(sorted((e for e in self.events if e.stage != BASE),
                                                         key=lambda e: e.stage)))

    def condition(self, t: float, bandwidth: float) -> tuple[Condition, float]:
        """The condition at ``t`` on a link of ``bandwidth`` bits/s, and the next time it may change."""
        cond, nxt = Condition(), math.inf
        base = next((e for e in self.events if e.stage == BASE), None)
        if base is not None:
            cond = base.base(t)
            nxt = base.state(t)[1]
        rate = cond.bandwidth if cond.bandwidth is not None else bandwidth
        for event in self._staged:  # rates first, then links, shares of what is left, then down
            active, change = event.state(t)
            nxt = min(nxt, change)
            if active:
                cond = event.apply(cond, rate)
                rate = cond.bandwidth if cond.bandwidth is not None else rate
        return cond, nxt

    def segments(self, t: float, bandwidth: float) -> Iterator[tuple[float, Condition]]:
        """``(end, condition)`` of each stretch from ``t`` on."""
        for _ in range(MAX_SEGMENTS):
            cond, end = self.condition(t, bandwidth)
            if end <= t:  # a floating-point tie at a boundary: step past it
                end = math.nextafter(t, math.inf)
            yield end, cond
            if math.isinf(end):
                return
            t = end
        raise RuntimeError(f"the network schedule changes more than {MAX_SEGMENTS} times within one op")


def finish_time(start: float, segments: Iterator[tuple[float, Condition]],
                seconds: Callable[[Condition], float], horizon: float = math.inf) -> float:
    """When an op started at ``start`` ends (module doc), or ``inf`` if not before ``horizon``.

    ``segments`` are ``(end, condition)`` from ``start`` on; ``seconds(c)``
    prices the op on the constant condition ``c`` (``inf`` while down).
    """
    t, left = start, 1.0
    for end, cond in segments:
        if t >= horizon:
            return math.inf
        cost = math.inf if cond.down else seconds(cond)
        if cost <= 0:
            return t
        if math.isfinite(cost):
            need = left * cost
            if t + need <= end:
                return t + need
            left -= (end - t) / cost
        t = end
    return math.inf
