"""What to shape on which interface for a network spec: a pure plan, checked against the kernel's abilities.

Every node has one full-duplex link into the switch, like a NIC into a
switch port. Its two directions are shaped apart:

- upload: the node's ``gw-eth`` egress, at the node's rate, plus netem's
  delay, jitter and loss when the spec asks for them;
- download: the switch port's egress toward the node, at the node's rate.

A message from node A to node B passes A's upload and B's download, so it
meets the one-way latency once, the loss once and the rate at both ends (the
slower end paces it, as a real switch would). Ranks of one node talk over the
namespace's loopback, which is not shaped: the model of an emulated run has an
unlimited intra-node link (``intra=loopback``), see :attr:`EmulationPlan.model_spec`.

Rate limiter parameters and their traps:

- ``rate`` is the line rate. tbf and htb count each packet's length including
  the Ethernet header and, for a GSO packet, one header per segment, so TCP
  payload flows at ``rate * 1448 / 1514`` (the model's ``tcp`` framing).
- ``burst`` is the bucket: after an idle moment that many bytes leave at once.
  Too small and the shaper cannot keep up: its timer fires late on a busy
  machine and the tokens it would have earned are capped away (a 64 KB bucket
  at 1 Gbit/s, half a millisecond of line time, measured up to 2.4x the
  model's time). Too large and every message starts with a free head start.
  The default holds :data:`BURST_SECONDS` of line time, at least
  :data:`MIN_BURST` (250 KB at 1 Gbit/s, 32 KiB at 100 Mbit/s).
- ``limit`` is tbf's queue behind the bucket, :data:`QUEUE_SECONDS` of line
  time (htb's classes queue in the kernel's default pfifo, 1000 packets). A
  short queue drops packets when senders converge on one port and TCP then
  slows down for reasons the model does not know.
- ACKs. A node's upload carries its own data and the acknowledgements of the
  data it receives. In one FIFO those ACKs wait behind a few GSO packets of
  data (about 10 ms at 100 Mbit/s); the peer's TCP then sees an inflated RTT,
  and flows both ways at once (every ring collective) measured 5-8 % below
  the link rate at 100 Mbit/s, 2-3 % at 1 Gbit/s. Linux hosts run fq or
  fq_codel, which serve such sparse flows first; this kernel has neither, so
  the preferred shaper, htb, gives small TCP packets (IP length below 128
  bytes: pure ACKs) a class of their own at priority 0, under the same rate
  (their bytes still count). Both directions of a 100 Mbit/s link then carried
  16 MB within 0.3 % of the model. tbf, one FIFO, is the fallback.

netem, where present: delay ``latency`` on upload. The model draws jitter
uniformly in ``[0, jitter]``; netem's uniform jitter is ``delay +- jitter``, so
the plan asks netem for ``latency + jitter/2 +- jitter/2``. netem's normal and
pareto tables are not the model's folded normal and Lomax, and are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gradwire.emulate.layout import NODE_IF, Layout, port_if
from gradwire.net.schedule import BASE, LINKS, RATE, Cross, Slow, Trace
from gradwire.net.spec import PRESETS, NetSpec
from gradwire.net.units import format_fraction, format_time, human_bandwidth

__all__ = [
    "BURST_SECONDS", "Capabilities", "EmulationPlan", "Impairment", "MIN_BURST", "Port", "QUEUE_SECONDS",
    "RATE_LIMITERS", "RateLimit", "Unsupported", "default_burst", "event_refusals", "model_spec", "plan_network",
]

#: a token bucket holds this much line time by default
BURST_SECONDS = 2e-3
#: smallest default bucket, bytes (it must hold a few full-size packets)
MIN_BURST = 32 << 10
#: queue behind the bucket, in line time
QUEUE_SECONDS = 0.1
#: rate limiters in order of preference: htb with a priority class for ACKs, tbf with one FIFO
RATE_LIMITERS: tuple[str, ...] = ("htb", "tbf")
#: tbf's rate field is 32 bits of bytes/s (pyroute2 does not send tbf's 64-bit rate)
TBF_MAX_RATE = (2**32 - 1) * 8


class Unsupported(ValueError):
    """The spec asks for what this kernel (or emulation) cannot do; ``reasons`` names each part."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("cannot emulate this network: " + "; ".join(reasons))
        self.reasons = reasons


