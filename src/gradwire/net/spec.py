"""Network specs: a frozen :class:`NetSpec`, the :data:`PRESETS` registry and the spec grammar.

Grammar: comma-separated tokens, applied left to right (later ones win)::

    spec   := token ("," token)*
    token  := PRESET | key "=" value
    PRESET := loopback | 1gbe | 10gbe | 25gbe | 100gbe | ib-hdr | wan | nvlink | local | custom

A preset token sets ``name``, ``bandwidth``, ``latency`` and ``protocol``;
other fields keep their value. Without a preset (or with ``custom``) the base
is unlimited bandwidth, zero latency, TCP framing. Keys: see :func:`spec_keys`;
``intra=PRESET`` copies a preset's link into the intra_* keys and
``straggler=...`` may repeat (one entry per rank, the last one wins). Examples::

    10gbe,latency=200us
    bandwidth=1gbit,latency=50us,jitter=10us,loss=0.01%
    100gbe,topology=2x4,intra=nvlink,algorithm=hierarchical
    1gbe,straggler=3:link=0.5:compute=2
    1gbe,topology=auto,intra=loopback
    wan,tcp_wmem=16MiB,streams=4

TCP keys (``tcp``, ``tcp_rmem``, ``tcp_wmem``, ``initcwnd``, ``streams``,
``rto_min``, ``slow_start_after_idle``, ``congestion``; Linux's defaults, see
:mod:`gradwire.net.tcp`) shape links with ``protocol=tcp`` only.

``topology=auto`` is resolved when the gradwire backend creates its group:
nodes and ranks per node are read in torchrun's environment (see
:func:`resolve_topology`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from gradwire.device.catalog import parse_device
from gradwire.net.algorithms import ALGORITHM_CHOICES
from gradwire.net.link import FRAMINGS, Link, tcp_framing
from gradwire.net.schedule import CHANGE_KINDS, RESERVED_KEYS, NetworkChange, Schedule, parse_event
from gradwire.net.tcp import TCP_KEYS, TcpConfig
from gradwire.net.units import (
    _shown, format_bandwidth, format_fraction, format_time, parse_bandwidth, parse_fraction, parse_time,
)

JITTER_DISTS: tuple[str, ...] = ("uniform", "normal", "pareto")
CLOCKS: tuple[str, ...] = ("realtime", "sim")
#: older names of the clocks: ``virtual`` was the simulated clock's name
_CLOCK_ALIASES = {"virtual": "sim", "simulated": "sim"}
#: ``topology=auto``: read the layout in torchrun's environment (:func:`resolve_topology`)
AUTO_TOPOLOGY = "auto"
#: the preset of no communication at all (see :data:`PRESETS`)
LOCAL = "local"
#: what a ``local`` spec reads besides its name; its link fields reach no wire
_LOCAL_KEYS = ("name", "clock", "device", "seed", "topology")
_LINK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
PROTOCOLS: tuple[str, ...] = tuple(FRAMINGS)

# Ranges of the numeric fields: far past any real network, while the times the
# model derives from them stay finite (bandwidth=1e-30bit priced a 4 KB
# all_reduce at 1e34 s, and the first collective died with OverflowError).
#: slowest and fastest finite link, bits/s (``inf`` = unlimited is allowed too)
MIN_RATE, MAX_RATE = 1.0, 1e15
#: longest latency or jitter, seconds
MAX_TIME = 3600.0
#: smallest and largest straggler factor (link speed, compute time)
MIN_FACTOR, MAX_FACTOR = 1e-3, 1e3


@dataclass(frozen=True)
class Straggler:
    """One slow rank: ``straggler=RANK:link=F:compute=F``."""

    rank: int
    """global rank that straggles"""
    link: float = 1.0
    """multiplier on its link bandwidth (0.5 = half speed)"""
    compute: float = 1.0
    """multiplier on its compute time (2.0 = twice as slow)"""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"straggler rank must be an int >= 0, got {self.rank!r}")
        for name in ("link", "compute"):
            value = float(getattr(self, name))
            if not 0 < value < math.inf:
                raise ValueError(f"straggler {name} factor must be a finite number > 0, got {value!r}")
            if not MIN_FACTOR <= value <= MAX_FACTOR:
                raise ValueError(f"straggler {name} factor must be between {MIN_FACTOR:g} and {MAX_FACTOR:g}, "
                                 f"got {value!r}")
            object.__setattr__(self, name, value)

    @classmethod
    def parse(cls, text: str) -> "Straggler":
        rank_text, *parts = text.split(":")
        try:
            rank = int(rank_text)
        except ValueError:
            raise ValueError(f"straggler {text!r} must start with a rank, e.g. 'straggler=3:link=0.5:compute=2'") from None
        factors: dict[str, float] = {}
        for part in parts:
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("link", "compute"):
                raise ValueError(f"bad straggler part {part!r} in {text!r}; valid: link=FACTOR, compute=FACTOR")
            try:
                factors[key.strip()] = float(value)
            except ValueError:
                raise ValueError(f"straggler factor {value!r} in {text!r} is not a number") from None
        return cls(rank, **factors)

    def to_string(self) -> str:
        return f"{self.rank}:link={self.link!r}:compute={self.compute!r}"


@dataclass(frozen=True)
class Preset:
    """A named link: what a preset token sets."""

    name: str
    bandwidth: float
    """line rate, bits/s"""
    latency: float
    """one-way latency, seconds"""
    protocol: str
    description: str


#: named links; a preset token sets name, bandwidth, latency and protocol.
#:
#: ========  ===========================  =======  ========
#: preset    bandwidth                    latency  protocol
#: ========  ===========================  =======  ========
#: loopback  unlimited (costs are 0 s)    0        none
#: 1gbe      1 Gbit/s                     50 us    tcp
#: 10gbe     10 Gbit/s                    20 us    tcp
#: 25gbe     25 Gbit/s                    10 us    tcp
#: 100gbe    100 Gbit/s                   5 us     tcp
#: ib-hdr    200 Gbit/s                   2 us     rdma
#: wan       100 Mbit/s                   20 ms    tcp
#: nvlink    300 GB/s (2.4 Tbit/s)        3 us     none
#: local     no network at all (see below) 0        none
#: ========  ===========================  =======  ========
#:
#: ``local`` is not a link but its absence, for an ideal that really is a
#: bound: the backend answers every collective from the rank's own data, as
#: if every rank held the same tensor, without running the inner collective
#: (:data:`LOCAL`). ``loopback`` still runs the real collectives at 0 s of
#: modelled time, so it measures the real transfers of the host.
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("loopback", math.inf, 0.0, "none", "adds nothing: every collective costs 0 s, bytes still counted"),
        Preset("1gbe", 1e9, 50e-6, "tcp", "Gigabit Ethernet through a switch"),
        Preset("10gbe", 10e9, 20e-6, "tcp", "10 Gigabit Ethernet, typical cloud VM network"),
        Preset("25gbe", 25e9, 10e-6, "tcp", "25 Gigabit Ethernet"),
        Preset("100gbe", 100e9, 5e-6, "tcp", "100 Gigabit Ethernet, TCP (no RoCE)"),
        Preset("ib-hdr", 200e9, 2e-6, "rdma", "InfiniBand HDR, RDMA"),
        Preset("wan", 100e6, 20e-3, "tcp", "wide-area link between sites"),
        Preset("nvlink", 2.4e12, 3e-6, "none", "NVLink-style intra-node link; use as intra=nvlink"),
        Preset("local", math.inf, 0.0, "none", "no communication at all: each rank answers every collective from "
               "its own data, as if all ranks held the same (0 s, 0 bytes on the wire)"),
    )
}


def _choice(value: Any, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def _rate(value: Any, what: str) -> float:
    value = float(value)
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{what} must be > 0 bits/s, got {value!r}")
    if value != math.inf and not MIN_RATE <= value <= MAX_RATE:
        raise ValueError(f"{what} must be between 1 bit/s and 1 Pbit/s (1e15 bits/s), or inf for "
                         f"unlimited; got {value:g} bits/s")
    return value


def _duration(value: Any, what: str) -> float:
    value = float(value)
    if not 0 <= value < math.inf:
        raise ValueError(f"{what} must be a finite time >= 0 s, got {value!r}")
    if value > MAX_TIME:
        raise ValueError(f"{what} must be at most {MAX_TIME:g} s (an hour), got {value:g} s")
    return value


@dataclass(frozen=True)
class NetSpec:
    """Everything the network model needs to price a collective.

    Build it from the spec grammar with :func:`parse_spec` where a user gives
    one (a command line, ``$GRADWIRE_NET``), or with :meth:`NetSpec.of` in a
    constructor that accepts a string or a spec; then pass the object on.
    ``to_string`` turns it back into text only where it crosses a process
    boundary.
    """

    name: str = "custom"
    """preset the spec started from, or ``custom``"""
    bandwidth: float = math.inf
    """inter-node line rate in bits/s: 1 bit/s to 1 Pbit/s, or ``inf`` = unlimited"""
    latency: float = 0.0
    """inter-node one-way latency in seconds (alpha), 0 to 3600"""
    protocol: str = "tcp"
    """framing on the inter-node link: tcp, rdma or none (see gradwire.net.link)"""
    mtu: int | None = None
    """IP packet size of tcp links, 576 to 65535 bytes (jumbo frames: 9000, 9001 on AWS); None: 1500"""
    jitter: float = 0.0
    """jitter scale in seconds (0 to 3600), added once per latency step of a collective"""
    jitter_dist: str = "uniform"
    """uniform on [0, jitter], normal |N(0, jitter)|, or pareto (Lomax, shape 3, scale jitter)"""
    loss: float = 0.0
    """random packet-loss probability in [0, 1); TCP follows Mathis, others resend"""
    algorithm: str = "auto"
    """collective algorithm: auto picks the cheapest per op and size (see gradwire.net.algorithms)"""
    topology: tuple[int, int] | str | None = None
    """(nodes, ranks_per_node); None = flat, every rank its own node; ``"auto"`` = torchrun's layout (resolve_topology)"""
    intra_bandwidth: float | None = None
    """intra-node line rate in bits/s; None = same as the inter-node link"""
    intra_latency: float | None = None
    """intra-node one-way latency in seconds; None = same as the inter-node link"""
    intra_protocol: str | None = None
    """intra-node framing; None = same as the inter-node link"""
    clock: str = "realtime"
    """realtime: the backend waits out modelled time in this host's wall clock; sim: each rank runs on a
    simulated cluster clock, compute priced by ``device`` (gradwire.backend.simclock)"""
    device: str | None = None
    """what prices compute on the simulated clock (gradwire.device: a100, host:x0.1, 19.5/1555, step:35ms);
    None: ``host``, this rank's own thread CPU time"""
    seed: int = 0
    """seed of the jitter draws (with the op's sequence number)"""
    stragglers: tuple[Straggler, ...] = field(default=())
    """slow ranks, at most one entry per rank"""
    events: tuple[NetworkChange, ...] = field(default=())
    """how the network changes over time (drop, outage, slow, cross, trace: gradwire.net.schedule)"""
    tcp: TcpConfig = TcpConfig()
    """TCP's window cap, slow start, restart after idle and streams on tcp links (gradwire.net.tcp)"""
    link: str | None = None
    """a named bottleneck that jobs on this machine share (``link=NAME``): each gets its fair share while others send"""

    def __post_init__(self) -> None:
        _choice(self.name, ("custom", *PRESETS), "preset name")
        set_ = self._set
        set_("bandwidth", _rate(self.bandwidth, "bandwidth"))
        set_("latency", _duration(self.latency, "latency"))
        set_("jitter", _duration(self.jitter, "jitter"))
        if self.intra_bandwidth is not None:
            set_("intra_bandwidth", _rate(self.intra_bandwidth, "intra_bandwidth"))
        if self.intra_latency is not None:
            set_("intra_latency", _duration(self.intra_latency, "intra_latency"))
        _choice(self.protocol, PROTOCOLS, "protocol")
        if self.intra_protocol is not None:
            _choice(self.intra_protocol, PROTOCOLS, "intra_protocol")
        if self.mtu is not None:
            tcp_framing(self.mtu)  # checks it
            if "tcp" not in (self.protocol, self.intra_protocol):
                raise ValueError(f"mtu sets the framing of tcp links, and this spec has none (protocol="
                                 f"{self.protocol}); leave mtu out, or use protocol=tcp")
        _choice(self.jitter_dist, JITTER_DISTS, "jitter_dist")
        _choice(self.algorithm, ALGORITHM_CHOICES, "algorithm")
        set_("clock", _CLOCK_ALIASES.get(self.clock, self.clock))
        _choice(self.clock, CLOCKS, "clock")
        if self.device is not None:
            set_("device", parse_device(self.device).text)
            if self.clock != "sim":
                raise ValueError(f"device={self.device} prices compute on the simulated clock: add clock=sim "
                                 "(the realtime clock takes compute as this host runs it)")
        if self.link is not None:
            if not _LINK_NAME.fullmatch(self.link):
                raise ValueError(f"link name {self.link!r} must be 1 to 64 letters, digits, '-', '_' or '.' "
                                 "(the name jobs on this machine share), e.g. link=switch1")
            if self.clock != "realtime":
                raise ValueError("link= shares a bottleneck between jobs as they run: it needs clock=realtime")
        loss = float(self.loss)
        if not 0 <= loss < 1:
            raise ValueError(f"loss must be in [0, 100%), got {loss!r} (write '0.01%' or '0.0001')")
        set_("loss", loss)
        if self.topology is not None and self.topology != AUTO_TOPOLOGY:
            topo = tuple(self.topology)
            if len(topo) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in topo):
                raise ValueError(f"topology must be (nodes, ranks_per_node) with both >= 1, got {self.topology!r}")
            set_("topology", topo)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        stragglers = tuple(self.stragglers)
        ranks = [s.rank for s in stragglers]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"one straggler entry per rank, got ranks {ranks}")
        set_("stragglers", stragglers)
        set_("events", tuple(self.events))
        if not isinstance(self.tcp, TcpConfig):
            raise ValueError(f"tcp must be a gradwire.net.tcp.TcpConfig, got {type(self.tcp).__name__}")
        if self.events:
            Schedule(self.events)  # one trace at most

    @classmethod
    def of(cls, value: "str | NetSpec | None") -> "NetSpec":
        """The spec ``value`` names: a :class:`NetSpec` as it is, a string parsed (:func:`parse_spec`), None loopback.

        The one way a function that accepts either form turns it into a spec.
        """
        return value if isinstance(value, NetSpec) else parse_spec(value)

    @property
    def is_local(self) -> bool:
        """No communication at all: every collective answered from the rank's own data (preset ``local``).

        The link fields of such a spec have no effect (:meth:`unused_by_local`
        names the ones set); the spec still parses, so every spec round-trips.
        """
        return self.name == LOCAL

    def unused_by_local(self) -> list[str]:
        """The fields a ``local`` spec sets that nothing reads: there is no link to shape."""
        if not self.is_local:
            return []
        return [f.name for f in fields(self) if f.name not in _LOCAL_KEYS
                and getattr(self, f.name) != getattr(_LOCAL_BASE, f.name)]

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalising a field of a frozen dataclass

    @property
    def has_intra_link(self) -> bool:
        """Whether the intra-node link was given explicitly (it is lossless then)."""
        return (self.intra_bandwidth, self.intra_latency, self.intra_protocol) != (None, None, None)

    def _tcp_for(self, protocol: str) -> TcpConfig | None:
        return self.tcp if protocol == "tcp" and self.tcp.enabled else None

    def _mtu_for(self, protocol: str) -> int | None:
        return self.mtu if protocol == "tcp" else None

    def inter_link(self) -> Link:
        """The link between nodes."""
        return Link(self.bandwidth, self.latency, self.protocol, self.loss, self._tcp_for(self.protocol),
                    self._mtu_for(self.protocol))

    def intra_link(self) -> Link:
        """The link between ranks of one node; inherits loss only when not given explicitly."""
        protocol = self.protocol if self.intra_protocol is None else self.intra_protocol
        return Link(
            self.bandwidth if self.intra_bandwidth is None else self.intra_bandwidth,
            self.latency if self.intra_latency is None else self.intra_latency,
            protocol,
            0.0 if self.has_intra_link else self.loss,
            self._tcp_for(protocol),
            self._mtu_for(protocol),
        )

    def to_string(self) -> str:
        """The spec in the token grammar; ``parse_spec(s.to_string()) == s``."""
        base = _apply_preset(NetSpec(), self.name) if self.name in PRESETS else NetSpec()
        tokens = [self.name] if self.name in PRESETS else []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "name" or value == getattr(base, f.name):
                continue
            if f.name == "stragglers":
                tokens += [f"straggler={s.to_string()}" for s in value]
            elif f.name == "events":
                tokens += [e.to_string() for e in value]
            elif f.name == "tcp":
                tokens += value.tokens()
            else:
                tokens.append(f"{f.name}={_FORMATTERS[f.name](value)}")
        return ",".join(tokens) or "custom"


