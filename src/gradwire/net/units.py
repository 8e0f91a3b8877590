"""Parse and format the quantities of a network spec: rates, times, fractions, sizes.

Parsing goes through :class:`decimal.Decimal`, so ``"200us"`` becomes the float
nearest to 0.0002 (not ``200 * 1e-6``), and every ``format_*`` function writes a
string that parses back to exactly the same float. That is what lets
``NetSpec.to_string()`` round-trip.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation, localcontext

_NUMBER = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")

#: time units, seconds per unit
TIME_UNITS: dict[str, Decimal] = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
}

_SI = {"": Decimal(1), "k": Decimal("1e3"), "m": Decimal("1e6"), "g": Decimal("1e9"), "t": Decimal("1e12")}
_BINARY = {"ki": Decimal(2**10), "mi": Decimal(2**20), "gi": Decimal(2**30), "ti": Decimal(2**40)}

BANDWIDTH_UNITS_HELP = (
    "bits/s: bit, kbit, mbit, gbit, tbit (also k/m/g/t alone, Gb, or kbps/Mbps/Gbps); "
    "bytes/s: B/s, KB/s, MB/s, GB/s, TB/s (also KiB/s, MiB/s, GiB/s); or 'inf'"
)
TIME_UNITS_HELP = "ns, us, ms, s (a unit is required, e.g. '50us')"
SIZE_UNITS_HELP = "B, K/KB, M/MB, G/GB (decimal) or KiB, MiB, GiB (binary); a bare number is bytes"


#: decimal exponents a number may have: every float (5e-324 to 1.8e308) fits, and Decimal's
#: arithmetic stays far from its own limits
_EXPONENTS = range(-400, 401)


def _decimal(number: str, text: str, what: str) -> Decimal:
    """``number`` as a Decimal; ValueError if its exponent is outside :data:`_EXPONENTS`.

    Trap: Decimal reads ``1e99999999999999999999`` or 100,000 digits happily,
    and the arithmetic that follows then raises decimal.Overflow (not a
    ValueError) or silently rounds to zero.
    """
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"cannot read {what} {_shown(text)}: not a number") from None
    if not value.is_finite() or (value and value.adjusted() not in _EXPONENTS):
        raise ValueError(f"{what} {_shown(text)} is out of range: write a number between 1e-400 and 1e400")
    return value


def _split(text: str, what: str, units_help: str) -> tuple[Decimal, str]:
    match = _NUMBER.match(text)
    if not match:
        raise ValueError(f"cannot read {what} {_shown(text)}: expected a number with a unit ({units_help})")
    return _decimal(match.group(1), text, what), match.group(2)


def _shown(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to ``limit`` characters: an error must not echo 100,000 digits."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def _to_float(value: Decimal, text: str, what: str) -> float:
    """``value`` as a float; ValueError if it is finite but no float can hold it.

    Trap: ``float(Decimal)`` turns a number beyond 1.8e308 into ``inf`` and one
    below 5e-324 into ``0.0`` without a word, so a 400-digit bandwidth would
    silently mean "unlimited".
    """
    out = float(value)
    if math.isinf(out) and value.is_finite():
        raise ValueError(f"{what} {_shown(text)} is too large to represent (above 1.8e308)")
    if out == 0 and value != 0:
        raise ValueError(f"{what} {_shown(text)} is too small to represent (below 5e-324)")
    return out


def _shortest(value: float, scale: Decimal) -> str:
    """``value / scale`` as the shortest decimal string (exact: dividing by 10**k is exact)."""
    with localcontext() as ctx:
        ctx.prec = 60
        text = format((Decimal(repr(value)) / scale).normalize(), "f")
    return text


# --------------------------------------------------------------------- bandwidth
def parse_bandwidth(text: str) -> float:
    """Parse a link rate and return bits per second.

    Lower-case ``b``/``bit`` means bits, upper-case ``B`` means bytes:
    ``1gbit``, ``10g``, ``100Mbps`` are bits/s; ``12.5GB/s``, ``500MB/s`` are bytes/s.
    Prefixes are decimal (k = 1e3) unless binary (``GiB/s``). ``inf`` means unlimited.
    """
    if text.strip().lower() in ("inf", "infinite", "unlimited"):
        return math.inf
    number, unit = _split(text, "bandwidth", BANDWIDTH_UNITS_HELP)
    bits = _bandwidth_unit(unit, text)
    return _to_float(number * bits, text, "bandwidth")


def _bandwidth_unit(unit: str, text: str) -> Decimal:
    """Bits/s per unit of ``unit``; ValueError listing the valid units otherwise."""
    if not unit:
        raise ValueError(f"bandwidth {text!r} has no unit; valid units: {BANDWIDTH_UNITS_HELP}")
    byte_match = re.fullmatch(r"([kKmMgGtT]i?)?B(/s|ps)?", unit)
    if byte_match:
        prefix = (byte_match.group(1) or "").lower()
        table = _BINARY if prefix.endswith("i") else _SI
        return table[prefix] * 8
    bit_match = re.fullmatch(r"([kmgt]?)(b|bit|bits|bit/s|bps|b/s)?", unit.lower())
    if bit_match and (bit_match.group(1) or bit_match.group(2)):
        return _SI[bit_match.group(1)]
    raise ValueError(f"unknown bandwidth unit {unit!r} in {text!r}; valid units: {BANDWIDTH_UNITS_HELP}")


def format_bandwidth(bits_per_s: float) -> str:
    """Write a rate in bits/s with the largest prefix that keeps the number >= 1."""
    if math.isinf(bits_per_s):
        return "inf"
    for prefix in ("t", "g", "m", "k"):
        if bits_per_s >= _SI[prefix]:
            return f"{_shortest(bits_per_s, _SI[prefix])}{prefix}bit"
    return f"{_shortest(bits_per_s, Decimal(1))}bit"


def human_bandwidth(bits_per_s: float) -> str:
    """A short display form, e.g. ``10 Gbit/s (1.25 GB/s)``; not meant to be parsed."""
    if math.isinf(bits_per_s):
        return "unlimited"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0)):
        if bits_per_s >= scale or not prefix:
            return f"{bits_per_s / scale:g} {prefix}bit/s ({bits_per_s / 8e9:g} GB/s)"
    raise AssertionError("unreachable")


# --------------------------------------------------------------------- time
def parse_time(text: str) -> float:
    """Parse a duration with a unit (ns, us, ms, s) and return seconds.

    A bare number is rejected: ``latency=5`` could mean 5 s or 5 ms, and
    guessing wrong silently changes every result by 1000x.
    """
    number, unit = _split(text, "time", TIME_UNITS_HELP)
    if not unit:
        raise ValueError(f"time {text!r} has no unit; valid units: {TIME_UNITS_HELP}")
    scale = TIME_UNITS.get(unit.lower())
    if scale is None:
        raise ValueError(f"unknown time unit {unit!r} in {text!r}; valid units: {TIME_UNITS_HELP}")
    return _to_float(number * scale, text, "time")


def format_time(seconds: float) -> str:
    """Write seconds with the largest unit that keeps the number >= 1 (``0s`` for zero)."""
    if seconds == 0:
        return "0s"
    for unit in ("s", "ms", "us"):
        if seconds >= TIME_UNITS[unit]:
            return f"{_shortest(seconds, TIME_UNITS[unit])}{unit}"
    return f"{_shortest(seconds, TIME_UNITS['ns'])}ns"


def human_time(seconds: float) -> str:
    """A short display form with 4 significant digits, e.g. ``140.3 ms``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return "0 s" if seconds == 0 else f"{seconds / 1e-9:.4g} ns"


