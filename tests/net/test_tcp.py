"""TCP on long links (gradwire.net.tcp): window cap, slow start, restart after idle, streams."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gradwire.net import NetworkModel, parse_spec
from gradwire.net.algorithms import Group, ring_all_reduce, tree_broadcast
from gradwire.net.link import Link
from gradwire.net.transport import GLOO_SEGMENT, credit_window
from gradwire.net.tcp import (
    DEFAULT_WINDOW, STRIPE_MIN_CHUNK, TcpConfig, linux_rto, restart_window, tcp_transfer_seconds, window_cap,
)

MiB = 1 << 20
MSS = 1448
W0 = 10 * MSS  # initcwnd 10
RATE_10G = 10e9 / 8 * 1448 / 1514  # payload bytes/s of a 10 Gbit/s TCP link


def rate_of(nbytes: float, seconds: float) -> float:
    return nbytes / seconds


# ------------------------------------------------------------------ window cap
def test_linux_defaults_give_a_2_5_mib_window_the_send_buffer_binds():
    assert window_cap(32 * MiB, 4 * MiB) == DEFAULT_WINDOW == pytest.approx(0.63 * 4 * MiB)  # of the send buffer
    assert window_cap(8 * MiB, 64 * MiB) == pytest.approx(0.63 * 8 * MiB)  # the receiver's buffer binds
    assert window_cap(32 * MiB, 4 * MiB, share=0.5) == 2 * MiB  # the kernel's starting half
    assert TcpConfig(wmem=64 * MiB).window == pytest.approx(0.63 * 32 * MiB)
    assert window_cap(4 << 30, 4 << 30) == 65535 << 14  # window scale 14: at most 1 GiB


def test_window_cap_binds_at_large_rtt_and_not_at_small():
    n = 1 << 30
    far = tcp_transfer_seconds(n, RATE_10G, 0.1, idle=0.0)
    assert rate_of(n, far) == pytest.approx(DEFAULT_WINDOW / 0.1, rel=0.01)  # 26 MB/s = 211 Mbit/s, not 1.2 GB/s
    near = tcp_transfer_seconds(n, RATE_10G, 1e-3, idle=0.0)
    assert rate_of(n, near) == pytest.approx(RATE_10G, rel=0.01)  # 2.5 MiB / 1 ms > the link


def test_streams_multiply_the_cap_and_share_the_link():
    n = 1 << 30
    one, four = (tcp_transfer_seconds(n, RATE_10G, 0.1, idle=0.0, streams=k) for k in (1, 4))
    assert rate_of(n, four) == pytest.approx(4 * rate_of(n, one), rel=0.02)
    many = tcp_transfer_seconds(n, RATE_10G, 0.1, idle=0.0, streams=64)
    assert many == pytest.approx(0.05 + n / RATE_10G, rel=1e-9)  # 64 x 2 MiB / 100 ms > 10 Gbit/s: line rate


def test_a_message_is_striped_in_pieces_of_at_least_64_kib():
    small = STRIPE_MIN_CHUNK  # one piece: one stream, however many are open
    assert tcp_transfer_seconds(small, RATE_10G, 0.1, streams=16) == tcp_transfer_seconds(small, RATE_10G, 0.1)


# ------------------------------------------------------------------ slow start
@pytest.mark.parametrize("n", [256 << 10, 1 * MiB, 4 * MiB])
def test_slow_start_adds_about_log2_rounds_for_a_short_transfer(n):
    rtt = 0.1  # 10 Gbit/s x 100 ms: the pipe holds 125 MB, far more than n
    plain = rtt / 2 + n / RATE_10G
    extra_rtts = (tcp_transfer_seconds(n, RATE_10G, rtt) - plain) / rtt
    assert math.log2(n / W0) - 1 <= extra_rtts <= math.log2(n / W0) + 1


def test_slow_start_is_negligible_for_a_long_transfer_on_a_short_link():
    n, rtt = 256 * MiB, 100e-6
    plain = rtt / 2 + n / RATE_10G
    assert tcp_transfer_seconds(n, RATE_10G, rtt) == pytest.approx(plain, rel=5e-3)


def test_a_first_window_that_fills_the_pipe_is_the_alpha_beta_price():
    rate, rtt = 1e9 / 8 * 1448 / 1514, 100e-6  # 1 GbE: the pipe holds 12 KB < 14.5 KB
    for n in (0, 4096, 1 * MiB, 64 * MiB):
        assert tcp_transfer_seconds(n, rate, rtt) == pytest.approx(rtt / 2 + n / rate if n else 0.0)


# ------------------------------------------------------------------ restart after idle
def test_linux_rto_is_srtt_plus_rto_min():
    assert linux_rto(0.1) == pytest.approx(0.3)
    assert linux_rto(100e-6) == pytest.approx(0.2001)


def test_restart_window_halves_once_per_rto_after_the_first_down_to_initcwnd():
    cwnd, rto = 1000.0, 0.3
    assert restart_window(cwnd, 10, 0.3, rto) == cwnd  # not longer than the RTO: untouched
    assert restart_window(cwnd, 10, 0.31, rto) == cwnd / 2
    assert restart_window(cwnd, 10, 0.9, rto) == cwnd / 4  # ceil(3) - 1 = 2 halvings
    assert restart_window(cwnd, 10, 60.0, rto) == 10
    assert restart_window(5.0, 10, 60.0, rto) == 5.0  # never above the window it had


def test_idle_restart_only_when_idle_exceeds_the_rto():
    n, rtt = 64 * MiB, 0.05
    rto = linux_rto(rtt)
    warm = tcp_transfer_seconds(n, RATE_10G, rtt, idle=0.0)
    assert tcp_transfer_seconds(n, RATE_10G, rtt, idle=0.99 * rto) == warm
    assert tcp_transfer_seconds(n, RATE_10G, rtt, idle=1.01 * rto) > warm
    cold = tcp_transfer_seconds(n, RATE_10G, rtt)
    assert tcp_transfer_seconds(n, RATE_10G, rtt, idle=3600.0) == cold > warm
    assert tcp_transfer_seconds(n, RATE_10G, rtt, idle=3600.0, slow_start_after_idle=False) == warm


def test_bbr_skips_the_idle_restart_and_keeps_its_rate_under_random_loss():
    cubic, bbr = TcpConfig(), TcpConfig(congestion="bbr")
    assert cubic.restarts_after_idle and not bbr.restarts_after_idle
    lossy = Link(1e9, 0.02, "tcp", 1e-4, cubic), Link(1e9, 0.02, "tcp", 1e-4, bbr)
    assert lossy[0].payload_rate < 0.1 * lossy[1].payload_rate
    assert lossy[1].payload_rate == pytest.approx(lossy[1].framed_rate * (1 - 1e-4))


# ------------------------------------------------------------------ collectives
def _group(link: Link, p: int, idle: float | None) -> Group:
    return Group(p, p, 1, link, link, link, idle)


def test_a_ring_pays_slow_start_once_a_tree_on_every_step():
    link = Link(10e9, 0.025, "tcp", 0.0, TcpConfig())  # RTT 50 ms
    n, p = 64 * MiB, 8
    ring_extra = ring_all_reduce(_group(link, p, None), n).seconds - ring_all_reduce(_group(link, p, 0.0), n).seconds
    chunk = n / p
    cap = min(DEFAULT_WINDOW, credit_window(GLOO_SEGMENT, link.payload_rate, link.rtt))  # gloo's ring segments
    one_step = tcp_transfer_seconds(chunk, link.payload_rate, link.rtt, latency=link.latency, window_cap=cap) - \
        tcp_transfer_seconds(chunk, link.payload_rate, link.rtt, latency=link.latency, idle=0.0, window_cap=cap)
    assert ring_extra == pytest.approx(one_step, rel=0.05)  # later steps reuse the grown window
    tree_cold, tree_warm = (tree_broadcast(_group(link, p, idle), n).seconds for idle in (None, 0.0))
    steps = 3  # ceil(lg 8): three peers, three cold connections
    whole = tcp_transfer_seconds(n, link.payload_rate, link.rtt, latency=link.latency) - \
        tcp_transfer_seconds(n, link.payload_rate, link.rtt, latency=link.latency, idle=0.0)
    assert tree_cold - tree_warm == pytest.approx(steps * whole, rel=1e-6)


def test_the_window_cap_slows_a_wan_all_reduce_that_alpha_beta_prices_at_line_rate():
    spec = "bandwidth=10gbit,latency=40ms"
    tcp, plain = (NetworkModel(s, 2).cost("all_reduce", 256 * MiB, ).seconds for s in (spec, spec + ",tcp=off"))
    assert tcp > 5 * plain  # 2 MiB per 80 ms is 26 MB/s, the link 1.2 GB/s
    wide = NetworkModel(spec + ",streams=16", 2).cost("all_reduce", 256 * MiB).seconds
    assert plain < wide < tcp


def test_lan_presets_and_rdma_are_priced_as_before():
    for spec in ("1gbe", "ib-hdr,latency=50ms", "ib-hdr,latency=50ms,streams=8,initcwnd=1", "nvlink"):
        on, off = NetworkModel(spec, 4), NetworkModel(spec + ",tcp=off", 4)
        for op in ("all_reduce", "broadcast", "all_gather", "all_to_all", "send", "barrier"):
            for n in (4096, 16 * MiB):
                assert on.cost(op, n).seconds == pytest.approx(off.cost(op, n).seconds, rel=1e-12), (spec, op, n)
    assert parse_spec("ib-hdr").inter_link().tcp is None
    link = parse_spec("ib-hdr,latency=50ms").inter_link()
    assert link.steps_seconds(2, 16 * MiB) == 2 * link.latency + 16 * MiB * link.beta


def test_intra_links_follow_their_own_protocol():
    spec = parse_spec("wan,topology=2x4,intra=nvlink")
    assert spec.inter_link().tcp == TcpConfig() and spec.intra_link().tcp is None
    assert parse_spec("wan,topology=2x4").intra_link().tcp == TcpConfig()


# ------------------------------------------------------------------ spec keys
@pytest.mark.parametrize("text", [
    "wan",
    "wan,tcp_rmem=64MiB,tcp_wmem=16MiB",
    "bandwidth=10gbit,latency=40ms,streams=16,initcwnd=32",
    "wan,rto_min=5ms,slow_start_after_idle=off,congestion=bbr",
    "wan,tcp=off",
    "10gbe,tcp_wmem=1000000",
    "wan,tcp_share=0.67",
])
def test_spec_round_trip_of_the_tcp_keys(text):
    spec = parse_spec(text)
    assert parse_spec(spec.to_string()) == spec
    assert NetworkModel(spec.to_string(), 2).cost("all_reduce", 1 << 20) == NetworkModel(spec, 2).cost(
        "all_reduce", 1 << 20)


def test_tcp_keys_parse_to_the_config():
    spec = parse_spec("wan,tcp_wmem=16MiB,streams=4,rto_min=10ms,congestion=BBR,slow_start_after_idle=0,initcwnd=32")
    assert spec.tcp == TcpConfig(wmem=16 * MiB, streams=4, rto_min=0.01, congestion="bbr",
                                 slow_start_after_idle=False, init_cwnd=32)
    assert parse_spec("wan").to_string() == "wan"  # defaults are not written
    assert parse_spec("wan,streams=2,streams=8").tcp.streams == 8  # later tokens win
    assert replace(parse_spec("wan"), tcp=TcpConfig(enabled=False)).inter_link().tcp is None


def test_the_buffer_share_scales_the_window_and_a_window_bound_transfer():
    default, kernel = parse_spec("wan").tcp, parse_spec("wan,tcp_share=0.5").tcp
    assert default.window == pytest.approx(0.63 * 4 * MiB) and kernel.window == 2 * MiB
    # 64 MiB at 1 Gbit/s over 40 ms: both windows are below the 5 MB pipe, so time goes as 1 / window
    spec = "bandwidth=1gbit,latency=20ms,tcp_share={}"
    slow, fast = (NetworkModel(spec.format(share), 2).cost("send", 64 * MiB, src=0, dst=1).seconds
                  for share in (0.5, 0.67))
    assert slow / fast == pytest.approx(0.67 / 0.5, rel=0.05)
    assert "window 2 MiB/stream = 0.5 x min(" in str(kernel)


def test_describe_shows_the_tcp_settings():
    text = str(parse_spec("wan").tcp)
    assert "window 2.52 MiB/stream" in text and "initcwnd 10" in text and "1 stream" in text and "RTO" in text
    assert "no restart after idle (bbr)" in str(TcpConfig(congestion="bbr"))
    assert str(TcpConfig(enabled=False)).startswith("off")


@pytest.mark.parametrize("text, message", [
    ("wan,tcp_rmem=1KiB", "tcp_rmem must be a buffer size from 4KiB to 2GiB"),
    ("wan,tcp_wmem=lots", "tcp_wmem: "),
    ("wan,tcp_wmem=4GiB", "tcp_wmem must be a buffer size from 4KiB to 2GiB"),
    ("wan,initcwnd=0", "initcwnd must be a whole number of segments from 1 to 1024"),
    ("wan,initcwnd=ten", "initcwnd must be a whole number, got 'ten'"),
    ("wan,streams=65", "streams must be a whole number of connections from 1 to 64"),
    ("wan,rto_min=0s", "rto_min must be a time from 1ms to 120s"),
    ("wan,rto_min=soon", "time"),
    ("wan,congestion=vegas", "unknown congestion control 'vegas'; valid: cubic, reno, bbr"),
    ("wan,tcp=maybe", "tcp must be on or off"),
    ("wan,slow_start_after_idle=2", "slow_start_after_idle must be on or off"),
    ("wan,tcp_share=0", "tcp_share must be a fraction of the socket buffer above 0 and at most 1"),
    ("wan,tcp_share=1.5", "tcp_share must be a fraction of the socket buffer above 0 and at most 1"),
    ("wan,tcp_share=half", "tcp_share must be a number such as 0.5, got 'half'"),
])
def test_bad_tcp_values_are_refused_with_what_would_be_right(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_spec(text)


def test_tcp_settings_on_a_non_tcp_link_are_refused():
    with pytest.raises(ValueError, match="apply to protocol='tcp' links, not 'rdma'"):
        Link(200e9, 2e-6, "rdma", 0.0, TcpConfig())


@pytest.mark.parametrize("kwargs, message", [
    (dict(nbytes=-1), "nbytes must be >= 0"),
    (dict(link_rate=0.0), "link_rate must be > 0"),
    (dict(rtt=0.0), "rtt must be a finite time > 0"),
    (dict(streams=0), "streams must be a whole number from 1 to 64"),
])
def test_tcp_transfer_seconds_refuses_bad_arguments(kwargs, message):
    args = dict(nbytes=1 * MiB, link_rate=RATE_10G, rtt=0.01) | kwargs
    streams = args.pop("streams", 1)
    with pytest.raises(ValueError, match=message):
        tcp_transfer_seconds(args["nbytes"], args["link_rate"], args["rtt"], streams=streams)