def _local_base() -> NetSpec:
    p = PRESETS["loopback"]  # the same (absent) link; built before ``local`` may be named
    return replace(NetSpec(), bandwidth=p.bandwidth, latency=p.latency, protocol=p.protocol)


_LOCAL_BASE = _local_base()


def _apply_preset(spec: NetSpec, name: str) -> NetSpec:
    _choice(name, tuple(PRESETS), "preset")
    p = PRESETS[name]
    return replace(spec, name=p.name, bandwidth=p.bandwidth, latency=p.latency, protocol=p.protocol)


def _parse_topology(text: str) -> tuple[int, int] | str | None:
    if text.lower() in ("flat", "none"):
        return None
    if text.lower() == AUTO_TOPOLOGY:
        return AUTO_TOPOLOGY
    nodes, sep, per_node = text.lower().partition("x")
    try:
        return int(nodes), int(per_node)
    except ValueError:
        raise ValueError(f"bad topology {_shown(text)}; write NODESxRANKS_PER_NODE like '2x4', 'flat' or 'auto'") from None


def _parse_mtu(text: str) -> int:
    try:
        return int(text.lower().removesuffix("b"))
    except ValueError:
        raise ValueError(f"mtu must be a whole number of bytes like 1500 or 9000, got {_shown(text)}") from None


