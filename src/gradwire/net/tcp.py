"""TCP on long links: the window cap, slow start, restart after idle and parallel streams.

The alpha-beta model prices ``n`` bytes on a link as ``a + n * b``: the link
runs at its rate from the first byte on. TCP does not. On a link whose
bandwidth-delay product (BDP = rate x RTT) is large, four Linux behaviours
change the answer, and :func:`tcp_transfer_seconds` prices all of them:

1. Window cap. A connection never has more than one window of unacknowledged
   bytes in flight, so its throughput is at most ``window / RTT``. The window
   is bounded by both socket buffers, and the kernel charges each buffer with
   the memory its packets occupy (``skb->truesize``: payload plus the sk_buff,
   headers and allocation slack), not with their payload (:func:`window_cap`):

   - receiver: autotuning (``tcp_moderate_rcvbuf=1``) grows the receive buffer
     up to ``tcp_rmem[2]`` (32 MiB here) and advertises the buffer times the
     payload share it expects. Trap: the documentation says "half the buffer"
     (``tcp_adv_win_scale=1``), but since Linux 6.6 that sysctl is obsolete and
     ignored: the share is the per-socket ``scaling_ratio``, 50 %
     (``TCP_DEFAULT_SCALING_RATIO``) until packets are measured, then
     skb->len / skb->truesize (about 63 % for 1448-byte packets, more with GRO).
   - sender: the send buffer holds every byte until it is acked, autotuning
     caps it at ``tcp_wmem[2]`` (4 MiB by default), and it too is charged by
     truesize. Second trap: with the defaults this is the bound that binds,
     however large ``tcp_rmem`` is: one 50 ms connection with tcp_wmem[2] =
     4 MiB and a 12.5 MiB receive buffer carried 2.8 MB in flight, not 4 MiB
     (``benchmarks/tcp_model.py`` and its section in ``benchmarks/README.md``).
   - gradwire charges 37 % of the binding buffer for overhead and prices the
     other 63 % as payload (:data:`BUFFER_PAYLOAD_RATIO`; the spec key
     ``tcp_share`` sets another share): the share a connection that has
     carried data reaches (1448-byte segments in their allocations), and
     what measured connections carried: 59-66 % on Linux 6.18 here (a bulk
     socket in ``benchmarks/tcp_model.py --measure``, gloo's sends in
     ``benchmarks/long_links.py --measure``) and 62-67 % in gloo's published
     sends on AWS (``benchmarks/long_links.py``). Trap: the kernel's own
     starting assumption is half (``SO_SNDBUF``/``SO_RCVBUF`` double what they
     are given; the default scaling ratio is 50 %), and a model that keeps it
     prices a window-bound transfer about 25 % slow. The default window is
     then 2.5 MiB (211 Mbit/s at 100 ms); ``tcp_share=0.5`` prices the
     kernel's starting half.
   - third trap: an application that sets ``SO_RCVBUF``/``SO_SNDBUF`` itself
     (``iperf3 -w``) turns autotuning off; the kernel caps the request at
     ``net.core.rmem_max``/``wmem_max`` (4 MiB here) and doubles it, so
     ``SO_SNDBUF=X`` is ``tcp_wmem=2X`` here. gloo and NCCL's socket transport
     do not set them.

2. Slow start. A new connection starts with ``initcwnd`` segments (10 x 1448
   bytes = 14.5 KB) and doubles its window every round trip until the window
   fills the pipe (BDP) or reaches the cap. A transfer of ``n`` bytes that ends
   in slow start takes about ``log2(n / (initcwnd * mss) + 1)`` round trips
   instead of ``n / rate``; on a short link the pipe is full after a few
   RTTs of microseconds and slow start is negligible.

3. Slow start after idle (RFC 5681 4.1, ``tcp_slow_start_after_idle=1``, the
   default and the setting on this machine). A connection that has sent
   nothing for longer than its retransmission timeout (RTO) shrinks its
   window before it sends again. Linux (``tcp_cwnd_restart``) halves the
   window once for every RTO of the idle time after the first and never goes
   below ``initcwnd``: ``cwnd = max(initcwnd, cwnd >> (ceil(idle / RTO) - 1))``
   (:func:`restart_window`). Without losses ssthresh stays unlimited, so the
   window grows back by slow start. An all_reduce after a compute phase longer
   than the RTO pays it every step of training.

   Trap: the RTO is not RFC 6298's ``max(200 ms, srtt + 4 rttvar)``. Linux
   floors the variance term itself: ``tcp_rtt_estimator`` starts ``rttvar`` at
   ``max(2 rtt, rto_min)`` and lets it decay only towards ``mdev_max``, which
   it resets to ``TCP_RTO_MIN`` every round trip; so a steady path has
   ``RTO = srtt + 200 ms`` (:func:`linux_rto`; ``ss -ti`` here shows
   ``rto:204`` for sub-millisecond RTTs, the 4 ms being timer granularity).

   Second trap: the check is skipped for congestion controls that own the
   whole ``cong_control`` hook (``tcp_slow_start_after_idle_check`` returns
   early), and BBR is one; it keeps its window and paces at its bandwidth
   estimate after idle. ``congestion=bbr`` prices no restart. (This machine
   runs BBR; Linux's default is CUBIC.)

4. Parallel streams. A library may stripe one message over several
   connections to a peer: gloo opens one per pair of ranks; NCCL's socket
   transport opens ``NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD`` data sockets
   per channel (autodetected: none in general, the control socket carrying
   the data, 2 x 8 = 16 on AWS ENA, 4 x 1 = 4 on GCP gVNIC; at most 64) and
   cuts a message into at most that many pieces of at least 64 KiB. Window
   cap and slow start apply per stream, so ``k`` streams lift the cap
   ``k``-fold and share the link rate. Which connections a library opens and
   how it feeds them (gloo's notice-gated ring segments, NCCL's channels and
   pipelined steps) is :mod:`gradwire.net.transport`.

The model, per stream of ``m`` bytes with rate share ``R``, window ``w`` and the
stream's steady window ``W = min(cap, R x RTT)``: while ``w`` is below the BDP
every round trip sends ``w`` bytes and doubles it (up to ``W``); once it fills the
pipe the rest streams at ``R``; a capped window sends ``W`` per round trip. The
last byte arrives one one-way latency after it is sent, so a transfer whose
first window already fills the pipe costs exactly ``a + m / R`` (the
alpha-beta price). Not modelled: delayed ACKs (they slow the doubling to about
1.5x per RTT), HyStart's early exit, BBR's pacing (it sends each burst at its
bandwidth estimate, about the window-limited rate for a connection that sends
and waits, where the model lets a window leave at the link's rate; gloo's
all_reduce over 50 ms took about one round trip more per phase for it), CUBIC's growth after a loss (loss is the
Mathis bound of :mod:`gradwire.net.link`) and receive-buffer autotuning lagging
behind slow start (it grows the buffer to twice what arrived in the last RTT,
so it keeps up).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from gradwire.net.transport import (
    MAX_CHANNELS, NCCL_CHANNELS, TRANSPORT_CHOICES, Transport, credit_window, pipeline_stall, resolve,
)
from gradwire.net.units import format_time, human_size, parse_fraction, parse_size, parse_time

#: Linux defaults (``tcp_rmem[2]``, ``tcp_wmem[2]``, ``TCP_INIT_CWND``, ``TCP_RTO_MIN``)
DEFAULT_RMEM = 32 << 20
DEFAULT_WMEM = 4 << 20
DEFAULT_INIT_CWND = 10
DEFAULT_RTO_MIN = 0.2
#: payload share of the binding socket buffer on a connection that has carried data (module doc, 1); the kernel
#: starts from half (TCP_DEFAULT_SCALING_RATIO, SO_SNDBUF x 2) and measures its way up
BUFFER_PAYLOAD_RATIO = 0.63
#: largest window TCP can advertise: 65535 << 14 (window scale 14, RFC 7323)
MAX_WINDOW = 65535 << 14
#: smallest piece a library stripes over several sockets (NCCL's MIN_CHUNKSIZE)
STRIPE_MIN_CHUNK = 64 << 10
#: most parallel streams to one peer (NCCL's MAX_SOCKETS)
MAX_STREAMS = 64
#: congestion controls the model tells apart: bbr owns cong_control and skips the idle restart
CONGESTION_CONTROLS: tuple[str, ...] = ("cubic", "reno", "bbr")
#: bounds of the settings: a page to 2 GiB of buffer, 1 to 1024 initial segments, 1 ms to TCP_RTO_MAX
MIN_BUFFER, MAX_BUFFER = 4096, 2 << 30
MAX_INIT_CWND = 1024
MIN_RTO, MAX_RTO = 1e-3, 120.0


def window_cap(rmem: float, wmem: float, share: float = BUFFER_PAYLOAD_RATIO) -> float:
    """Bytes one connection may have in flight: ``min(rmem, wmem) x share`` (63 %), at most 1 GiB (module doc, 1)."""
    return min(min(rmem, wmem) * share, MAX_WINDOW)


#: the window with Linux's default buffers: 2.5 MiB, 63 % of the 4 MiB send buffer
DEFAULT_WINDOW = window_cap(DEFAULT_RMEM, DEFAULT_WMEM)


def linux_rto(rtt: float, rto_min: float = DEFAULT_RTO_MIN) -> float:
    """Retransmission timeout of a connection on a steady path: ``srtt + rto_min`` (module doc, 3)."""
    return rtt + rto_min


def restart_window(cwnd: float, init_window: float, idle: float, rto: float) -> float:
    """The window Linux restarts with after ``idle`` seconds without sending (``tcp_cwnd_restart``).

    Nothing changes unless ``idle > rto``; then the window is halved once per
    RTO of idle time after the first (``ceil(idle / rto) - 1`` halvings) and
    never falls below ``min(init_window, cwnd)``.
    """
    if not idle > rto:
        return cwnd
    halvings = math.ceil(idle / rto) - 1
    floor = min(init_window, cwnd)
    return max(math.ldexp(cwnd, -min(halvings, 4096)), floor)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _bool(text: str, key: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{key} must be on or off (1/0), got {text!r}")


def _integer(text: str, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key} must be a whole number, got {text!r}") from None


def _bytes(text: str, key: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise ValueError(f"{key}: {err} (e.g. {key}=32MiB)") from None


def _fraction(text: str, key: str) -> float:
    try:
        return parse_fraction(text, key)  # 0.6 or 60%
    except ValueError:
        raise ValueError(f"{key} must be a number such as 0.5, got {text!r}") from None


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def format_bytes(nbytes: int) -> str:
    """``33554432`` -> ``32MiB``; exact, so the spec grammar reads it back unchanged."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


