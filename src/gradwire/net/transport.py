"""What each collective library opens on a long TCP link, and how it feeds it: gloo and NCCL's sockets.

:mod:`gradwire.net.tcp` prices one TCP connection (window cap, slow start,
restart after idle). Two libraries put a collective's bytes on such
connections in two different ways, and on a long link the difference is a
factor of two or more. The spec key ``transport`` says which one a spec prices
(``gloo``, ``nccl``, or ``auto``: the inner backend that carries the op, gloo
for CPU tensors, nccl for CUDA tensors on a group that runs NCCL; a pure model
with no backend behind it prices ``auto`` as gloo).

gloo (``gloo/transport/tcp/pair.cc``, ``gloo/allreduce.cc``, pytorch/gloo):

1. One TCP connection per pair of ranks, both directions on it; buffer sizes
   left to the kernel's autotuning (``Pair::send(Op&)`` sets ``SO_SNDBUF`` for
   the old bound buffers only; the unbound buffers PyTorch's
   ``ProcessGroupGloo`` sends go through ``sendUnboundBuffer`` and set nothing).
2. Rendezvous: a send of an unbound buffer leaves only when the receiver's
   ``NOTIFY_RECV_READY`` has arrived (``handleRemotePendingRecv``). A
   ``send``/``recv`` posted on both sides at once pays one more one-way latency
   before its first byte. Not priced: it is one latency per op, within the
   textbook alpha on a LAN and small beside the window on a long link.
3. A ring all_reduce cuts every step into segments of at most 1 MiB
   (``kMaxSegmentSize``) and keeps two of them in flight (a double-buffered
   receive): segment ``i`` is received only into the slot segment ``i - 2``
   freed, so each slot turns over once per notice-and-data round trip, ``RTT +
   segment / rate``. A connection then carries at most two segments per such
   cycle, whatever TCP's window: the credit window of
   :func:`credit_window`, ``2 MiB x RTT / (RTT + 1 MiB / rate)``. At 10 Gbit/s and
   5 ms RTT that is 357 MB/s of a 1.2 GB/s link; at 1 Gbit/s and 50 ms, 38
   MB/s of 124 (``benchmarks/long_links.py``). all_gather works the same way
   with halves of a step; gradwire prices every gloo ring with the all_reduce's
   rule.

NCCL's socket transport (``src/transport/net_socket.cc``, ``src/init.cc``,
``src/graph/connect.cc``, NVIDIA/nccl):

1. Channels: the ring is duplicated (``connectRings`` ... ``nChannels * 2``), so
   one GPU per node with one NIC runs 2 channels, each with its own network
   connection to the ring's next rank, each carrying half the data.
2. Sockets per channel: ``NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD``,
   autodetected from the NIC's PCI vendor: 2 x 8 = 16 on AWS ENA (0x1d0f), 4 x
   1 = 4 on GCP gVNIC (0x1ae0), otherwise 0 helper sockets, and the data goes
   over the one control socket. A request is cut into at most that many tasks
   of at least 64 KiB (``NCCL_SOCKET_MIN_TASKSIZE``). The spec's ``streams`` is
   this number (1 on a generic NIC) and ``nccl_channels`` the channels; a
   peer's connections are their product, each with its own TCP window.
   ``NCCL_SOCKET_SNDBUF``/``RCVBUF`` are unset by default: autotuned buffers.
3. Pipelining: a collective moves through a channel in steps of
   ``NCCL_BUFFSIZE / NCCL_STEPS`` = 4 MiB / 8 = 512 KiB, and a socket send
   completes when its bytes are in the kernel's send buffer, with no notice
   from the receiver (unlike gloo, and unlike NCCL's InfiniBand transport,
   whose sends wait for a clear-to-send). So a ring's ``2(p - 1)`` steps stream
   back to back through the peer's connections, at ``min(rate, connections x
   window / RTT)``. The 4 MiB buffer bounds what a channel holds unconsumed at
   the receiver, not the bytes on the wire.
4. Where the ring waits (``src/device/all_reduce.h``, ``collectives.h``): a
   channel walks its share of the buffer in loops of ``p`` chunks of at most
   ``ALLREDUCE_CHUNKSTEPS`` = 4 steps (2 MiB), each step of a loop sending one
   chunk in slices of ``ALLREDUCE_SLICESTEPS`` = 2 steps (1 MiB); all_gather
   and reduce_scatter alike. A step's first slice can leave only once the
   left neighbour's slice of the step before has arrived (one latency after
   it left), while the rank is still sending the rest of its current chunk:
   the step boundary waits ``max(0, latency - (chunk - slice) / rate)`` per
   loop (:func:`pipeline_stall`). A small collective (a chunk within one slice)
   waits a whole latency at each of its ``steps - 1`` boundaries, the
   pipeline's fill; a large one on a link where a chunk outlasts a latency
   (2 MiB a channel at 1 Gbit/s is 34 ms) never waits, and costs one latency
   plus its bytes whatever the ring's length: the published NCCL all_reduce
   of 128 and 256 MiB over 1-10 ms links took 0.7-2.9 % more than its bytes
   at the link's rate (4.4 to 6.0 latencies) on 4, 8 and 16 nodes alike
   (``benchmarks/long_links.py``), where ``steps - 1`` latencies would add up
   to 12 % on 16 nodes. On a link
   whose latency outlasts a chunk the waits repeat every loop, which is why
   NCCL over a WAN wants a larger ``NCCL_BUFFSIZE``.

So on a link whose bandwidth-delay product passes one window, NCCL with two
channels (or sixteen sockets on AWS) keeps the alpha-beta price where gloo's
all_reduce is held to two segments per round trip.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: gloo's largest all_reduce segment (``kMaxSegmentSize`` in gloo/allreduce.h)
GLOO_SEGMENT = 1 << 20
#: segments gloo's ring keeps in flight per connection (its double-buffered receive)
GLOO_SEGMENTS_IN_FLIGHT = 2
#: NCCL's channels for one GPU per node and one NIC: the searched ring, duplicated
NCCL_CHANNELS = 2
#: NCCL's step (NCCL_BUFFSIZE / NCCL_STEPS, 4 MiB / 8) and a ring's chunk and slice (ALLREDUCE_CHUNKSTEPS,
#: ALLREDUCE_SLICESTEPS: 4 and 2 steps; all_gather and reduce_scatter alike)
NCCL_STEP = 512 << 10
NCCL_CHUNK, NCCL_SLICE = 4 * NCCL_STEP, 2 * NCCL_STEP
#: most channels NCCL runs (MAXCHANNELS)
MAX_CHANNELS = 64
#: the values the spec key ``transport`` takes
TRANSPORT_CHOICES: tuple[str, ...] = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Transport:
    """How one library moves a collective's steps over TCP (module doc)."""

    name: str
    description: str
    channels: bool
    """a peer's connections are ``nccl_channels x streams`` (else ``streams``)"""
    pipelined: bool
    """a collective's steps stream back to back through the connections (NCCL's slices)"""
    segment: int
    """ring steps move in segments of this many bytes, :data:`GLOO_SEGMENTS_IN_FLIGHT` at a time; 0: no credit"""