def _parse_seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"seed must be an integer >= 0, got {_shown(text)}") from None


_FORMATTERS: dict[str, Callable[[Any], str]] = {
    "bandwidth": format_bandwidth, "intra_bandwidth": format_bandwidth,
    "latency": format_time, "intra_latency": format_time, "jitter": format_time,
    "loss": format_fraction, "seed": str, "mtu": str,
    "topology": lambda t: "flat" if t is None else t if t == AUTO_TOPOLOGY else f"{t[0]}x{t[1]}",
    "protocol": str, "intra_protocol": str, "jitter_dist": str, "algorithm": str, "clock": str, "link": str,
    "device": str,
}

#: spec keys and how each value is read (``straggler`` and ``intra`` are handled apart)
_PARSERS: dict[str, Callable[[str], Any]] = {
    "bandwidth": parse_bandwidth, "intra_bandwidth": parse_bandwidth,
    "latency": parse_time, "intra_latency": parse_time, "jitter": parse_time,
    "loss": parse_fraction, "seed": _parse_seed, "topology": _parse_topology, "mtu": _parse_mtu,
    "protocol": str.lower, "intra_protocol": str.lower, "jitter_dist": str.lower,
    "algorithm": str.lower, "clock": str.lower, "link": str, "device": lambda v: parse_device(v).text,
}