@dataclass(frozen=True)
class Capabilities:
    """What the kernel accepted when probed (see :func:`gradwire.emulate.netlink.probe`)."""

    qdiscs: frozenset[str]
    """qdisc kinds it accepted, out of tbf, htb, netem"""
    filters: frozenset[str] = frozenset()
    """classifier kinds it accepted: u32 (htb's ACK class needs it)"""

    def has(self, kind: str) -> bool:
        """Whether the shaper ``kind`` can be built: htb also needs the u32 classifier."""
        return kind in self.qdiscs and (kind != "htb" or "u32" in self.filters)

    def describe(self) -> str:
        known = ("tbf", "htb", "netem")
        parts = [f"{k} {'yes' if k in self.qdiscs else 'no'}" for k in known]
        return ", ".join([*parts, f"u32 {'yes' if 'u32' in self.filters else 'no'}"])


@dataclass(frozen=True)
class RateLimit:
    """A token bucket on one direction of a link."""

    kind: str
    """tbf (one FIFO) or htb (small TCP packets first, see the module doc)"""
    rate: float
    """line rate, bits/s"""
    burst: int
    """bucket, bytes"""
    limit: int
    """tbf's queue, bytes"""

    @property
    def rate_bytes(self) -> int:
        return int(self.rate / 8)


@dataclass(frozen=True)
class Impairment:
    """netem parameters of one direction: what the model's latency, jitter and loss become."""

    delay: float
    """mean delay, seconds"""
    jitter: float
    """netem jitter (uniform delay +- jitter), seconds"""
    loss: float
    """loss probability in [0, 1)"""


@dataclass(frozen=True)
class Port:
    """One shaped direction: an interface in a namespace and what goes on its egress."""

    namespace: str
    device: str
    node: int
    direction: str
    """``upload`` (node to switch) or ``download`` (switch to node)"""
    rate: RateLimit | None
    impairment: Impairment | None


@dataclass(frozen=True)
class EmulationPlan:
    """Everything a run builds: the layout, the spec, each shaped direction, and the equivalent model."""

    layout: Layout
    spec: NetSpec
    ports: tuple[Port, ...]
    model_spec: NetSpec
    """the spec under which the gradwire model prices this emulated network"""
    burst: int | None = None
    """the bucket asked for (``--burst``); None: each rate's :func:`default_burst`, also as the schedule changes it"""

    def describe(self) -> list[str]:
        """Lines for a person: the nodes, each node's link, the model spec."""
        from gradwire.net.units import human_time

        lay = self.layout
        lines = [f"{lay.nodes} node(s) x {lay.per_node} rank(s) on {lay.subnet}, switch {lay.switch_ns}"]
        for p in self.ports:
            parts = []
            if p.rate is not None:
                queue = (f"queue {p.rate.limit / 2**20:.1f} MiB" if p.rate.kind == "tbf"
                         else "ACKs first")
                parts.append(f"{p.rate.kind} {human_bandwidth(p.rate.rate)}, burst {p.rate.burst / 1024:.0f} KiB, "
                             f"{queue}")
            if p.impairment is not None:
                imp = p.impairment
                parts.append(f"netem delay {human_time(imp.delay)} +- {human_time(imp.jitter)} loss {imp.loss:.4%}")
            addr = f" {lay.address(p.node)}" if p.direction == "upload" else ""
            lines.append(f"  node {p.node} {p.direction:<8} {p.namespace}/{p.device}{addr}: "
                         f"{', '.join(parts) or 'unshaped'}")
        lines.append(f"model of this network: --net {self.model_spec.to_string()}")
        if self.model_spec.algorithm == "auto":
            lines.append("  (gloo's all_reduce is a ring whatever the size: add algorithm=ring to price what gloo runs)")
        return lines


def default_burst(rate: float) -> int:
    """Bucket size in bytes for a line rate in bits/s (module doc)."""
    return max(int(rate / 8 * BURST_SECONDS), MIN_BURST)


