"""The TCP model of gradwire.net.tcp next to published measurements of TCP over long links.

Every case is a measurement someone published (the source, what was measured
and the conditions are in CASES); the script prices the same transfer with
gradwire's TCP model and with the plain alpha-beta model (``latency + n / rate``)
and prints both beside the measured figure. Then a few model-only rows show the
effects on collectives that no measurement was found for (restart after idle,
NCCL's socket count). Writes benchmarks/results/tcp_model.json in the shared
shape of ``_results.write_results``: one row per published case, the stream
cases under ``streams``, the model-only rows under ``model_only`` and this
kernel's measurement under ``measured_here``. A run without ``--measure`` keeps
the measurement of the file it rewrites, and beside it that run's command,
commit, date and host as ``measured_command``, ``measured_commit``,
``measured_date`` and ``measured_host``.

    python benchmarks/tcp_model.py              # pure arithmetic, under a second
    sudo python benchmarks/tcp_model.py --measure  # also measure this kernel's TCP (~2 min)

``--measure`` (root) builds a delayed link here: two network namespaces joined
by TUN devices, with this script in the middle delaying every packet 25 ms
each way and serialising it at 1 Gbit/s (this kernel has no netem). It then
times messages over one TCP connection, CUBIC and BBR: the first on a new
connection, warm ones, and one after idle periods around the RTO, reads the
kernel's own RTO and window from TCP_INFO, and prices each with the model.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import heapq
import json
import os
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from _results import write_results

from gradwire.net import NetworkModel
from gradwire.net.link import Link
from gradwire.net.tcp import DEFAULT_WINDOW, TcpConfig, steps_seconds, tcp_transfer_seconds, window_cap

MiB = 1 << 20
KiB = 1 << 10


@dataclass(frozen=True)
class Case:
    """One published measurement and the transfer that reproduces it."""

    name: str
    source: str
    measured_what: str
    #: what the figure is: "MB/s" or "Mbit/s" (throughput of nbytes), "s" (time of nbytes), "extra s" (cold - warm)
    unit: str
    measured: float
    nbytes: float
    #: line rate in bit/s (payload rate: framed TCP over Ethernet), or inf
    bandwidth: float
    rtt: float
    rmem: float
    wmem: float
    streams: int = 1
    loss: float = 0.0
    congestion: str = "cubic"
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)


LIARLEE = ("https://github.com/LiarLee/LiarLee.github.io/blob/HEAD/source/_posts/Network/"
           "Network_tc%E6%8E%A7%E5%88%B6%E6%B5%81%E9%87%8F-update.md")
FILE = 1967 * MiB  # the Fedora ISO curl fetched ("1967M")


def file_mb_per_s(seconds: float) -> float:
    """Throughput of the post's transfer: curl's time_total less time_starttransfer."""
    return FILE / seconds / 1e6


CASES: list[Case] = [
    Case("1 GbE, no added delay (reference)", LIARLEE,
         "curl of a 1967 MiB file from nginx, two EC2 c5.2xlarge, htb rate 1000mbit, no netem: 16.63 s",
         "MB/s", file_mb_per_s(16.634), FILE, 1e9, 200e-6, 6 * MiB, 4 * MiB,
         notes="the shaper's own accounting: it passed a little more payload than a framed 1 Gbit/s"),
    Case("1 GbE, 50 ms RTT, default buffers", LIARLEE,
         "same transfer with netem delay 50 ms (ping 50.1 ms), tcp_rmem max 6 MiB / tcp_wmem max 4 MiB: 50.76 s",
         "MB/s", file_mb_per_s(50.756 - 0.103), FILE, 1e9, 0.0501, 6 * MiB, 4 * MiB,
         notes="the post prints the client's rmem and wmem lines swapped; either way the model's bound is the "
               "server's 4 MiB tcp_wmem (in flight measured: 48% of it, where the model's "
               "default share is 63%: the one published connection that carried the kernel's starting half)"),
    Case("1 GbE, 50 ms RTT, receiver 12.5 MiB", LIARLEE,
         "client tcp_rmem fixed at 13107200 (12.5 MiB), server tcp_wmem max still 4 MiB: 37.12 s",
         "MB/s", file_mb_per_s(37.119 - 0.104), FILE, 1e9, 0.0501, 12.5 * MiB, 4 * MiB,
         notes="the send buffer binds; it carried 66% of tcp_wmem in flight, the model's default share 63%"),
    Case("1 GbE, 50 ms RTT, both 12.5 MiB", LIARLEE,
         "server tcp_wmem and client tcp_rmem fixed at 12.5 MiB: 17.01 s, the link is full",
         "MB/s", file_mb_per_s(17.008 - 0.103), FILE, 1e9, 0.0501, 12.5 * MiB, 12.5 * MiB),
    Case("100 Mbit/s line, 20 ms RTT, SO_SNDBUF 16 KiB",
         "https://plantegg.github.io/2020/09/28/%E5%B0%B1%E6%98%AF%E8%A6%81%E4%BD%A0%E6%87%82TCP--"
         "%E6%80%A7%E8%83%BD%E5%92%8C%E5%8F%91%E9%80%81%E6%8E%A5%E6%94%B6Buffer%E7%9A%84%E5%85%B3%E7%B3%BB2/",
         "a 22 MB SQL result over a 100 Mbit/s leased line, 20 ms RTT, from a server that sets "
         "SO_SNDBUF=16 KiB (the kernel doubles it: tcp_wmem=32KiB here): 'about 25 s'; scp of the same data ~2 s",
         "s", 25.0, 22e6, 100e6, 0.020, 6 * MiB, 32 * KiB),
    Case("1 MB message, 20 ms RTT, first vs warm",
         "https://github.com/vacp2p/nim-libp2p/issues/850",
         "libp2p gossipsub test, unbounded bandwidth, half-ping 10 ms: first 1 MB message delivered in 161 ms "
         "(wave 0), later ones on the opened window in 18-19 ms (waves 2-4); the figure is the difference",
         "extra s", 0.161 - (0.019 + 0.018 + 0.019) / 3, 1e6, 32e9, 0.020, 6 * MiB, 4 * MiB,
         notes="MTU 1500 assumed (not stated); their warm figure also holds about one half-ping of protocol"),
]

DUMAZET = ("https://unix.stackexchange.com/questions/71051/"
           "what-are-the-other-congestion-control-algorithms-specially-designed-for-lossy-wi "
           "(quoting the BBR patch series, https://patchwork.ozlabs.org/patch/671069/)")
CASES += [
    Case("10 Gbit/s, 100 ms RTT, 1% loss, CUBIC", DUMAZET,
         "netperf TCP_STREAM, 100 ms RTT, 1% random loss, -K cubic: 3.27 Mbit/s (buffers not stated)",
         "Mbit/s", 3.27, 3.27e6 / 8 * 40, 10e9, 0.100, 2 << 30, 2 << 30, loss=0.01,
         notes="Mathis et al. assume Reno; CUBIC with SACK recovers faster"),
    Case("10 Gbit/s, 100 ms RTT, 1% loss, BBR", DUMAZET,
         "the same path with -K bbr: 9150 Mbit/s; the series says BBR fills the path up to 15% loss, "
         "at link rate x (1 - loss)",
         "Mbit/s", 9150.01, 9150.01e6 / 8 * 30.25, 10e9, 0.100, 2 << 30, 2 << 30, loss=0.01, congestion="bbr",
         notes="buffers not stated: priced with the window out of the way (2 GiB buffers)"),
]

# streams: published throughput against the number of parallel TCP connections; RTT not published, so
# the per-stream cap is calibrated on the first row and only the scaling is tested
STREAM_CASES = [
    {"name": "iperf3 over a 1 Gbit/s WAN, 3000 miles, 1-3 streams",
     "source": "https://blog.michaelfmcnamara.com/tag/performance",
     "measured_what": "iperf3 between two servers 3000 miles apart over a 1 Gbit/s WAN: 1 stream ~350, "
                      "2 streams ~600, 3 streams ~789 Mbit/s (RTT not given)",
     "bandwidth": 1e9, "points": [(1, 350e6), (2, 600e6), (3, 789e6)]},
    {"name": "PCCL all-reduce across western Europe, 8-128 connections",
     "source": "https://arxiv.org/abs/2505.14065 (section 6.2; table as quoted in "
               "https://13shivam.github.io/distributed-ml-demystified/chapter8-benchmarks.html)",
     "measured_what": "PCCL all-reduce bandwidth across Frankfurt, Paris, Belgium, London, Netherlands vs the "
                      "number of TCP connections: 8: 11.25, 16: 18.17, 32: 34.29, 64: 44.47, 100: 44.55, "
                      "128: 45.74 Gbit/s (RTT and NIC rate not given; the plateau is taken as the link)",
     "bandwidth": None, "points": [(8, 11.25e9), (16, 18.17e9), (32, 34.29e9), (64, 44.47e9), (100, 44.55e9),
                                   (128, 45.74e9)]},
]


def payload_rate(bandwidth: float, rtt: float = 0.0, loss: float = 0.0, congestion: str | None = None) -> float:
    """Payload bytes/s of a TCP link: framing, and loss as the congestion control meets it (None: the old model)."""
    tcp = None if congestion is None else TcpConfig(congestion=congestion)
    return Link(bandwidth, rtt / 2, "tcp", loss, tcp).payload_rate


def price(case: Case) -> tuple[float, float]:
    """(TCP model, alpha-beta) in the case's unit; alpha-beta is the model before TCP's windows (Mathis under loss)."""
    rate = payload_rate(case.bandwidth, case.rtt, case.loss, case.congestion)
    old_rate = payload_rate(case.bandwidth, case.rtt, case.loss)
    cap = window_cap(case.rmem, case.wmem)

    def seconds(idle: float | None) -> float:
        return tcp_transfer_seconds(case.nbytes, rate, case.rtt, window_cap=cap, streams=case.streams, idle=idle)

    plain = case.rtt / 2 + case.nbytes / old_rate
    if case.unit in ("MB/s", "Mbit/s"):
        scale = 1e6 if case.unit == "MB/s" else 1e6 / 8
        return case.nbytes / seconds(None) / scale, case.nbytes / plain / scale
    if case.unit == "s":
        return seconds(None), plain
    return seconds(None) - seconds(0.0), 0.0  # extra seconds of a first transfer over a warm one


def stream_rows(spec: dict) -> list[dict]:
    """Throughput of k streams from the 1st row's per-stream rate: min(k x per-stream, link)."""
    (k0, first), *_ = spec["points"]
    per_stream = first / k0
    link = spec["bandwidth"] * 1448 / 1514 if spec["bandwidth"] else max(v for _, v in spec["points"])
    rows = []
    for k, measured in spec["points"]:
        model = min(k * per_stream, link)
        rows.append({"streams": k, "measured_bits": measured, "model_bits": model,
                     "alpha_beta_bits": link, "model_error_pct": 100 * (model / measured - 1)})
    return rows


