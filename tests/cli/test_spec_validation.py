"""Network specs are checked at parse time against finite, sane ranges; each error names what is valid."""
import math

import pytest

from gradwire.net import NetSpec, Straggler, parse_spec
from gradwire.net.units import parse_bandwidth, parse_fraction, parse_size, parse_time

BIG = "1" * 120_000


def _short(value):
    """Test ids that do not print 120,000 digits, nor a function's address (the same on every collection)."""
    return getattr(value, "__name__", None) or str(value)[:40]


@pytest.mark.parametrize("text, message", [
    ("bandwidth=1e-30bit", r"bandwidth must be between 1 bit/s and 1 Pbit/s \(1e15 bits/s\), or inf"),
    ("bandwidth=2pbit", "unknown bandwidth unit"),
    ("bandwidth=1e16bit", "bandwidth must be between 1 bit/s and 1 Pbit/s"),
    ("intra_bandwidth=0.5bit", "intra_bandwidth must be between"),
    ("latency=1e300s", r"latency must be at most 3600 s \(an hour\)"),
    ("intra_latency=3601s", "intra_latency must be at most 3600 s"),
    ("jitter=2e9ms", "jitter must be at most 3600 s"),
    (",,,,", "empty token"),
    ("1gbe,", r"empty token \(number 2\)"),
    ("1gbe,,latency=1ms", r"empty token \(number 2\)"),
    (f"bandwidth={BIG}bit", r"is out of range: write a number between 1e-400 and 1e400"),
    (f"latency=0.{'0' * 500}1s", "is out of range"),
    ("bandwidth=1e400gbit", r"too large to represent \(above 1.8e308\)"),
    ("latency=1e-350s", r"too small to represent \(below 5e-324\)"),
    ("latency=1e99999999999999999999s", "not a number"),
    (f"seed={BIG}", r"seed must be an integer >= 0, got '1+'\.\.\. \(120000 characters\)"),
    (f"topology={BIG}x2", r"bad topology '1+'\.\.\. \(120002 characters\)"),
    ("straggler=1:link=1e-9", "straggler link factor must be between 0.001 and 1000"),
    ("straggler=1:compute=1e6", "straggler compute factor must be between 0.001 and 1000"),
], ids=_short)
def test_out_of_range_specs_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(text)


@pytest.mark.parametrize("text", ["bandwidth=1bit", "bandwidth=1000tbit", "bandwidth=inf", "latency=3600s",
                                  "jitter=0s", "1gbe,straggler=1:link=0.001:compute=1000", "  "])
def test_the_ends_of_each_range_are_accepted(text):
    parse_spec(text)


def test_direct_construction_has_the_same_ranges():
    with pytest.raises(ValueError, match="bandwidth must be between"):
        NetSpec(bandwidth=1e-30)
    with pytest.raises(ValueError, match="latency must be at most"):
        NetSpec(latency=1e300)
    with pytest.raises(ValueError, match="straggler link factor"):
        Straggler(1, link=1e-9)
    assert NetSpec(bandwidth=math.inf).bandwidth == math.inf


@pytest.mark.parametrize("parse, text", [
    (parse_bandwidth, f"{BIG}bit"), (parse_time, f"{BIG}s"), (parse_fraction, f"{BIG}%"), (parse_size, f"{BIG}K"),
    (parse_bandwidth, "1e9999999bit"), (parse_size, "1e9999999K"), (parse_fraction, "nan"), (parse_fraction, "inf"),
], ids=_short)
def test_units_refuse_numbers_no_float_holds_with_a_short_message(parse, text):
    """Decimal reads these happily; unchecked, they became inf ("unlimited"), 0, or decimal.Overflow."""
    with pytest.raises(ValueError) as info:
        parse(text)
    assert len(str(info.value)) < 200