#: transports by name (``auto`` resolves to one of these)
TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport("gloo", "one connection per pair; a send waits for the receiver's notice; a ring moves 1 MiB "
                  "segments, two in flight", channels=False, pipelined=False, segment=GLOO_SEGMENT),
        Transport("nccl", "NCCL's socket transport: nccl_channels x streams connections per peer, steps pipelined "
                  "in 512 KiB slices, sends complete into the kernel's buffer", channels=True, pipelined=True,
                  segment=0),
    )
}


def resolve(name: str, inner: str | None = None) -> Transport:
    """The transport ``name`` prices; ``auto`` takes the inner backend's (``inner``), gloo without one."""
    if name == "auto":
        name = inner if inner in TRANSPORTS else "gloo"
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; valid: {', '.join(TRANSPORT_CHOICES)}")
    return TRANSPORTS[name]


def credit_window(segment: float, rate: float, rtt: float, in_flight: int = GLOO_SEGMENTS_IN_FLIGHT) -> float:
    """The window ``in_flight`` notice-gated segments amount to: ``in_flight x segment x RTT / (RTT + segment / rate)``.

    Each receive slot turns over once per cycle: the notice reaches the sender
    (one way), the segment is serialised (``segment / rate``) and arrives (one
    way); so a connection carries ``in_flight`` segments per ``RTT + segment /
    rate``, which is the throughput of a window of the returned size.
    """
    return in_flight * segment * rtt / (rtt + segment / rate)


def pipeline_stall(step_bytes: float, channel_rate: float, latency: float, channels: int = NCCL_CHANNELS) -> float:
    """Seconds a pipelined ring waits at one of its step boundaries, over all its loops (module doc, 4).

    ``step_bytes``: what one step of the collective moves (over every channel);
    ``channel_rate``: bytes/s one channel's connections carry (the link's share,
    or less where TCP's windows hold them). Each loop of a channel moves a chunk
    of ``min(step_bytes / channels, NCCL_CHUNK)`` a step; its boundary waits
    ``max(0, latency - (chunk - slice) / channel_rate)``, the slice being at
    most :data:`NCCL_SLICE`. A chunk within one slice waits the whole latency.
    """
    per_channel = step_bytes / channels
    if per_channel <= 0:
        return latency
    chunk = min(per_channel, NCCL_CHUNK)
    overlap = (chunk - min(chunk, NCCL_SLICE)) / channel_rate
    return math.ceil(per_channel / chunk) * max(0.0, latency - overlap)


__all__ = [
    "GLOO_SEGMENT", "GLOO_SEGMENTS_IN_FLIGHT", "MAX_CHANNELS", "NCCL_CHANNELS", "NCCL_CHUNK", "NCCL_SLICE",
    "NCCL_STEP", "TRANSPORTS", "TRANSPORT_CHOICES", "Transport", "credit_window", "pipeline_stall", "resolve",
]
