"""What gloo and NCCL open on a long TCP link (gradwire.net.transport)."""
from __future__ import annotations

import pytest

from gradwire.net import NetworkModel, parse_spec
from gradwire.net.link import Link
from gradwire.net.tcp import TcpConfig
from gradwire.net.transport import GLOO_SEGMENT, TRANSPORTS, credit_window, pipeline_stall, resolve

MiB = 1 << 20


def test_the_credit_window_is_two_segments_per_notice_round_trip():
    rate, rtt = 1.2e9, 0.005
    w = credit_window(GLOO_SEGMENT, rate, rtt)
    assert w / rtt == pytest.approx(2 * GLOO_SEGMENT / (rtt + GLOO_SEGMENT / rate))
    # it holds a connection below the link only when the pipe is longer than one segment
    assert credit_window(GLOO_SEGMENT, 119.6e6, 1e-4) > 119.6e6 * 1e-4  # 1 GbE LAN: not binding
    assert credit_window(GLOO_SEGMENT, rate, rtt) < rate * rtt  # 10 Gbit/s, 5 ms: binding


def test_auto_prices_gloo_without_a_backend_and_the_inner_backend_with_one():
    assert resolve("auto") is TRANSPORTS["gloo"] and resolve("auto", "nccl") is TRANSPORTS["nccl"]
    model = NetworkModel("bandwidth=10gbit,latency=5ms", 4)
    assert model.for_inner("gloo") is model
    assert model.for_inner("nccl").spec.tcp.transport == "nccl"
    pinned = NetworkModel("bandwidth=10gbit,latency=5ms,transport=gloo", 4)
    assert pinned.for_inner("nccl") is pinned  # a spec that names its transport keeps it


def test_nccl_keeps_the_alpha_beta_bandwidth_while_its_channels_fill_the_pipe():
    # 2 Gbit/s x 10 ms = 2.5 MB at the kernel's starting share: one 2 MiB window falls short, two channels do not
    spec, p = "bandwidth=2gbit,latency=5ms,algorithm=ring,tcp_share=0.5", 8
    nccl, plain = (NetworkModel(f"{spec},{k}", p).cost("all_reduce", 256 * MiB).seconds
                   for k in ("transport=nccl", "tcp=off"))
    # a channel's 2 MiB chunk outlasts the latency (8.4 ms at 1 Gbit/s a channel): the ring never waits at a step
    # boundary, so the 2(p - 1) - 1 latencies of alpha-beta's fill are not paid
    assert nccl == pytest.approx(plain - (2 * (p - 1) - 1) * 5e-3, rel=1e-9)
    one = NetworkModel(f"{spec},transport=nccl,nccl_channels=1", p).cost("all_reduce", 256 * MiB).seconds
    assert one > 1.1 * plain


def test_a_small_nccl_collective_waits_a_latency_at_every_step():
    for spec in ("bandwidth=2gbit,latency=5ms,algorithm=ring", "10gbe,algorithm=ring"):
        nccl, plain = (NetworkModel(f"{spec},{k}", 8).cost("all_reduce", 64 << 10).seconds
                       for k in ("transport=nccl", "tcp=off"))
        assert nccl == pytest.approx(plain, rel=1e-9)


def test_the_ring_waits_where_a_latency_outlasts_a_chunk():
    # 1 MiB of a 2 MiB chunk overlaps the wait: 1.68 ms at 625 MB/s a channel
    assert pipeline_stall(8 * MiB, 625e6, 1e-3) == 0.0
    assert pipeline_stall(8 * MiB, 625e6, 20e-3) == pytest.approx(2 * (20e-3 - MiB / 625e6))  # 2 loops a channel
    assert pipeline_stall(256 << 10, 625e6, 20e-3) == 20e-3  # a chunk within one slice: the whole latency
    assert pipeline_stall(0, 625e6, 20e-3) == 20e-3


