import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradwire.net.units import (
    format_bandwidth, format_fraction, format_time, parse_bandwidth, parse_fraction, parse_size, parse_time,
)


@pytest.mark.parametrize("text, bits", [
    ("1gbit", 1e9), ("100mbit", 1e8), ("10g", 1e10), ("100Mbps", 1e8), ("5kbit", 5e3), ("2tbit", 2e12),
    ("1Gbit/s", 1e9), ("10Gb", 1e10), ("12.5GB/s", 1e11), ("300GB/s", 2.4e12), ("500MB/s", 4e9), ("1KB/s", 8e3),
    ("1GiB/s", 8 * 2**30), ("inf", math.inf),
])
def test_parse_bandwidth(text, bits):
    assert parse_bandwidth(text) == bits


@pytest.mark.parametrize("text, match", [("1000", "no unit"), ("1gallon", "unknown bandwidth unit"), ("fast", "cannot read")])
def test_parse_bandwidth_errors_list_units(text, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_bandwidth(text)
    assert "gbit" in str(info.value)


@pytest.mark.parametrize("text, seconds", [("50us", 50e-6), ("200us", 0.0002), ("3ns", 3e-9), ("20ms", 0.02), ("1s", 1.0), ("1.5MS", 1.5e-3)])
def test_parse_time(text, seconds):
    assert parse_time(text) == seconds


def test_bare_number_is_not_a_time():
    with pytest.raises(ValueError, match="no unit.*ns, us, ms, s"):
        parse_time("5")


def test_unknown_time_unit():
    with pytest.raises(ValueError, match="unknown time unit 'h'"):
        parse_time("1h")


def test_parse_fraction():
    assert parse_fraction("0.01%") == 0.0001
    assert parse_fraction("0.0001") == 0.0001
    with pytest.raises(ValueError, match="percentage"):
        parse_fraction("lots")


@pytest.mark.parametrize("text, n", [("4096", 4096), ("4KiB", 4096), ("1M", 10**6), ("16MiB", 16 << 20), ("1GB", 10**9)])
def test_parse_size(text, n):
    assert parse_size(text) == n


def test_parse_size_errors():
    with pytest.raises(ValueError, match="unknown size unit"):
        parse_size("3furlongs")
    with pytest.raises(ValueError, match="whole number"):
        parse_size("1.5B")


@given(st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_bandwidth_format_round_trips(bits):
    assert parse_bandwidth(format_bandwidth(bits)) == bits


@given(st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False))
def test_time_format_round_trips(seconds):
    assert parse_time(format_time(seconds)) == seconds


@given(st.floats(min_value=0, max_value=0.999999, allow_nan=False))
def test_fraction_format_round_trips(q):
    assert parse_fraction(format_fraction(q)) == q
