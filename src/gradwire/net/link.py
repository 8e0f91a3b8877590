"""One network link: how many payload bytes per second it really carries.

A link is given by its line rate (bits/s on the wire), its one-way latency, the
protocol that frames the payload, a random packet-loss rate and, for TCP, the
settings of its connections. Three effects stand between the line rate and the
time a collective sees:

1. Framing. Every packet carries headers. With TCP over Ethernet at MTU 1500, a
   segment holds 1448 payload bytes (1500 - 20 IP - 20 TCP - 12 timestamp
   option) and occupies 1514 bytes on the wire (+14 Ethernet header), so the
   payload rate is ``rate * 1448 / 1514`` (about 4.4 % less): the excess that
   shaped veth links show (``benchmarks/emulate_bench.py``). Preamble, FCS and the
   inter-frame gap are not counted: a tbf/htb shaper does not count them either.
   Jumbo frames (``mtu=9001`` on AWS, 8896 on GCP, 9000 in many clusters) carry
   ``mtu - 52`` payload bytes per ``mtu + 14`` on the wire (0.7 % less at 9001):
   :func:`tcp_framing`.
2. Loss. TCP halves its window on every loss; Mathis et al. (1997,
   https://doi.org/10.1145/263932.264023) give the steady-state throughput
   ``MSS / RTT * sqrt(3/2) / sqrt(q)``, which is capped by the framed link rate.
   RDMA (go-back-N in the NIC) and unframed links simply resend lost packets,
   so their payload rate is the framed rate times ``(1 - q)``.
3. TCP's windows (``Link.tcp``, :mod:`gradwire.net.tcp`): on a link whose
   bandwidth-delay product is large, a connection is held to one window per
   round trip, starts (and restarts after an idle longer than its RTO) in
   slow start, and may be striped over several streams. :meth:`Link.steps_seconds`
   prices a collective's steps with it; without ``tcp`` (and for rdma or
   unframed links) a step costs the alpha-beta ``latency + bytes * beta``.
   BBR does not back off on random loss the way Mathis assumes: its patch
   series (https://patchwork.ozlabs.org/patch/671069/) states that below 15 %
   loss it fills the path at ``rate * (1 - loss)`` and measured 9150 Mbit/s
   where CUBIC got 3.27 at 100 ms RTT and 1 % loss; so ``congestion=bbr``
   resends like RDMA instead (``benchmarks/tcp_model.py``).

Trap: with zero latency the Mathis formula divides by an RTT of zero and
predicts infinite throughput under loss. A real RTT is never below the cost of
the stack and the switch, so the RTT used is ``max(2 * latency, MIN_RTT)``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from gradwire.net.tcp import TcpConfig, steps_seconds

#: smallest round-trip time used in the Mathis formula (host stack + one switch)
MIN_RTT = 20e-6


@dataclass(frozen=True)
class Framing:
    """How a protocol packs payload into packets.

    ``mss == 0`` means no framing: every payload byte is one wire byte.
    """

    name: str
    #: payload bytes per packet
    mss: int
    #: bytes on the wire per full packet (payload + headers)
    frame_bytes: int
    description: str

    @property
    def efficiency(self) -> float:
        """Payload bytes per wire byte for large transfers."""
        return 1.0 if self.mss == 0 else self.mss / self.frame_bytes


#: IPv4 + TCP + timestamp option headers, and the Ethernet header, around a TCP segment
TCP_HEADERS, ETHERNET_HEADER = 52, 14
#: the MTUs a link may have: IPv4's smallest to the largest IP packet
MIN_MTU, MAX_MTU = 576, 65535


@functools.lru_cache(maxsize=None)
def tcp_framing(mtu: int) -> Framing:
    """TCP/IPv4 over Ethernet at ``mtu``: ``mtu - 52`` payload bytes per ``mtu + 14``-byte frame (one per MTU:
    :attr:`Link.framing` asks on every op it prices)."""
    if not (isinstance(mtu, int) and MIN_MTU <= mtu <= MAX_MTU):
        raise ValueError(f"mtu must be a whole number of bytes from {MIN_MTU} to {MAX_MTU} (1500 Ethernet, 9001 AWS, "
                         f"8896 GCP jumbo frames), got {mtu!r}")
    return Framing("tcp", mtu - TCP_HEADERS, mtu + ETHERNET_HEADER,
                   f"TCP/IPv4 over Ethernet, MTU {mtu}, timestamps on: {mtu - TCP_HEADERS} payload bytes per "
                   f"{mtu + ETHERNET_HEADER}-byte frame")


#: framing by protocol name
FRAMINGS: dict[str, Framing] = {
    "tcp": Framing(
        "tcp", 1448, 1514,
        "TCP/IPv4 over Ethernet, MTU 1500, timestamps on: 1448 payload bytes per 1514-byte frame",
    ),
    "rdma": Framing(
        "rdma", 4096, 4096 + 58,
        "InfiniBand/RoCE, 4096-byte MTU: about 58 bytes of routing, transport and CRC headers per packet",
    ),
    "none": Framing("none", 0, 0, "no framing: every payload byte is one wire byte (e.g. NVLink-style)"),
}


@dataclass(frozen=True)
class Link:
    """A point-to-point link; every rank has one such link into the fabric."""

    #: line rate in bits per second (``math.inf`` = unlimited)
    bandwidth: float
    #: one-way latency in seconds (the alpha of the alpha-beta model)
    latency: float
    #: framing protocol, a key of :data:`FRAMINGS`
    protocol: str = "tcp"
    #: random packet-loss probability, 0 <= loss < 1
    loss: float = 0.0
    #: TCP's window cap, slow start and streams (protocol tcp only); None: the plain alpha-beta model
    tcp: TcpConfig | None = None
    #: IP packet size of a tcp link (jumbo frames: 9000); None: 1500, :data:`FRAMINGS`'s tcp
    mtu: int | None = None

    def __post_init__(self) -> None:
        if self.protocol not in FRAMINGS:
            raise ValueError(f"unknown protocol {self.protocol!r}; valid: {', '.join(FRAMINGS)}")
        if not self.bandwidth > 0:
            raise ValueError(f"link bandwidth must be > 0 bits/s, got {self.bandwidth!r}")
        if not 0 <= self.latency < math.inf:
            raise ValueError(f"link latency must be a finite number >= 0 s, got {self.latency!r}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"link loss must be in [0, 1), got {self.loss!r}")
        if self.tcp is not None and self.protocol != "tcp":
            raise ValueError(f"TCP settings apply to protocol='tcp' links, not {self.protocol!r}; pass tcp=None")
        if self.tcp is not None and not self.tcp.enabled:
            object.__setattr__(self, "tcp", None)  # tcp=off is the plain model; one spelling of it
        if self.mtu is not None:
            if self.protocol != "tcp":
                raise ValueError(f"mtu sets the framing of protocol=tcp links; protocol={self.protocol} frames its "
                                 "own packets (rdma 4096 payload bytes, none unframed): leave mtu out")
            tcp_framing(self.mtu)  # checks it

    @property
    def framing(self) -> Framing:
        return tcp_framing(self.mtu) if self.mtu is not None else FRAMINGS[self.protocol]

    def scaled(self, factor: float) -> "Link":
        """This link with its bandwidth multiplied by ``factor`` (a straggler's slow NIC)."""
        return replace(self, bandwidth=self.bandwidth * factor)

    @property
    def framed_rate(self) -> float:
        """Payload bytes per second before loss: line rate minus header overhead."""
        return self.bandwidth / 8 * self.framing.efficiency

    @property
    def rtt(self) -> float:
        """Round-trip time used by the loss model: ``max(2 * latency, MIN_RTT)``."""
        return max(2 * self.latency, MIN_RTT)

    @property
    def mathis_rate(self) -> float:
        """TCP throughput bound under loss in payload bytes/s (``inf`` without loss)."""
        if self.loss == 0:
            return math.inf
        return self.framing.mss / self.rtt * math.sqrt(1.5) / math.sqrt(self.loss)

    @property
    def payload_rate(self) -> float:
        """Payload bytes per second a long transfer achieves on this link."""
        if self.protocol == "tcp" and not (self.tcp is not None and self.tcp.congestion == "bbr"):
            return min(self.framed_rate, self.mathis_rate)
        return self.framed_rate * (1 - self.loss)

    @property
    def beta(self) -> float:
        """Seconds per payload byte (the beta of the alpha-beta model); 0 if unlimited."""
        rate = self.payload_rate
        return 0.0 if math.isinf(rate) else 1.0 / rate

    def steps_seconds(self, steps: int, volume: float, *, same_peer: bool = True, idle: float | None = None) -> float:
        """Seconds for ``steps`` sequential steps that together send ``volume`` payload bytes.

        Every step sends ``volume / steps`` bytes over one connection. Without
        :attr:`tcp` that is the alpha-beta ``steps * latency + volume * beta``;
        with it, :func:`gradwire.net.tcp.steps_seconds` (``same_peer``: the steps
        reuse one connection, as a ring does; ``idle``: seconds since that
        connection last sent, None for its first transfer).
        """
        if self.tcp is None or steps <= 0 or volume <= 0:
            return steps * self.latency + volume * self.beta
        return steps_seconds(volume / steps, steps, self.payload_rate, self.rtt, self.latency,
                             mss=self.framing.mss, config=self.tcp, idle=idle, same_peer=same_peer)

    def wire_bytes(self, payload: float) -> int:
        """Bytes a NIC counter would show for ``payload`` bytes sent.

        ``payload + ceil(payload / mss) * header`` (the last packet is short, so
        it carries a header but not a full MSS), divided by ``1 - loss`` for the
        expected retransmissions.
        """
        if payload <= 0:
            return 0
        framing = self.framing
        headers = 0 if framing.mss == 0 else math.ceil(payload / framing.mss) * (framing.frame_bytes - framing.mss)
        return math.ceil((payload + headers) / (1 - self.loss))