def test_nccl_on_a_long_fat_link_runs_at_its_connections_windows():
    # at the kernel's starting share a channel's window (2 MiB) carries the rest of a 2 MiB chunk (1 MiB) in 20 ms,
    # no less than the latency: the windows alone set the rate
    spec = "bandwidth=10gbit,latency=20ms,algorithm=ring,transport=nccl,tcp_share=0.5"
    n, p = 256 * MiB, 4
    seconds = NetworkModel(spec, p).cost("all_reduce", n).seconds
    volume = 2 * (p - 1) / p * n
    assert volume / seconds == pytest.approx(2 * 2 * MiB / 0.04, rel=0.05)  # 2 channels x 2 MiB per RTT
    aws = NetworkModel(spec + ",streams=16", p).cost("all_reduce", n).seconds  # AWS ENA: 16 sockets a channel
    assert aws < seconds / 2
    # 16 sockets lift the windows off the link's rate, and then the ring waits: 20 ms outlasts the 1.7 ms the rest
    # of a channel's 2 MiB chunk takes, at each of 5 step boundaries in each of a channel's 16 loops
    rate = parse_spec(spec).inter_link().payload_rate
    assert aws == pytest.approx(0.02 + volume / rate + 5 * 16 * (0.02 - MiB / (rate / 2)), rel=0.02)


def test_gloo_rings_are_held_to_two_segments_per_round_trip_on_a_long_fat_link():
    spec = "bandwidth=10gbit,latency=2.5ms,algorithm=ring"
    n, p = 256 * MiB, 2
    gloo = NetworkModel(spec + ",transport=gloo", p).cost("all_reduce", n).seconds
    link = parse_spec(spec).inter_link()
    rate = credit_window(GLOO_SEGMENT, link.payload_rate, link.rtt) / link.rtt
    assert n / gloo == pytest.approx(rate, rel=0.05)
    nccl = NetworkModel(spec + ",transport=nccl", p).cost("all_reduce", n).seconds
    assert nccl < gloo / 1.5


@pytest.mark.parametrize("transport", ["gloo", "nccl"])
def test_lan_presets_cost_what_alpha_beta_says_on_either_transport(transport):
    """Windows never bind on a LAN; NCCL's ring may skip its fill's latencies (tens of microseconds)."""
    for spec in ("1gbe", "10gbe"):
        on, off = NetworkModel(f"{spec},transport={transport}", 4), NetworkModel(spec + ",tcp=off", 4)
        for op in ("all_reduce", "broadcast", "all_gather", "send"):
            for n in (4096, 16 * MiB):
                priced, plain = on.cost(op, n).seconds, off.cost(op, n).seconds
                if transport == "gloo":
                    assert priced == pytest.approx(plain, rel=1e-9), (spec, op, n)
                else:  # at most the ring's fill less: a large collective does not wait at its step boundaries
                    fill = 2 * 4 * parse_spec(spec).latency
                    assert plain - fill <= priced <= plain * (1 + 1e-9), (spec, op, n)


def test_transport_keys_round_trip_and_bad_values_say_what_would_be_right():
    spec = parse_spec("wan,transport=NCCL,nccl_channels=4,streams=16")
    assert spec.tcp == TcpConfig(transport="nccl", channels=4, streams=16)
    assert parse_spec(spec.to_string()) == spec
    assert spec.tcp.connections(TRANSPORTS["nccl"]) == 64 and spec.tcp.connections(TRANSPORTS["gloo"]) == 16
    assert "4 channels x 16 sockets" in str(spec.tcp) and "transport nccl" in str(spec.tcp)
    with pytest.raises(ValueError, match="unknown transport 'mpi'; valid: auto, gloo, nccl"):
        parse_spec("wan,transport=mpi")
    with pytest.raises(ValueError, match="nccl_channels must be a whole number of channels from 1 to 64"):
        parse_spec("wan,nccl_channels=0")
    assert Link(1e9, 0.01, "tcp", 0.0, TcpConfig(transport="nccl")).tcp == TcpConfig(transport="nccl")


# NCCL all_reduce on 16 AWS nodes under tc netem (delay each way, rate): published in
# https://github.com/BinhangYuan/tc_cluster_setting results/allreduce.md (benchmarks/long_links.py has all 18)
@pytest.mark.parametrize("delay_ms, gbit, mib, measured", [
    (1, 5, 128, 0.410), (5, 2, 128, 1.038), (10, 1, 128, 2.076),
    (1, 5, 256, 0.817), (5, 2, 256, 2.057), (10, 1, 256, 4.114),
])
def test_nccl_all_reduce_on_a_published_long_link(delay_ms, gbit, mib, measured):
    spec = f"bandwidth={gbit}gbit,latency={delay_ms}ms,mtu=9001,algorithm=ring,transport=nccl,streams=16"
    seconds = NetworkModel(spec, 16).cost("all_reduce", mib * MiB).seconds
    assert seconds == pytest.approx(measured, rel=0.05)
    # a latency per step (the ring's fill paid at every boundary) would read up to 12% slow here
    assert NetworkModel(spec + ",tcp=off", 16).cost("all_reduce", mib * MiB).seconds > seconds