def plan_network(
    spec: NetSpec,
    layout: Layout,
    caps: Capabilities,
    limiter: str = "auto",
    burst: int | None = None,
) -> EmulationPlan:
    """Plan the qdiscs of ``layout`` for ``spec`` on a kernel with ``caps``.

    Args:
        spec: the network; its topology, if fixed, must equal the layout's.
        layout: nodes, ranks per node, names.
        caps: what the kernel accepts.
        limiter: ``htb``, ``tbf`` or ``auto`` (the first of :data:`RATE_LIMITERS` the kernel has).
        burst: bucket in bytes; None for :func:`default_burst`.

    Raises:
        Unsupported: every part of the spec this emulation cannot produce,
            each with its reason; nothing is dropped silently.
    """
    reasons: list[str] = []
    has_rate = math.isfinite(spec.bandwidth)
    kind = _limiter(limiter, caps, reasons) if has_rate else None
    if has_rate and spec.protocol != "tcp":
        reasons.append(f"protocol={spec.protocol}: the emulated links carry TCP/IP over Ethernet; use protocol=tcp")
    if spec.mtu is not None and spec.mtu != 1500:
        reasons.append(f"mtu={spec.mtu}: the emulated veth links carry 1500-byte packets; leave mtu out (the "
                       "simulated backend prices other MTUs)")
    if kind == "tbf" and spec.bandwidth > TBF_MAX_RATE:
        reasons.append(f"tbf takes at most {TBF_MAX_RATE / 1e9:.1f} Gbit/s; use --shaper htb")
    impaired = spec.latency > 0 or spec.jitter > 0 or spec.loss > 0
    if impaired and "netem" not in caps.qdiscs:
        asked = [f"{k}={fmt(getattr(spec, k))}" for k, fmt in (("latency", format_time), ("jitter", format_time),
                                                                ("loss", format_fraction)) if getattr(spec, k) > 0]
        reasons.append(f"{', '.join(asked)} {'needs' if len(asked) == 1 else 'need'} the netem qdisc, which this "
                       "kernel lacks (sch_netem); write latency=0s (and no jitter or loss) to emulate the bandwidth alone")
    if spec.jitter > 0 and spec.jitter_dist != "uniform":
        reasons.append(f"jitter_dist={spec.jitter_dist}: netem's tables are not the model's distribution; "
                       "use jitter_dist=uniform")
    intra = spec.intra_link()
    if spec.has_intra_link and (math.isfinite(intra.bandwidth) or intra.latency > 0):
        reasons.append("an intra-node link: ranks of one node talk over the namespace's loopback, which is not "
                       "shaped; drop the intra_* keys (or write intra=loopback), or run one rank per node")
    if spec.clock != "realtime":
        reasons.append(f"clock={spec.clock}: real packets take real time; the clock applies to the simulated backend")
    slow = [s for s in spec.stragglers if s.compute != 1.0]
    if slow:
        reasons.append(f"compute stragglers (ranks {', '.join(str(s.rank) for s in slow)}): emulation shapes the "
                       "network, not the CPU; keep link= factors only")
    outside = [s.rank for s in spec.stragglers if s.rank >= layout.world_size]
    if outside:
        reasons.append(f"straggler ranks {outside} are outside the world of {layout.world_size} ranks")
    topo = spec.topology  # topology=auto passes: the ranks resolve it against this same layout
    if isinstance(topo, tuple) and topo != (layout.nodes, layout.per_node):
        reasons.append(f"topology={topo[0]}x{topo[1]} but the run has {layout.nodes} nodes x {layout.per_node} ranks")
    if spec.events:
        reasons += event_refusals(spec, caps, layout.world_size, kind)
    if reasons:
        raise Unsupported(reasons)
    ports: list[Port] = []
    for node in range(layout.nodes):
        rate = _rate_limit(spec, layout, node, kind, burst)
        impairment = Impairment(spec.latency + spec.jitter / 2, spec.jitter / 2, spec.loss) if impaired else None
        ports.append(Port(layout.node_ns(node), NODE_IF, node, "upload", rate, impairment))
        ports.append(Port(layout.switch_ns, port_if(node), node, "download", rate, None))
    return EmulationPlan(layout, spec, tuple(ports), model_spec(spec, layout), burst)


def _rate_changes(spec: NetSpec) -> list[str]:
    """The keys of the spec's changes that set a shaper's rate: by their stage, so a new kind is covered too."""
    return list(dict.fromkeys(f"{e.key}=" for e in spec.events if e.stage in (BASE, RATE, LINKS)))


