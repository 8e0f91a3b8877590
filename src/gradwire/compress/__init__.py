"""Gradient compressors, error feedback and bit packing: pure tensor code.

Pick a compressor by name, parameters after a colon::

    >>> from gradwire.compress import get_compressor
    >>> get_compressor("topk:0.01")
    <compressor topk pattern=allgather>

Names (``COMPRESSORS`` lists them with their parameter):

==================  =========  ==========================================
name                pattern    payload per n fp32 elements
==================  =========  ==========================================
none                allreduce  4n bytes
fp16, bf16          allreduce  2n bytes
int8                allgather  n bytes + scale (max-norm, 127 levels)
qsgd:s              allgather  n bytes + norm (s in [1, 127], default 16)
terngrad            allgather  ceil(n/4) bytes + scale
onebit[:pattern]    two_phase  ceil(n/8) bytes + scale (or ``:allgather``)
signum              allgather  ceil(n/8) bytes + scale, majority vote
topk:ratio          allgather  k int32 indices + k values (default 0.01)
randomk:ratio       allreduce  k values, indices from a shared seed
powersgd:r          allreduce  r (rows + cols) floats in two rounds
==================  =========  ==========================================

This package never imports ``torch.distributed``; the exchange patterns are
implemented in :mod:`gradwire.hooks`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .base import Compressor, Ctx, Pattern, payload_nbytes, roundtrip
from .bf16 import BF16Compressor
from .errorfeedback import ErrorFeedback
from .fp16 import FP16Compressor
from .none import NoneCompressor
from .onebit import OneBitCompressor
from .powersgd import PowerSGDCompressor
from .qsgd import QSGDCompressor
from .randomk import RandomKCompressor
from .signum import SignumCompressor
from .terngrad import TernGradCompressor
from .topk import TopKCompressor

__all__ = [
    "COMPRESSORS",
    "Compressor",
    "Ctx",
    "ErrorFeedback",
    "Pattern",
    "get_compressor",
    "payload_nbytes",
    "register_compressor",
    "roundtrip",
]


@dataclass(frozen=True)
class Entry:
    """A registry entry: ``factory(arg)`` builds the compressor; ``arg`` is None without a colon."""

    factory: Callable[[str | None], Compressor]
    param: str
    doc: str


COMPRESSORS: dict[str, Entry] = {}


def register_compressor(name: str, factory: Callable[[str | None], Compressor], param: str = "", doc: str = "") -> None:
    """Add ``name`` to the registry; ``factory`` receives the text after ``name:`` (or None)."""
    if ":" in name or not name:
        raise ValueError(f"compressor names must be non-empty and contain no ':', got {name!r}")
    COMPRESSORS[name] = Entry(factory, param, doc)


def _valid_names() -> str:
    return ", ".join(f"{n}:{e.param}" if e.param else n for n, e in sorted(COMPRESSORS.items()))


def get_compressor(spec: str | Compressor) -> Compressor:
    """Build a compressor from ``"name"`` or ``"name:param"`` (a Compressor passes through).

    Raises:
        ValueError: unknown name (the message lists the valid ones) or a bad parameter.
    """
    if isinstance(spec, Compressor):
        return spec
    name, _, arg = str(spec).strip().partition(":")
    entry = COMPRESSORS.get(name.lower())
    if entry is None:
        raise ValueError(f"unknown compressor {spec!r}; valid names: {_valid_names()}")
    return entry.factory(arg if arg else None)


def _number(kind: type, default: float | int, what: str) -> Callable[[str | None], float | int]:
    def parse(arg: str | None) -> float | int:
        if arg is None:
            return default
        try:
            return kind(arg)
        except ValueError:
            raise ValueError(f"{what} must be a {kind.__name__}, got {arg!r}") from None

    return parse


def _no_arg(cls: Callable[[], Compressor], name: str) -> Callable[[str | None], Compressor]:
    def make(arg: str | None) -> Compressor:
        if arg is not None:
            raise ValueError(f"compressor {name!r} takes no parameter, got {arg!r}")
        return cls()

    return make


_ratio = _number(float, 0.01, "ratio")
_levels = _number(int, 16, "qsgd levels")
_rank = _number(int, 4, "powersgd rank")

register_compressor("none", _no_arg(NoneCompressor, "none"), doc="no compression (reference)")
register_compressor("fp16", _no_arg(FP16Compressor, "fp16"), doc="half precision cast")
register_compressor("bf16", _no_arg(BF16Compressor, "bf16"), doc="bfloat16 cast")
register_compressor("int8", _no_arg(lambda: QSGDCompressor(127, norm="max"), "int8"), doc="stochastic int8, max scale")
register_compressor("qsgd", lambda a: QSGDCompressor(_levels(a)), "s", "QSGD with s levels (1..127)")
register_compressor("terngrad", _no_arg(TernGradCompressor, "terngrad"), doc="stochastic ternary, 2 bits")
register_compressor("onebit", lambda a: OneBitCompressor(a or Pattern.TWO_PHASE), "two_phase|allgather", "sign + scale")
register_compressor("signum", _no_arg(SignumCompressor, "signum"), doc="majority vote of signs")
register_compressor("topk", lambda a: TopKCompressor(_ratio(a)), "ratio", "largest magnitudes, sampled threshold")
register_compressor("randomk", lambda a: RandomKCompressor(_ratio(a)), "ratio", "shared random coordinates")
register_compressor("powersgd", lambda a: PowerSGDCompressor(_rank(a)), "r", "rank-r power iteration")
