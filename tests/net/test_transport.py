"""What gloo and NCCL open on a long TCP link (gradwire.net.transport)."""
from __future__ import annotations

import pytest

from gradwire.net import NetworkModel, parse_spec
from gradwire.net.link import Link
from gradwire.net.tcp import DEFAULT_WINDOW, TcpConfig
from gradwire.net.transport import GLOO_SEGMENT, TRANSPORTS, credit_window, resolve

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


def test_nccl_keeps_the_alpha_beta_price_while_its_channels_fill_the_pipe():
    # 2 Gbit/s x 10 ms = 2.5 MB: one 2 MiB window falls short, two channels do not
    spec = "bandwidth=2gbit,latency=5ms,algorithm=ring"
    nccl, plain = (NetworkModel(f"{spec},{k}", 8).cost("all_reduce", 256 * MiB).seconds
                   for k in ("transport=nccl", "tcp=off"))
    assert nccl == pytest.approx(plain, rel=1e-9)
    one = NetworkModel(f"{spec},transport=nccl,nccl_channels=1", 8).cost("all_reduce", 256 * MiB).seconds
    assert one > 1.1 * plain


def test_nccl_on_a_long_fat_link_runs_at_its_connections_windows():
    spec = "bandwidth=10gbit,latency=20ms,algorithm=ring,transport=nccl"
    n, p = 256 * MiB, 4
    seconds = NetworkModel(spec, p).cost("all_reduce", n).seconds
    volume = 2 * (p - 1) / p * n
    assert volume / seconds == pytest.approx(2 * DEFAULT_WINDOW / 0.04, rel=0.05)  # 2 channels x 2 MiB per RTT
    aws = NetworkModel(spec + ",streams=16", p).cost("all_reduce", n).seconds  # AWS ENA: 16 sockets a channel
    assert aws < seconds / 4


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
    for spec in ("1gbe", "10gbe"):
        on, off = NetworkModel(f"{spec},transport={transport}", 4), NetworkModel(spec + ",tcp=off", 4)
        for op in ("all_reduce", "broadcast", "all_gather", "send"):
            for n in (4096, 16 * MiB):
                assert on.cost(op, n).seconds == pytest.approx(off.cost(op, n).seconds, rel=1e-9), (spec, op, n)


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
