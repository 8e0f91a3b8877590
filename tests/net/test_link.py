import math

import pytest

from gradwire.net import NetworkModel, parse_spec
from gradwire.net.link import FRAMINGS, MIN_RTT, Link, tcp_framing


def test_tcp_framing():
    link = Link(1e9, 50e-6, "tcp")
    assert link.payload_rate == pytest.approx(1e9 / 8 * 1448 / 1514)
    assert link.beta == pytest.approx(8 / 1e9 * 1514 / 1448)


def test_jumbo_frames_carry_mtu_minus_52_bytes_per_mtu_plus_14():
    assert tcp_framing(1500) == FRAMINGS["tcp"]
    jumbo = Link(1e9, 10e-3, "tcp", mtu=9001)
    assert jumbo.payload_rate == pytest.approx(1e9 / 8 * 8949 / 9015)
    assert jumbo.wire_bytes(8949) == 9015
    # 64 MiB at netem's 1 Gbit/s: 541 ms measured on AWS (MTU 9001), where MTU 1500 framing says 561
    send = NetworkModel("bandwidth=1gbit,latency=50us,mtu=9001", 2).cost("send", 64 << 20, src=0, dst=1)
    assert send.seconds == pytest.approx(0.541, rel=0.002)
    assert parse_spec("100gbe,mtu=9000").to_string() == "100gbe,mtu=9000"


@pytest.mark.parametrize("spec, match", [
    ("mtu=jumbo", "mtu must be a whole number of bytes like 1500 or 9000, got 'jumbo'"),
    ("mtu=100", "mtu must be a whole number of bytes from 576 to 65535"),
    ("bandwidth=1gbit,protocol=rdma,mtu=9000", "mtu sets the framing of tcp links, and this spec has none"),
])
def test_bad_mtus_say_what_would_be_right(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_spec(spec)


def test_rdma_and_none_framing():
    assert Link(200e9, 2e-6, "rdma").payload_rate == pytest.approx(25e9 * 4096 / 4154)
    assert Link(8e9, 0.0, "none").payload_rate == 1e9
    assert FRAMINGS["none"].efficiency == 1.0


def test_mathis_caps_tcp_under_loss():
    q, latency = 1e-4, 1e-3
    link = Link(10e9, latency, "tcp", loss=q)
    mathis = 1448 / (2 * latency) * math.sqrt(1.5) / math.sqrt(q)   # ~88.7 MB/s
    assert mathis < link.framed_rate
    assert link.payload_rate == pytest.approx(mathis)


def test_link_rate_caps_mathis():
    link = Link(1e6, 1e-3, "tcp", loss=1e-6)   # Mathis would allow ~8.9 GB/s
    assert link.payload_rate == link.framed_rate


def test_mathis_uses_a_floor_rtt_at_zero_latency():
    link = Link(100e9, 0.0, "tcp", loss=1e-2)
    assert link.rtt == MIN_RTT
    assert link.payload_rate == pytest.approx(1448 / MIN_RTT * math.sqrt(1.5) / 0.1)


def test_rdma_and_none_resend_lost_packets():
    assert Link(8e9, 0.0, "none", loss=0.1).payload_rate == pytest.approx(0.9e9)
    assert Link(200e9, 2e-6, "rdma", loss=0.01).payload_rate == pytest.approx(25e9 * 4096 / 4154 * 0.99)


def test_unlimited_link_has_zero_beta():
    assert Link(math.inf, 0.0).beta == 0.0


def test_wire_bytes():
    tcp = Link(1e9, 0.0, "tcp")
    assert tcp.wire_bytes(0) == 0
    assert tcp.wire_bytes(1) == 1 + 66
    assert tcp.wire_bytes(1448) == 1514
    assert tcp.wire_bytes(1449) == 1449 + 2 * 66
    assert tcp.wire_bytes(16 << 20) == (16 << 20) + math.ceil((16 << 20) / 1448) * 66
    assert Link(1e9, 0.0, "rdma").wire_bytes(8192) == 8192 + 2 * 58
    assert Link(1e9, 0.0, "none").wire_bytes(1000) == 1000
    assert Link(1e9, 0.0, "none", loss=0.5).wire_bytes(1000) == 2000   # expected resends


def test_scaled_link():
    assert Link(1e9, 1e-6).scaled(0.5).bandwidth == 0.5e9


@pytest.mark.parametrize("kwargs, message", [
    ({"bandwidth": 0, "latency": 0}, "bandwidth"), ({"bandwidth": 1, "latency": -1}, "latency"),
    ({"bandwidth": 1, "latency": 0, "loss": 1}, "loss"), ({"bandwidth": 1, "latency": 0, "protocol": "udp"}, "protocol"),
])
def test_link_checks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Link(**kwargs)