@dataclass(frozen=True)
class TcpConfig:
    """The TCP settings of a spec: the keys ``tcp``, ``tcp_rmem``, ``tcp_wmem``, ``tcp_share``, ``initcwnd``,
    ``streams``, ``rto_min``, ``slow_start_after_idle``, ``congestion``, ``transport`` and ``nccl_channels``.

    They apply to links with ``protocol=tcp`` only; the defaults are Linux's,
    gloo's and NCCL's (:mod:`gradwire.net.transport`).
    """

    enabled: bool = True
    """``tcp=on``: price window cap, slow start and idle restart; ``off``: the plain alpha-beta model"""
    rmem: int = DEFAULT_RMEM
    """``tcp_rmem``: largest receive buffer autotuning may grow (tcp_rmem[2]), bytes"""
    wmem: int = DEFAULT_WMEM
    """``tcp_wmem``: largest send buffer (tcp_wmem[2]), bytes; it bounds the bytes in flight"""
    init_cwnd: int = DEFAULT_INIT_CWND
    """``initcwnd``: initial congestion window in segments (``ip route ... initcwnd``)"""
    streams: int = 1
    """``streams``: TCP connections per peer connection: gloo opens 1 per pair (more: parallel gloo groups); NCCL
    ``NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD`` per channel (1 on a generic NIC, 16 on AWS, 4 on GCP)"""
    rto_min: float = DEFAULT_RTO_MIN
    """``rto_min``: floor of the retransmission timeout's variance term (TCP_RTO_MIN), seconds"""
    slow_start_after_idle: bool = True
    """``slow_start_after_idle``: shrink the window after an idle longer than the RTO (the sysctl)"""
    congestion: str = "cubic"
    """``congestion``: cubic or reno (restart after idle) or bbr (no restart: it owns cong_control)"""
    transport: str = "auto"
    """``transport``: the library priced: gloo, nccl, or auto (the inner backend of the op; gloo without one)"""
    channels: int = NCCL_CHANNELS
    """``nccl_channels``: NCCL's channels per peer, each with its own ``streams`` sockets (transport nccl only)"""
    share: float = BUFFER_PAYLOAD_RATIO
    """``tcp_share``: payload share of the binding socket buffer (module doc, 1): 0.63, what connections that have
    carried data hold (0.59-0.67 measured here and on AWS); 0.5 is the kernel's starting budget"""

    def __post_init__(self) -> None:
        for name in ("enabled", "slow_start_after_idle"):
            _check(isinstance(getattr(self, name), bool), f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, key in (("rmem", "tcp_rmem"), ("wmem", "tcp_wmem")):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and MIN_BUFFER <= value <= MAX_BUFFER,
                   f"{key} must be a buffer size from 4KiB to 2GiB (Linux's default is "
                   f"{format_bytes(getattr(TcpConfig, name))}), got {value!r}")
        _check(isinstance(self.init_cwnd, int) and not isinstance(self.init_cwnd, bool)
               and 1 <= self.init_cwnd <= MAX_INIT_CWND,
               f"initcwnd must be a whole number of segments from 1 to {MAX_INIT_CWND} (Linux: "
               f"{DEFAULT_INIT_CWND}), got {self.init_cwnd!r}")
        _check(isinstance(self.streams, int) and not isinstance(self.streams, bool)
               and 1 <= self.streams <= MAX_STREAMS,
               f"streams must be a whole number of connections from 1 to {MAX_STREAMS} (gloo: 1; NCCL sockets: "
               f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD), got {self.streams!r}")
        rto_min = float(self.rto_min)
        _check(MIN_RTO <= rto_min <= MAX_RTO,
               f"rto_min must be a time from 1ms to 120s (Linux: 200ms), got {self.rto_min!r}")
        object.__setattr__(self, "rto_min", rto_min)  # normalising a field of a frozen dataclass
        _check(self.congestion in CONGESTION_CONTROLS,
               f"unknown congestion control {self.congestion!r}; valid: {', '.join(CONGESTION_CONTROLS)}")
        _check(self.transport in TRANSPORT_CHOICES,
               f"unknown transport {self.transport!r}; valid: {', '.join(TRANSPORT_CHOICES)} (auto: the inner "
               "backend's, gloo for CPU tensors)")
        _check(isinstance(self.share, (int, float)) and not isinstance(self.share, bool) and 0 < self.share <= 1,
               f"tcp_share must be a fraction of the socket buffer above 0 and at most 1 (default "
               f"{BUFFER_PAYLOAD_RATIO:g}, what connections carried here and on AWS; Linux starts from 0.5), "
               f"got {self.share!r}")
        object.__setattr__(self, "share", float(self.share))  # normalising a field of a frozen dataclass
        _check(isinstance(self.channels, int) and not isinstance(self.channels, bool)
               and 1 <= self.channels <= MAX_CHANNELS,
               f"nccl_channels must be a whole number of channels from 1 to {MAX_CHANNELS} (NCCL with one GPU and "
               f"one NIC per node: {NCCL_CHANNELS}), got {self.channels!r}")

    @property
    def window(self) -> float:
        """Bytes in flight per stream: :func:`window_cap` of the two buffers."""
        return window_cap(self.rmem, self.wmem, self.share)

    def connections(self, transport: Transport) -> int:
        """TCP connections to one peer under ``transport``: ``nccl_channels x streams`` for NCCL, else ``streams``."""
        return self.streams * (self.channels if transport.channels else 1)

    @property
    def restarts_after_idle(self) -> bool:
        """Whether an idle longer than the RTO shrinks the window (sysctl on, and not BBR)."""
        return self.slow_start_after_idle and self.congestion != "bbr"

    def with_key(self, key: str, text: str) -> "TcpConfig":
        """This config with one spec key (a key of :data:`TCP_KEYS`) read from ``text``."""
        name, parse, _ = _KEYS[key]
        return replace(self, **{name: parse(text.strip(), key)})

    def tokens(self) -> list[str]:
        """The spec tokens that set this config, the defaults left out."""
        default = TcpConfig()
        return [f"{key}={show(getattr(self, name))}" for key, (name, _, show) in _KEYS.items()
                if getattr(self, name) != getattr(default, name)]

    def __str__(self) -> str:
        if not self.enabled:
            return "off (tcp links priced by the plain alpha-beta model)"
        restart = (f"slow start after idle > RTO (rtt + {format_time(self.rto_min)})" if self.restarts_after_idle
                   else "no restart after idle" + (" (bbr)" if self.slow_start_after_idle else ""))
        kind = resolve(self.transport)
        links = (f"{self.channels} channels x {self.streams} socket{'s' if self.streams > 1 else ''}"
                 if kind.channels else f"{self.streams} stream{'s' if self.streams > 1 else ''}")
        return (f"window {human_size(self.window)}/stream = {self.share:g} x min(tcp_rmem "
                f"{human_size(self.rmem)}, tcp_wmem {human_size(self.wmem)}), initcwnd {self.init_cwnd}, "
                f"{links}, {restart}, {self.congestion}, transport {self.transport}")