# --------------------------------------------------------------------- fraction
def parse_fraction(text: str, what: str = "loss") -> float:
    """Parse ``0.01%`` (percent) or ``0.0001`` (a fraction) and return the fraction."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = _decimal(raw[:-1] if percent else raw, text, what)
    except ValueError as exc:
        if "out of range" in str(exc):
            raise
        raise ValueError(f"cannot read {what} {_shown(text)}: expected a percentage like '0.01%' "
                         "or a fraction like '0.0001'") from None
    return _to_float(value / 100 if percent else value, text, what)


def format_fraction(value: float) -> str:
    """Write a fraction as a percentage, ``0.0001`` -> ``0.01%``."""
    with localcontext() as ctx:
        ctx.prec = 60
        return format((Decimal(repr(value)) * 100).normalize(), "f") + "%"


# --------------------------------------------------------------------- sizes
def parse_size(text: str) -> int:
    """Parse a byte count: ``4096``, ``4KiB``, ``1M`` (1e6), ``16MiB``, ``1GB``."""
    number, unit = _split(text, "size", SIZE_UNITS_HELP)
    key = unit.lower().removesuffix("b")
    if key in _SI:
        scale = _SI[key]
    elif key in _BINARY:
        scale = _BINARY[key]
    else:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}; valid units: {SIZE_UNITS_HELP}")
    value = number * scale
    if value != value.to_integral_value():
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


_NCCL_SIZE = re.compile(r"^\s*(\d+)\s*([kmgKMG]?)\s*$")


def parse_buffer_size(text: str) -> int:
    """Read a buffer size the nccl-tests way: ``8``, ``64K``, ``16M``, ``1G`` (powers of 1024).

    Anything else goes to :func:`parse_size`, so ``16MiB`` (binary) and
    ``16MB`` (decimal) are accepted too.
    """
    match = _NCCL_SIZE.match(str(text))
    if match:
        shift = {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2).lower()]
        return int(match.group(1)) << shift
    return parse_size(str(text))


def human_size(nbytes: float, digits: int | None = None) -> str:
    """``16777216`` -> ``16 MiB``; binary prefixes, as nccl-tests sizes usually are.

    ``digits``: that many decimals (``12.35 MiB``) instead of the shortest form.
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:g} {unit}" if digits is None else f"{value:.{digits}f} {unit}"
    return f"{nbytes:g} B"