def model_only() -> list[dict]:
    """Effects no published measurement was found for: priced by the model alone."""
    rows = []
    wan = "bandwidth=10gbit,latency=40ms"
    for label, spec in (("gloo (1 connection per pair)", wan + ",transport=gloo"),
                        ("NCCL, 2 channels x 1 socket (generic NIC)", wan + ",transport=nccl"),
                        ("NCCL, 2 channels x 4 sockets (GCP gVNIC)", wan + ",transport=nccl,streams=4"),
                        ("NCCL, 2 channels x 16 sockets (AWS ENA)", wan + ",transport=nccl,streams=16"),
                        ("plain alpha-beta", wan + ",tcp=off")):
        for world in (2, 8):
            cost = NetworkModel(spec, world).cost("all_reduce", 256 * MiB)
            rows.append({"what": f"256 MiB all_reduce, {world} ranks, 10 Gbit/s, 80 ms RTT, {label}",
                         "spec": spec, "seconds": cost.seconds, "algorithm": cost.algorithm})
    link = Link(10e9, 0.040, "tcp")
    rate, rtt = link.payload_rate, link.rtt
    for idle, label in ((0.0, "warm (back-to-back)"), (0.25, "after 250 ms of compute (< RTO 280 ms)"),
                        (0.5, "after 500 ms of compute (> RTO: one halving)"), (5.0, "after 5 s (back to initcwnd)")):
        seconds = tcp_transfer_seconds(16 * MiB, rate, rtt, latency=link.latency, idle=idle)
        rows.append({"what": f"16 MiB to one peer, 10 Gbit/s, 80 ms RTT, {label}", "seconds": seconds})
    return rows