#: spec key -> (TcpConfig field, parser(text, key), formatter)
_KEYS: dict[str, tuple[str, Callable[[str, str], Any], Callable[[Any], str]]] = {
    "tcp": ("enabled", _bool, _on_off),
    "tcp_rmem": ("rmem", _bytes, format_bytes),
    "tcp_wmem": ("wmem", _bytes, format_bytes),
    "initcwnd": ("init_cwnd", _integer, str),
    "streams": ("streams", _integer, str),
    "rto_min": ("rto_min", lambda text, key: parse_time(text), format_time),
    "slow_start_after_idle": ("slow_start_after_idle", _bool, _on_off),
    "congestion": ("congestion", lambda text, key: text.lower(), str),
    "transport": ("transport", lambda text, key: text.lower(), str),
    "nccl_channels": ("channels", _integer, str),
    "tcp_share": ("share", _fraction, lambda value: f"{value:g}"),
}
#: the spec keys of :class:`TcpConfig`
TCP_KEYS: tuple[str, ...] = tuple(_KEYS)
assert {name for name, _, _ in _KEYS.values()} == {f.name for f in fields(TcpConfig)}


# --------------------------------------------------------------------- the transfer model
def _stream(nbytes: float, rate: float, rtt: float, latency: float, window: float,
            steady: float) -> tuple[float, float]:
    """Seconds for one stream to deliver ``nbytes`` starting with ``window``, and its window after.

    ``steady`` = min(window cap, rate x RTT) is the window the stream grows to.
    """
    if nbytes <= 0:
        return 0.0, window
    bdp = rate * rtt
    w, left, t = min(window, steady), float(nbytes), 0.0
    while True:
        if w >= bdp or left <= w:  # the pipe is full, or this round trip carries the rest
            return t + left / rate + latency, min(w + left, steady)
        left -= w
        t += rtt
        w = min(2 * w, steady)
        if w >= steady and steady < bdp:  # capped below the pipe: one window per round trip from here on
            full = math.ceil(left / steady) - 1
            t += full * rtt
            return t + (left - full * steady) / rate + latency, steady