def spec_keys() -> tuple[str, ...]:
    """Every ``key=`` of the grammar, the registered kinds of network change included."""
    return (*_PARSERS, "intra", "straggler", *CHANGE_KINDS, *TCP_KEYS)


#: named networks that change: a preset and its events (module doc of gradwire.net.schedule)
CHANGING: dict[str, str] = {
    "flaky-cloud": "10gbe,drop=1gbit:for=5s:every=30s,outage=1s:at=100s:every=120s",
    "shared-wan": "bandwidth=1gbit,latency=30ms,cross=400mbit:flows=2:on=10s:off=20s",
}

# a kind of network change may not take a word the grammar already reads (it would shadow it)
RESERVED_KEYS.update(_PARSERS, ("intra", "straggler", "custom"), TCP_KEYS, PRESETS, CHANGING)


def parse_spec(text: "str | NetSpec | None") -> NetSpec:
    """Parse a spec string (see the module docstring); ``None`` or ``""`` is ``loopback``.

    Called where a user gives the spec (the CLI's argument type, the
    environment a process inherits) and by :meth:`NetSpec.of`; everything
    else passes the parsed :class:`NetSpec` on.

    Raises ValueError naming the bad token and the valid choices.
    """
    if isinstance(text, NetSpec):
        return text
    if text is None or not text.strip():
        return _apply_preset(NetSpec(), "loopback")
    if not isinstance(text, str):
        raise TypeError(f"a network spec is a string or a NetSpec, got {type(text).__name__}")
    return _parse_tokens(text)