# ------------------------------------------------------------------ measured here (--measure, root)
DELAY, RATE, MTU, BULK_MTU = 0.025, 1e9, 1500, 9000  # one way, bits/s on the IP packet, bytes
NAMESPACES, TUNS, ADDRS, PORT = ("gwtcp-a", "gwtcp-b"), ("gwtcpA", "gwtcpB"), ("10.77.0.1", "10.77.0.2"), 5555
IDLES = (0.1, 0.4, 0.7, 1.5, 5.0)
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000


def _tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def _delayer(ready: str, delay: float = DELAY, rate: float = RATE) -> None:
    """Forward IP packets between the two TUN devices, each ``delay`` later and serialised at ``rate``."""
    fds = _tun(TUNS[0]), _tun(TUNS[1])
    Path(ready).write_text("ok")
    sel = selectors.DefaultSelector()
    sel.register(fds[0], selectors.EVENT_READ, fds[1])
    sel.register(fds[1], selectors.EVENT_READ, fds[0])
    queue: list[tuple[float, int, int, bytes]] = []
    busy_until, seq = {fd: 0.0 for fd in fds}, 0
    while True:
        while queue and queue[0][0] <= time.monotonic():
            _, _, out, packet = heapq.heappop(queue)
            try:
                os.write(out, packet)
            except OSError:
                pass
        timeout = None if not queue else max(0.0, queue[0][0] - time.monotonic())
        for key, _ in sel.select(timeout):
            while True:
                try:
                    packet = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                busy_until[key.fd] = max(time.monotonic(), busy_until[key.fd]) + len(packet) * 8 / rate
                seq += 1
                heapq.heappush(queue, (busy_until[key.fd] + delay, seq, key.data, packet))


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _server(ready: str) -> None:
    """Read length-prefixed messages; answer each with one byte once it is all in."""
    listener = socket.create_server((ADDRS[1], PORT), reuse_port=True)
    Path(ready).write_text("ok")
    while True:
        conn, _ = listener.accept()
        try:
            while (n := struct.unpack("!Q", _recv_exact(conn, 8))[0]) > 0:
                left = n
                while left:
                    got = len(conn.recv(min(left, 1 << 20)))
                    if not got:
                        raise EOFError
                    left -= got
                conn.sendall(b"k")
        except EOFError:
            pass
        conn.close()


