"""Display forms written out by hand, error texts that name what was read, and the edges of ranges."""
from __future__ import annotations

import math

import pytest

from gradwire.net import NetworkModel, describe
from gradwire.net.spec import parse_spec, resolve_topology
from gradwire.net.spec import NetSpec, Straggler
from gradwire.net.units import (
    _shown, format_bandwidth, format_fraction, format_time, human_bandwidth, human_size, human_time, parse_bandwidth,
    parse_fraction, parse_size, parse_time,
)


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


@pytest.mark.parametrize("bits, text", [
    (math.inf, "inf"), (1e12, "1tbit"), (1e9, "1gbit"), (999e6, "999mbit"), (1e6, "1mbit"), (1.5e3, "1.5kbit"),
    (1e3, "1kbit"), (999.0, "999bit"), (0.5, "0.5bit"),
])
def test_format_bandwidth_takes_the_largest_prefix_that_keeps_a_number_of_at_least_one(bits, text) -> None:
    assert format_bandwidth(bits) == text and parse_bandwidth(text) == bits


def test_format_fraction_and_time_are_plain_decimals() -> None:
    assert format_fraction(1e-9) == "0.0000001%" and format_fraction(0.0001) == "0.01%" and format_fraction(0) == "0%"
    assert format_time(1e-3) == "1ms" and format_time(0.0002) == "200us" and format_time(0) == "0s"
    assert format_time(5e-10) == "0.5ns" and format_time(1.0) == "1s" and format_time(3e-6) == "3us"


@pytest.mark.parametrize("text, bits", [("100B/s", 800), ("1B", 8), ("2KiB/s", 16384), ("3b", 3), ("1kbps", 1000)])
def test_byte_and_bit_units_without_and_with_prefixes(text: str, bits: float) -> None:
    assert parse_bandwidth(text) == bits


def test_to_string_writes_only_what_differs_from_the_base() -> None:
    assert NetSpec().to_string() == "custom"
    assert parse_spec("bandwidth=1gbit").to_string() == "bandwidth=1gbit"
    assert parse_spec("1gbe").to_string() == "1gbe"
    assert parse_spec("1gbe,latency=1ms").to_string() == "1gbe,latency=1ms"
    assert parse_spec("custom,jitter=5us").to_string() == "jitter=5us"


def test_unlimited_bandwidth_words_and_error_texts_name_the_input() -> None:
    assert parse_bandwidth("inf") == parse_bandwidth(" Infinite ") == parse_bandwidth("UNLIMITED") == math.inf
    with pytest.raises(ValueError) as info:
        parse_bandwidth("fast")
    assert str(info.value).startswith("cannot read bandwidth 'fast': expected a number with a unit (bits/s: bit,")
    with pytest.raises(ValueError) as info:
        parse_bandwidth("1gallon")
    assert str(info.value).startswith("unknown bandwidth unit 'gallon' in '1gallon'; valid units: bits/s")
    with pytest.raises(ValueError) as info:
        parse_bandwidth("1e400gbit")
    assert str(info.value) == "bandwidth '1e400gbit' is too large to represent (above 1.8e308)"


def test_spec_texts_and_edges_of_the_grammar() -> None:
    with pytest.raises(ValueError, match=r"out of range"):
        parse_fraction("1e500%")
    with pytest.raises(ValueError, match=r"^cannot read loss 'x1': expected a percentage"):
        parse_fraction("x1")
    assert parse_spec("topology=none").topology is None and parse_spec("topology=FLAT").topology is None
    with pytest.raises(ValueError, match=r"empty token \(number 2\)"):
        parse_spec("1gbe,,latency=1ms")
    with pytest.raises(ValueError, match=r"^unknown preset name 'bogus'"):
        NetSpec(name="bogus")
    for rank in (True, -1, 1.0):
        with pytest.raises(ValueError, match="straggler rank must be an int >= 0"):
            Straggler(rank)
    with pytest.raises(ValueError, match="is not a number"):
        Straggler.parse("1:link=0.5=3")
    assert Straggler.parse("2:compute=3:link=0.25") == Straggler(2, 0.25, 3.0)


def test_one_rank_groups_and_one_byte_messages() -> None:
    model = NetworkModel("1gbe", 4)
    assert model.cost("send", 1 << 20, ranks=[2]).seconds == 0.0  # a group of one crosses no link
    assert NetworkModel("1gbe", 1).cost("send", 1 << 20).seconds == 0.0
    tiny = NetworkModel("1gbe", 2).cost("all_gather", 1)  # half a byte to send: one byte, one segment
    assert (tiny.sent_bytes, tiny.wire_bytes) == (1, 1 + 66)


def test_a_jitter_of_one_second_is_drawn_too() -> None:
    base = NetworkModel("1gbe,algorithm=ring", 2).cost("all_reduce", 1 << 20).seconds
    jittery = NetworkModel("1gbe,algorithm=ring,jitter=1s", 2).cost("all_reduce", 1 << 20, seq=1).seconds
    assert 0 < jittery - base <= 2.0  # 2 steps of uniform [0, 1 s]


def test_time_errors_name_what_was_read() -> None:
    with pytest.raises(ValueError) as info:
        parse_time("soon")
    assert str(info.value) == "cannot read time 'soon': expected a number with a unit (ns, us, ms, s (a unit is " \
                              "required, e.g. '50us'))"