def _striped(nbytes: float, streams: int) -> int:
    """Streams a message of ``nbytes`` really uses: pieces of at least :data:`STRIPE_MIN_CHUNK`."""
    if streams == 1 or nbytes <= 0:
        return 1
    return max(1, min(streams, math.ceil(nbytes / STRIPE_MIN_CHUNK)))


def _start(steady: float, init_window: float, idle: float | None, rto: float, restarts: bool) -> float:
    """The window a transfer starts with: ``idle=None`` is the connection's first transfer."""
    if idle is None:
        return min(init_window, steady)
    return restart_window(steady, init_window, idle, rto) if restarts else steady


def _check_transfer(nbytes: float, link_rate: float, rtt: float, mss: int, streams: int) -> None:
    _check(nbytes >= 0 and not math.isnan(nbytes), f"nbytes must be >= 0, got {nbytes!r}")
    _check(link_rate > 0, f"link_rate must be > 0 payload bytes/s (inf = unlimited), got {link_rate!r}")
    _check(0 < rtt < math.inf, f"rtt must be a finite time > 0 s, got {rtt!r}")
    _check(isinstance(mss, int) and mss > 0, f"mss must be a whole number of bytes > 0, got {mss!r}")
    _check(isinstance(streams, int) and 1 <= streams <= MAX_STREAMS,
           f"streams must be a whole number from 1 to {MAX_STREAMS}, got {streams!r}")


