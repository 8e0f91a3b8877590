"""The TCP model of gradwire.net.tcp next to published measurements of TCP over long links.

Every case is a measurement someone published (the source, what was measured
and the conditions are in CASES); the script prices the same transfer with
gradwire's TCP model and with the plain alpha-beta model (``latency + n / rate``)
and prints both beside the measured figure. Then a few model-only rows show the
effects on collectives that no measurement was found for (restart after idle,
NCCL's socket count). Writes benchmarks/results/tcp_model.json.

    python benchmarks/tcp_model.py

Pure arithmetic: no process group, no network, well under a second.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gradwire.net import NetworkModel
from gradwire.net.link import Link
from gradwire.net.tcp import TcpConfig, tcp_transfer_seconds, window_cap

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
               "server's 4 MiB tcp_wmem (in flight measured: 48% of it)"),
    Case("1 GbE, 50 ms RTT, receiver 12.5 MiB", LIARLEE,
         "client tcp_rmem fixed at 13107200 (12.5 MiB), server tcp_wmem max still 4 MiB: 37.12 s",
         "MB/s", file_mb_per_s(37.119 - 0.104), FILE, 1e9, 0.0501, 12.5 * MiB, 4 * MiB,
         notes="the send buffer binds; it carried 66% of tcp_wmem in flight, the model assumes 50%"),
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
    for label, spec in (("gloo (1 connection per pair)", wan), ("NCCL sockets, GCP gVNIC (4)", wan + ",streams=4"),
                        ("NCCL sockets, AWS ENA (16)", wan + ",streams=16"), ("plain alpha-beta", wan + ",tcp=off")):
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


def main() -> int:
    out: dict = {"cases": [], "streams": [], "model_only": []}
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
    path = Path(__file__).parent / "results" / "tcp_model.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