def _tcp_info(conn: socket.socket) -> dict[str, float]:
    fields_ = struct.unpack_from("24I", conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 8)
    return {"rto_ms": fields_[0] / 1e3, "srtt_ms": fields_[15] / 1e3, "rttvar_ms": fields_[16] / 1e3,
            "cwnd": fields_[18], "ssthresh": fields_[17], "mss": fields_[2], "retrans": fields_[23]}


_PAYLOAD = bytes(64 << 20)


def _message(conn: socket.socket, n: int) -> float:
    start = time.monotonic()
    conn.sendall(struct.pack("!Q", n) + _PAYLOAD[:n])
    assert conn.recv(1) == b"k"
    return time.monotonic() - start


def _connect(cc: str) -> socket.socket:
    conn = socket.socket()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.connect((ADDRS[1], PORT))
    return conn


def _client(cc: str) -> None:
    """One round of probes; prints a JSON line."""
    out: dict = {"cc": cc}
    conn = _connect(cc)
    out["ping_s"] = [_message(conn, 1) for _ in range(5)]
    conn.close()
    conn = _connect(cc)
    out["cold_1MiB_s"] = _message(conn, 1 * MiB)
    _message(conn, 32 * MiB)
    out["warm_1MiB_s"] = _message(conn, 1 * MiB)
    out["warm_info"] = _tcp_info(conn)
    out["idle"] = []
    for idle in IDLES:
        _message(conn, 16 * MiB)
        time.sleep(idle)
        before = _tcp_info(conn)
        out["idle"].append({"idle_s": idle, "msg_4MiB_s": _message(conn, 4 * MiB), "before": before,
                            "after": _tcp_info(conn)})
    conn.sendall(struct.pack("!Q", 0))
    conn.close()
    print(json.dumps(out), flush=True)