def _parse_tokens(text: str) -> NetSpec:
    """The grammar itself (:func:`parse_spec` after its checks); a named network that changes expands here."""
    updates: dict[str, Any] = {}
    stragglers: dict[int, Straggler] = {}
    events: list[NetworkChange] = []
    tcp = TcpConfig()
    spec = NetSpec()
    for position, token in enumerate((t.strip() for t in text.split(",")), 1):
        if not token:
            raise ValueError(f"network spec {_shown(text)} has an empty token (number {position}); separate "
                             "tokens with single commas, e.g. '10gbe,latency=200us'")
        key, sep, value = token.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep and key == "custom":
            spec = replace(spec, **updates, name="custom", bandwidth=math.inf, latency=0.0, protocol="tcp")
            updates = {}
        elif not sep and key in CHANGING:
            named = _parse_tokens(CHANGING[key])
            spec = _apply_preset(replace(spec, **updates), named.name) if named.name in PRESETS else replace(
                spec, **updates, name="custom", bandwidth=named.bandwidth, latency=named.latency,
                protocol=named.protocol)
            updates = {}
            events += named.events
        elif not sep:
            if key not in PRESETS:
                raise ValueError(f"unknown preset {token!r}; valid presets: {', '.join(PRESETS)}, or networks that "
                                 f"change: {', '.join(CHANGING)} (or key=value)")
            spec = _apply_preset(replace(spec, **updates), key)
            updates = {}
        elif key in CHANGE_KINDS:
            events.append(parse_event(key, value))
        elif key in TCP_KEYS:
            tcp = tcp.with_key(key, value)
        elif key == "straggler":
            straggler = Straggler.parse(value)
            stragglers[straggler.rank] = straggler
        elif key == "intra":
            _choice(value.lower(), tuple(PRESETS), "intra preset")
            p = PRESETS[value.lower()]
            updates.update(intra_bandwidth=p.bandwidth, intra_latency=p.latency, intra_protocol=p.protocol)
        elif key in _PARSERS:
            updates[key] = _PARSERS[key](value)
        else:
            raise ValueError(f"unknown spec key {key!r} in {token!r}; valid keys: {', '.join(spec_keys())}")
    return replace(spec, **updates, stragglers=tuple(stragglers.values()), events=tuple(events), tcp=tcp)