def tcp_transfer_seconds(
    nbytes: float,
    link_rate: float,
    rtt: float,
    *,
    mss: int = 1448,
    init_cwnd: int = DEFAULT_INIT_CWND,
    window_cap: float = DEFAULT_WINDOW,
    streams: int = 1,
    idle: float | None = None,
    rto_min: float = DEFAULT_RTO_MIN,
    slow_start_after_idle: bool = True,
    latency: float | None = None,
) -> float:
    """Seconds until the last of ``nbytes`` arrives over TCP (module doc: the model).

    Args:
        nbytes: payload bytes of the message.
        link_rate: payload bytes/s the link carries (framed, loss-limited: ``Link.payload_rate``).
        rtt: round-trip time in seconds.
        mss: payload bytes per segment.
        init_cwnd: initial window in segments.
        window_cap: bytes in flight per stream (:func:`window_cap`).
        streams: connections the message is striped over (pieces of at least 64 KiB).
        idle: seconds since the connection last sent; ``None``: its first transfer
            (slow start from ``init_cwnd``). Otherwise the connection was warm at its
            steady window, which the restart rule shrinks if ``idle > RTO``.
        rto_min: Linux's RTO floor; the RTO is ``rtt + rto_min`` (:func:`linux_rto`).
        slow_start_after_idle: the sysctl (pass False for BBR, which skips it).
        latency: one-way latency added to the last byte; default ``rtt / 2``.

    Returns:
        Seconds; with a first window that already fills the pipe this is the
        alpha-beta ``latency + nbytes / link_rate``.
    """
    _check_transfer(nbytes, link_rate, rtt, mss, streams)
    seconds, _ = transfer(nbytes, link_rate, rtt, rtt / 2 if latency is None else latency, mss=mss,
                          init_cwnd=init_cwnd, window_cap=window_cap, streams=streams, idle=idle,
                          rto=linux_rto(rtt, rto_min), restarts=slow_start_after_idle)
    return seconds