def event_refusals(spec: NetSpec, caps: Capabilities, world_size: int, kind: str | None) -> list[str]:
    """Why the events of ``spec`` cannot be emulated with a ``kind`` shaper (None: unshaped); [] when they can."""
    reasons: list[str] = []
    events = spec.events
    if any(isinstance(e, Cross) for e in events):
        reasons.append("cross=: background flows need traffic of their own on the links, which gradwire emulate "
                       "does not generate; run your own sender inside the namespaces, or price cross= with the "
                       "simulated backend (--backend gradwire --net ...)")
    trace = next((e for e in events if isinstance(e, Trace)), None)
    if trace is not None:
        if any(lat is not None and lat != spec.latency for _, _, lat, _ in trace.rows):
            need = "netem, which this kernel lacks (sch_netem)" if "netem" not in caps.qdiscs else \
                "netem changed at run time, which gradwire emulate does not do"
            reasons.append(f"trace {trace.path!r} changes the latency: that needs {need}; drop its latency column")
        if any(loss is not None and loss != spec.loss for _, _, _, loss in trace.rows):
            need = "netem, which this kernel lacks (sch_netem)" if "netem" not in caps.qdiscs else \
                "netem changed at run time, which gradwire emulate does not do"
            reasons.append(f"trace {trace.path!r} changes the loss: that needs {need}; drop its loss column")
    rate_changes = _rate_changes(spec)
    if rate_changes and kind is None:
        reasons.append(f"{', '.join(rate_changes)} change the rate of a shaper, and this network has none: give the "
                       "links a rate to start from, e.g. bandwidth=1gbit")
    outside = sorted({e.rank for e in events if isinstance(e, Slow) and e.rank >= world_size})
    if outside:
        reasons.append(f"slow= ranks {outside} are outside the world of {world_size} ranks")
    if kind == "tbf":
        top = spec.bandwidth * max([1.0, *(e.factor for e in events if isinstance(e, Slow))])
        if trace is not None:
            top = max([top, *(bw for _, bw, _, _ in trace.rows)])
        if top > TBF_MAX_RATE:
            reasons.append(f"the schedule reaches {human_bandwidth(top)}, and tbf takes at most "
                           f"{TBF_MAX_RATE / 1e9:.1f} Gbit/s; use --shaper htb")
    return reasons


def model_spec(spec: NetSpec, layout: Layout) -> NetSpec:
    """The spec that prices the emulated network: the layout's topology and, with several ranks per node, a free loopback."""
    spec = replace(spec, topology=None if layout.per_node == 1 else (layout.nodes, layout.per_node))
    if layout.per_node > 1:
        loop = PRESETS["loopback"]
        spec = replace(spec, intra_bandwidth=loop.bandwidth, intra_latency=loop.latency, intra_protocol=loop.protocol)
    return spec


def _limiter(requested: str, caps: Capabilities, reasons: list[str]) -> str | None:
    if requested == "auto":
        found = [k for k in RATE_LIMITERS if caps.has(k)]
        if not found:
            reasons.append(f"a bandwidth limit needs tbf, or htb with the u32 classifier ({caps.describe()})")
            return None
        return found[0]
    if requested not in RATE_LIMITERS:
        reasons.append(f"unknown shaper {requested!r}; valid: auto, {', '.join(RATE_LIMITERS)}")
        return None
    if not caps.has(requested):
        reasons.append(f"shaper {requested} is not in this kernel ({caps.describe()}; htb needs u32 too)")
        return None
    return requested


def _rate_limit(spec: NetSpec, layout: Layout, node: int, kind: str | None, burst: int | None) -> RateLimit | None:
    """The node's rate limiter: the spec's rate times the slowest link factor of its ranks."""
    if kind is None:
        return None
    ranks = range(node * layout.per_node, (node + 1) * layout.per_node)
    factor = min((s.link for s in spec.stragglers if s.rank in ranks), default=1.0)
    rate = spec.bandwidth * factor
    bucket = default_burst(rate) if burst is None else burst
    return RateLimit(kind, rate, bucket, int(rate / 8 * QUEUE_SECONDS) + bucket)