def resolve_topology(spec: NetSpec, world_size: int, env: Mapping[str, str]) -> NetSpec:
    """Fix ``topology=auto`` to ``NODESxRANKS`` with torchrun's variables in ``env``; other specs pass unchanged.

    torchrun gives every worker ``LOCAL_WORLD_SIZE`` (ranks on its node) and
    places the ranks of node ``GROUP_RANK`` at ``GROUP_RANK * LOCAL_WORLD_SIZE +
    LOCAL_RANK``, the contiguous layout a ``NxM`` topology prices. A launch that
    breaks it (nodes of different sizes) cannot be written as ``NxM`` and is
    refused rather than priced wrongly.
    """
    if spec.topology != AUTO_TOPOLOGY:
        return spec
    if "LOCAL_WORLD_SIZE" not in env:
        raise ValueError("topology=auto reads the layout in torchrun's LOCAL_WORLD_SIZE and GROUP_RANK, which this "
                         "process lacks; launch it with torchrun or write topology=NODESxRANKS")
    per_node = int(env["LOCAL_WORLD_SIZE"])
    if per_node < 1 or world_size % per_node:
        raise ValueError(f"topology=auto: {world_size} ranks do not split into nodes of LOCAL_WORLD_SIZE={per_node}")
    nodes = world_size // per_node
    if "GROUP_WORLD_SIZE" in env and int(env["GROUP_WORLD_SIZE"]) != nodes:
        raise ValueError(f"topology=auto: {env['GROUP_WORLD_SIZE']} nodes of different sizes (world {world_size}, "
                         f"this node {per_node}) cannot be priced as NODESxRANKS")
    if all(k in env for k in ("RANK", "GROUP_RANK", "LOCAL_RANK")) and \
            int(env["RANK"]) != int(env["GROUP_RANK"]) * per_node + int(env["LOCAL_RANK"]):
        raise ValueError(f"topology=auto: rank {env['RANK']} is not rank {env['LOCAL_RANK']} of node "
                         f"{env['GROUP_RANK']} in a contiguous NODESxRANKS layout")
    return replace(spec, topology=(nodes, per_node))