def _bulk(cc: str) -> None:
    """Steady throughput of one warm connection (64 MiB messages); prints a JSON line."""
    conn = _connect(cc)
    ping = [_message(conn, 1) for _ in range(5)]
    _message(conn, 64 * MiB)
    times = [_message(conn, 64 * MiB) for _ in range(2)]
    print(json.dumps({"cc": cc, "ping_s": ping, "bulk_64MiB_s": times, "info": _tcp_info(conn)}), flush=True)
    conn.sendall(struct.pack("!Q", 0))
    conn.close()


def _run(*args: str, check: bool = True) -> None:
    subprocess.run(args, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(path: str, seconds: float = 120.0) -> None:
    """Wait until a child wrote ``path`` (starting Python and importing numpy takes seconds on a busy host)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {seconds:g} s: a helper process failed to start")
        time.sleep(0.05)


GLOO_SIZES, GLOO_GAPS = (4 * MiB, 32 * MiB), (0.0, 0.1, 1.0, 3.0)


def _gloo(rank: int, cc: str) -> None:
    """One rank of a 2-rank gloo job across the link: all_reduce times after compute gaps (rank 0 prints)."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=ADDRS[0], MASTER_PORT="29533", GLOO_SOCKET_IFNAME=TUNS[rank])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out: dict = {"cc": cc, "small_s": [], "rows": []}
    tiny = torch.zeros(1)
    for _ in range(5):
        start = time.monotonic()
        dist.all_reduce(tiny)
        out["small_s"].append(time.monotonic() - start)
    for n in GLOO_SIZES:
        buf = torch.zeros(n // 4)
        for _ in range(2):
            dist.all_reduce(buf)
        for gap in GLOO_GAPS:
            times = []
            for _ in range(3):
                time.sleep(gap)  # both ranks: the compute phase between two all_reduces
                start = time.monotonic()
                dist.all_reduce(buf)
                times.append(time.monotonic() - start)
            out["rows"].append({"bytes": n, "gap_s": gap, "all_reduce_s": times})
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


@contextlib.contextmanager
def delayed_link(mtu: int, *, delay: float = DELAY, rate: float = RATE, congestion: str | None = None,
                 sysctls: dict[str, str] | None = None) -> Iterator[None]:
    """Two namespaces joined by this script's delayer (``delay`` each way, ``rate`` bit/s); all removed on exit.

    ``congestion``: the namespaces' default congestion control (a namespace takes the host's default when it
    is made and may not change it here, so the host's is set for the moment it is made, then restored).
    ``sysctls``: set in both namespaces (``tcp_rmem``/``tcp_wmem`` are per namespace).
    """
    me, ready = [sys.executable, str(Path(__file__).resolve())], f"/tmp/gwtcp-{os.getpid()}.ready"
    started: list[subprocess.Popen[bytes]] = []
    host_cc = Path("/proc/sys/net/ipv4/tcp_congestion_control")
    before = host_cc.read_text().strip()
    try:
        for ns in NAMESPACES:
            _run("ip", "netns", "del", ns, check=False)  # ours, left by a run that was killed
            if congestion:
                host_cc.write_text(congestion)
            try:
                _run("ip", "netns", "add", ns)
            finally:
                host_cc.write_text(before)
            for key, value in (sysctls or {}).items():
                _run("ip", "netns", "exec", ns, "sysctl", "-w", f"{key}={value}")
        started.append(subprocess.Popen([*me, "--role", "delayer", ready, repr(delay), repr(rate)]))
        _wait_for(ready)
        for ns, tun, addr in zip(NAMESPACES, TUNS, ADDRS):
            _run("ip", "link", "set", tun, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", tun)
            _run("ip", "-n", ns, "link", "set", tun, "mtu", str(mtu), "txqueuelen", "10000", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        for ns in NAMESPACES:
            _run("ip", "netns", "del", ns, check=False)
        if os.path.exists(ready):
            os.unlink(ready)


def measure(repeats: int, mtu: int, probe: str) -> list[dict]:
    """Build the link at ``mtu``, run ``probe`` (client, bulk or gloo) ``repeats`` times per congestion control."""
    me, ready = [sys.executable, str(Path(__file__).resolve())], f"/tmp/gwtcp-{os.getpid()}.server"
    runs: list[dict] = []
    with delayed_link(mtu):
        if probe == "gloo":
            # gloo sets no congestion control: the host's default applies
            cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
            for _ in range(repeats):
                peer = subprocess.Popen(["ip", "netns", "exec", NAMESPACES[1], *me, "--role", "gloo", "1", cc],
                                        stdout=subprocess.DEVNULL)
                try:
                    done = subprocess.run(["ip", "netns", "exec", NAMESPACES[0], *me, "--role", "gloo", "0", cc],
                                          check=True, capture_output=True, text=True, timeout=400)
                    peer.wait(timeout=60)
                finally:
                    peer.kill()
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            return runs
        server = subprocess.Popen(["ip", "netns", "exec", NAMESPACES[1], *me, "--role", "server", ready])
        try:
            _wait_for(ready)
            for _ in range(repeats):
                for cc in ("cubic", "bbr"):
                    done = subprocess.run(["ip", "netns", "exec", NAMESPACES[0], *me, "--role", probe, cc],
                                          check=True, capture_output=True, text=True, timeout=300)
                    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            server.kill()
            server.wait()
            if os.path.exists(ready):
                os.unlink(ready)
    return runs


def score(runs: list[dict], bulk_runs: list[dict]) -> list[dict]:
    """Medians of the runs per congestion control, each beside the model's price of the same message."""
    rows = []
    for cc in ("cubic", "bbr"):
        mine = [r for r in runs if r["cc"] == cc]
        bulk = [r for r in bulk_runs if r["cc"] == cc]
        rtt = statistics.median(t for r in mine for t in r["ping_s"])
        rate = RATE / 8 * 1448 / MTU  # the delayer serialises whole IP packets

        def model(n: int, idle: float | None) -> float:
            return tcp_transfer_seconds(n + 8, rate, rtt, window_cap=DEFAULT_WINDOW, idle=idle,
                                        slow_start_after_idle=cc != "bbr") + rtt / 2  # + the 1-byte answer

        def row(what: str, measured: list[float], predicted: float, unit: str = "s",
                plain: float | None = None) -> None:
            value = statistics.median(measured)
            rows.append({"cc": cc, "what": what, "unit": unit, "measured": value, "runs": measured,
                         "model": predicted, "model_error_pct": 100 * (predicted / value - 1),
                         "alpha_beta": plain,
                         "alpha_beta_error_pct": None if plain is None else 100 * (plain / value - 1)})

        def plain(n: int, payload_rate: float, round_trip: float) -> float:
            return round_trip + (n + 8) / payload_rate  # latency + bytes x beta, + the 1-byte answer

        row("round trip of 1 byte", [statistics.median(r["ping_s"]) for r in mine], 2 * DELAY)
        row("RTO - srtt (TCP_INFO)", [r["warm_info"]["rto_ms"] - r["warm_info"]["srtt_ms"] for r in mine], 200.0,
            "ms")
        row("1 MiB, first message on a new connection", [r["cold_1MiB_s"] for r in mine], model(MiB, None),
            plain=plain(MiB, rate, rtt))
        row("1 MiB, warm connection", [r["warm_1MiB_s"] for r in mine], model(MiB, 0.0), plain=plain(MiB, rate, rtt))
        big_rtt, big_rate = statistics.median(t for r in bulk for t in r["ping_s"]), RATE / 8 * 8948 / BULK_MTU
        big = tcp_transfer_seconds(64 * MiB + 8, big_rate, big_rtt, mss=8948, window_cap=DEFAULT_WINDOW,
                                   idle=0.0) + big_rtt / 2
        row(f"64 MiB, warm connection, MTU {BULK_MTU}", [min(r["bulk_64MiB_s"]) for r in bulk], big,
            plain=plain(64 * MiB, big_rate, big_rtt))
        row(f"  bytes in flight / tcp_wmem (64 MiB, MTU {BULK_MTU})",
            [64 * MiB / min(r["bulk_64MiB_s"]) * statistics.median(r["ping_s"]) / (4 * MiB) for r in bulk],
            DEFAULT_WINDOW / (4 * MiB), "x")
        for i, idle in enumerate(IDLES):
            # the connection last sent about half a round trip before the answer that ended the sleep's start
            row(f"4 MiB after {idle:g} s idle", [r["idle"][i]["msg_4MiB_s"] for r in mine],
                model(4 * MiB, idle + rtt / 2), plain=plain(4 * MiB, rate, rtt))
    return rows


def score_gloo(runs: list[dict]) -> list[dict]:
    """gloo's ring all_reduce on 2 ranks (2 steps of n/2 on one connection) beside the model and alpha-beta."""
    rows: list[dict] = []
    if not runs:
        return rows
    cc = runs[0]["cc"]
    rtt = statistics.median(t for r in runs for t in r["small_s"])  # 2 steps x one-way latency
    rate, config = RATE / 8 * 8948 / BULK_MTU, TcpConfig(congestion=cc)
    small = statistics.median(statistics.median(r["small_s"]) for r in runs)
    rows.append({"cc": f"gloo/{cc}", "what": "all_reduce of 4 bytes", "unit": "s", "measured": small,
                 "runs": [statistics.median(r["small_s"]) for r in runs], "model": 2 * DELAY,
                 "model_error_pct": 100 * (2 * DELAY / small - 1), "alpha_beta": 2 * DELAY,
                 "alpha_beta_error_pct": 100 * (2 * DELAY / small - 1)})
    for i, spec in enumerate(runs[0]["rows"]):
        n, gap = spec["bytes"], spec["gap_s"]
        measured = [statistics.median(r["rows"][i]["all_reduce_s"]) for r in runs]
        value = statistics.median(measured)
        model = steps_seconds(n / 2, 2, rate, rtt, rtt / 2, mss=8948, config=config, idle=gap, same_peer=True)
        plain = rtt + n / rate
        rows.append({"cc": f"gloo/{cc}", "what": f"all_reduce {n >> 20} MiB after {gap:g} s of compute",
                     "unit": "s", "measured": value, "runs": measured, "model": model,
                     "model_error_pct": 100 * (model / value - 1), "alpha_beta": plain,
                     "alpha_beta_error_pct": 100 * (plain / value - 1)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="also measure this kernel's TCP over a delayed link (root)")
    ap.add_argument("--repeats", type=int, default=3, help="probe rounds per congestion control (default 3)")
    ap.add_argument("--append", action="store_true", help="with --measure: add the new rounds to the kept ones")
    ap.add_argument("--rescore", action="store_true", help="price the kept measurement again (no root, no network)")
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        role, *rest = args.role
        {"delayer": lambda: _delayer(rest[0], *map(float, rest[1:])), "server": lambda: _server(rest[0]), "client": lambda: _client(rest[0]),
         "bulk": lambda: _bulk(rest[0]), "gloo": lambda: _gloo(int(rest[0]), rest[1])}[role]()
        return 0
    path = Path(__file__).parent / "results" / "tcp_model.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    out: dict = {"cases": [], "streams": [], "model_only": [],
                 "measured_here": previous.get("measured_here")}
    print(f"{'case':44} {'unit':>8} {'measured':>10} {'model':>10} {'error':>8} {'alpha-beta':>11} {'error':>8}")
    for case in CASES:
        model, plain = price(case)
        err = 100 * (model / case.measured - 1)
        plain_err = 100 * (plain / case.measured - 1) if plain else None
        print(f"{case.name:44} {case.unit:>8} {case.measured:10.3f} {model:10.3f} {err:+7.0f}% "
              + (f"{plain:11.3f} {plain_err:+7.0f}%" if plain_err is not None else f"{'-':>11} {'-':>8}"))
        out["cases"].append({"name": case.name, "source": case.source, "measured_what": case.measured_what,
                             "unit": case.unit, "measured": case.measured, "model": model, "model_error_pct": err,
                             "alpha_beta": plain if plain_err is not None else None,
                             "alpha_beta_error_pct": plain_err, "rtt_s": case.rtt, "bandwidth_bits": case.bandwidth,
                             "tcp_rmem": case.rmem, "tcp_wmem": case.wmem, "loss": case.loss,
                             "congestion": case.congestion,
                             "window_bytes": window_cap(case.rmem, case.wmem), "notes": case.notes})
    for spec in STREAM_CASES:
        rows = stream_rows(spec)
        print(f"\n{spec['name']} (per-stream cap calibrated on the first row)")
        for r in rows:
            print(f"  {r['streams']:4d} streams: measured {r['measured_bits'] / 1e9:7.3f} Gbit/s, model "
                  f"{r['model_bits'] / 1e9:7.3f} ({r['model_error_pct']:+.0f}%), alpha-beta "
                  f"{r['alpha_beta_bits'] / 1e9:7.3f}")
        out["streams"].append({**{k: v for k, v in spec.items() if k != "points"}, "rows": rows})
    print("\nmodel only (no published measurement found)")
    for row in model_only():
        print(f"  {row['what']}: {row['seconds']:.3f} s" + (f" ({row['algorithm']})" if "algorithm" in row else ""))
        out["model_only"].append(row)
    if args.measure and os.geteuid() != 0:
        ap.error("--measure builds network namespaces and TUN devices: run it as root (sudo)")
    if args.measure:
        load = os.getloadavg()[0]
        runs, bulk_runs = measure(args.repeats, MTU, "client"), measure(args.repeats, BULK_MTU, "bulk")
        gloo_runs = measure(args.repeats, BULK_MTU, "gloo")
        kept = out["measured_here"] if args.append and out["measured_here"] else {}
        runs, bulk_runs = kept.get("runs", []) + runs, kept.get("bulk_runs", []) + bulk_runs
        gloo_runs = kept.get("gloo_runs", []) + gloo_runs
        out["measured_here"] = {"link": f"userspace delayer: {DELAY * 1e3:g} ms each way, {RATE / 1e9:g} Gbit/s, "
                                        f"MTU {MTU} (bulk {BULK_MTU}), default tcp_rmem/tcp_wmem",
                                "kernel": os.uname().release, "load_before": load, "load_after": os.getloadavg()[0],
                                "runs": runs, "bulk_runs": bulk_runs, "gloo_runs": gloo_runs,
                                "rows": score(runs, bulk_runs) + score_gloo(gloo_runs)}
    if args.rescore and out["measured_here"]:
        here = out["measured_here"]
        here["rows"] = score(here["runs"], here["bulk_runs"]) + score_gloo(here.get("gloo_runs", []))
    if out["measured_here"]:
        print(f"\nmeasured here ({out['measured_here']['link']}, Linux {out['measured_here']['kernel']})")
        for r in out["measured_here"]["rows"]:
            plain_ = "" if r["alpha_beta"] is None else \
                f"  alpha-beta {r['alpha_beta']:.3f} ({r['alpha_beta_error_pct']:+.0f}%)"
            print(f"  {r['cc']:5} {r['what']:50} measured {r['measured']:8.3f} {r['unit']:2}  model "
                  f"{r['model']:.3f} ({r['model_error_pct']:+.0f}%){plain_}")
    # a measurement kept from the file this run rewrites: the command, commit, date and host of the run that made it
    measured = {f"measured_{k}": previous.get(f"measured_{k}", previous.get(k))
                for k in ("command", "commit", "date", "host")} if out["measured_here"] and not args.measure else {}
    write_results(path, out.pop("cases"), indent=2, **measured, **out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