def transfer(nbytes: float, link_rate: float, rtt: float, latency: float, *, mss: int, init_cwnd: int,
             window_cap: float, streams: int, idle: float | None, rto: float, restarts: bool,
             window: float | None = None) -> tuple[float, float]:
    """:func:`tcp_transfer_seconds` without the checks, also returning each stream's window after.

    ``window``: each stream's window at the start (from an earlier step on the
    same connection); None: derived from ``idle``.
    """
    k = _striped(nbytes, streams)
    share = link_rate / k
    steady = min(window_cap, share * rtt)
    start = _start(steady, init_cwnd * mss, idle, rto, restarts) if window is None else window
    return _stream(nbytes / k, share, rtt, latency, start, steady)


def steps_seconds(chunk: float, steps: int, link_rate: float, rtt: float, latency: float, *, mss: int,
                  config: TcpConfig, idle: float | None, same_peer: bool, transport: Transport | None = None) -> float:
    """Seconds for ``steps`` sequential transfers of ``chunk`` bytes (one collective's steps) under ``transport``.

    ``transport`` (default: the config's, ``auto`` as gloo) says how the
    library feeds its connections (:mod:`gradwire.net.transport`):

    - pipelined (NCCL): the steps stream back to back, so the collective is
      one transfer of all ``steps x chunk`` bytes through ``nccl_channels x
      streams`` connections plus the ring's waits at its ``steps - 1`` step
      boundaries (:func:`~gradwire.net.transport.pipeline_stall`: a whole
      latency each for a small collective, the pipeline's fill; none for a
      large one whose chunks outlast a latency).
    - gloo: ``same_peer`` steps go to one neighbour over one connection (a ring),
      so the window one step grew carries into the next, and the ring's
      notice-gated segments cap each connection at :func:`credit_window`;
      other steps open onto another peer's connection each (a tree, recursive
      doubling, pairwise exchange, a send) and start from the state ``idle``
      gives it.
    """
    if steps <= 0:
        return 0.0
    if chunk <= 0:
        return steps * latency
    kind = resolve(config.transport) if transport is None else transport
    streams = config.connections(kind)
    rto = linux_rto(rtt, config.rto_min)
    cap = config.window
    if kind.segment and same_peer:
        share = link_rate / _striped(chunk, streams)
        cap = min(cap, credit_window(min(kind.segment, chunk), share, rtt))

    def one(nbytes: float, window: float | None) -> tuple[float, float]:
        return transfer(nbytes, link_rate, rtt, latency, mss=mss, init_cwnd=config.init_cwnd, window_cap=cap,
                        streams=streams, idle=idle, rto=rto, restarts=config.restarts_after_idle, window=window)

    if kind.pipelined:  # one transfer of every step's bytes, and the ring's waits at its step boundaries
        seconds = one(chunk * steps, None)[0]
        channels = config.channels if kind.channels else 1
        rate = chunk * steps / channels / max(seconds - latency, 1e-12)  # what a channel carried
        return (steps - 1) * pipeline_stall(chunk, rate, latency, channels) + seconds
    if not same_peer:
        return steps * one(chunk, None)[0]
    total, window = 0.0, None
    for done in range(steps):
        seconds, after = one(chunk, window)
        total += seconds
        if window is not None and after == window:  # steady: every step left is the same
            return total + (steps - done - 1) * seconds
        window = after
    return total


__all__ = [
    "BUFFER_PAYLOAD_RATIO", "CONGESTION_CONTROLS", "DEFAULT_INIT_CWND", "DEFAULT_RMEM", "DEFAULT_RTO_MIN",
    "DEFAULT_WINDOW", "DEFAULT_WMEM", "MAX_STREAMS", "STRIPE_MIN_CHUNK", "TCP_KEYS", "TcpConfig", "format_bytes",
    "linux_rto", "restart_window", "steps_seconds", "tcp_transfer_seconds", "transfer", "window_cap",
]
