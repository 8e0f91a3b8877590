"""Display forms written out by hand, error texts that name what was read, and the edges of ranges."""
from __future__ import annotations

import math

import pytest

from gradwire.net import describe
from gradwire.net.spec import parse_spec, resolve_topology
from gradwire.net.units import _shown, human_bandwidth, human_size, human_time, parse_size


@pytest.mark.parametrize("bits, text", [
    (math.inf, "unlimited"), (2.4e12, "2.4 Tbit/s (300 GB/s)"), (1e12, "1 Tbit/s (125 GB/s)"),
    (10e9, "10 Gbit/s (1.25 GB/s)"), (1e9, "1 Gbit/s (0.125 GB/s)"), (999e6, "999 Mbit/s (0.124875 GB/s)"),
    (1e6, "1 Mbit/s (0.000125 GB/s)"), (1500.0, "1.5 kbit/s (1.875e-07 GB/s)"), (1e3, "1 kbit/s (1.25e-07 GB/s)"),
    (999.0, "999 bit/s (1.24875e-07 GB/s)"), (0.5, "0.5 bit/s (6.25e-11 GB/s)"),
])
def test_human_bandwidth(bits: float, text: str) -> None:
    assert human_bandwidth(bits) == text


@pytest.mark.parametrize("seconds, text", [
    (0.0, "0 s"), (2.5, "2.5 s"), (1.0, "1 s"), (0.1403353, "140.3 ms"), (1e-3, "1 ms"), (0.0009995, "999.5 us"),
    (50e-6, "50 us"), (1e-6, "1 us"), (999e-9, "999 ns"), (1.5e-9, "1.5 ns"), (123456.0, "1.235e+05 s"),
])
def test_human_time(seconds: float, text: str) -> None:
    assert human_time(seconds) == text


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (1 << 20, "1 MiB"), (16 << 20, "16 MiB"),
    ((1 << 20) - 1, "1024 KiB"), (1 << 30, "1 GiB"), (3 << 29, "1.5 GiB"), (5 << 40, "5120 GiB"),
])
def test_human_size(nbytes: int, text: str) -> None:
    assert human_size(nbytes) == text


def test_shown_cuts_long_inputs_at_the_limit() -> None:
    assert _shown("a" * 40) == repr("a" * 40)
    assert _shown("a" * 41) == f"{'a' * 40!r}... (41 characters)"
    assert _shown("abcdef", limit=6) == "'abcdef'" and _shown("abcdefg", limit=6) == "'abcdef'... (7 characters)"


def test_size_errors_name_what_was_read() -> None:
    with pytest.raises(ValueError) as info:
        parse_size("lots")
    assert str(info.value).startswith("cannot read size 'lots': expected a number with a unit (B, K/KB")
    assert parse_size("7") == 7 and parse_size("2KB") == 2000 and parse_size("1.5KiB") == 1536


def test_topology_auto_with_one_rank_per_node() -> None:
    auto = parse_spec("bandwidth=1gbit,topology=auto")
    env = {"LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "4", "RANK": "2", "GROUP_RANK": "2", "LOCAL_RANK": "0"}
    assert resolve_topology(auto, 4, env).topology == (4, 1)
    assert resolve_topology(auto, 1, {"LOCAL_WORLD_SIZE": "1"}).topology == (1, 1)
    with pytest.raises(ValueError, match="do not split"):
        resolve_topology(auto, 4, {"LOCAL_WORLD_SIZE": "0"})


def test_describe_on_loopback_shows_unbounded_bandwidth() -> None:
    rows = describe("loopback", world_sizes=(2,), sizes=(4096,))
    for r in rows:
        assert r.seconds == 0
        assert (r.algbw, r.busbw) == ((0.0, 0.0) if r.op == "barrier" else (math.inf, math.inf)), r.op


def test_describe_sends_from_the_first_rank_to_the_last() -> None:
    # rank 1 straggles at half speed; a send from rank 0 to rank 3 does not cross its link
    rows = describe("bandwidth=8gbit,latency=10us,protocol=none,straggler=1:link=0.5", world_sizes=(4,),
                    sizes=(1 << 20,), ops=("send", "all_reduce"))
    send = next(r for r in rows if r.op == "send")
    assert send.seconds == pytest.approx(10e-6 + (1 << 20) * 1e-9, rel=1e-12)
    assert send.busbw == pytest.approx(send.algbw) and send.algorithm == "direct"
    slowed = next(r for r in rows if r.op == "all_reduce")  # the whole group runs at the straggler's pace
    assert slowed.seconds == pytest.approx(4 * 10e-6 + 1.5 * (1 << 20) * 2e-9, rel=1e-12)  # Rabenseifner
