"""Gradient compressors, error feedback and bit packing: pure tensor code.

Pick a compressor by name; a positional parameter and ``key=value`` options
follow, each after a colon::

    >>> from gradwire.compress import get_compressor
    >>> get_compressor("topk:0.01")
    <compressor topk pattern=allgather>
    >>> get_compressor("onebit:block=1024:warmup=50")
    <compressor onebit pattern=two_phase block=1024>

Every name takes ``warmup=N``: the hooks reduce the first N steps uncompressed
(:class:`~gradwire.exchange.CompressionState` reads ``compressor.warmup``), and
``fuse=N``: buckets of fewer than N elements are sent together as one
exchange (``fuse=0``: each bucket alone; default 65536, ``compressor.fuse``),
and ``correct=1``: the exchange applies each rank's own compression error at
once (the local correction, ``compressor.correct``; off by default, so that
every rank applies the same average and the replicas stay identical).

Names (``COMPRESSORS`` lists them with their parameter):

==================  =========  ==========================================
name                pattern    payload per n fp32 elements
==================  =========  ==========================================
none                allreduce  4n bytes
fp16, bf16          allreduce  2n bytes
int8[:pattern]      two_phase  n bytes + a max scale per block of 512
qsgd:s              allgather  n bytes + norm (s in [1, 127], default 16)
terngrad            allgather  ceil(n/4) bytes + scale
onebit[:pattern]    two_phase  ceil(n/8) bytes + an RMS scale per block of 512
signum              allgather  ceil(n/8) bytes + scales, majority vote
topk:ratio          allgather  k int32 indices + k values (default 0.01)
randomk:ratio       allreduce  k values, indices from a shared seed
powersgd:r          allreduce  r (rows + cols) floats in two rounds
==================  =========  ==========================================

Options: ``block=N`` (``int8``, ``onebit``, ``signum``: elements per scale, 0
for one scale per tensor), ``rms=0`` (``onebit``: mean-|x| scales),
``warmup=N``, ``fuse=N``, ``correct=0|1``, ``ef=N`` (all; ``ef``: the percent of the dropped error
that error feedback carries into the next step, 100 by default, see
:class:`~gradwire.compress.errorfeedback.ErrorFeedback`).

This package never imports ``torch.distributed``; the exchange patterns are
implemented in :mod:`gradwire.exchange`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .auto import AUTO_CANDIDATES, AUTO_EVERY, AlphaBeta, AutoCompressor, exchange_busbytes, payload_bits, price
from .base import Compressor, Ctx, Pattern, payload_nbytes, roundtrip
from .bf16 import BF16Compressor
from .errorfeedback import ErrorFeedback, is_finite
from .fp16 import FP16Compressor
from .none import NoneCompressor
from .onebit import DEFAULT_BLOCK, OneBitCompressor
from .powersgd import PowerSGDCompressor
from .qsgd import QSGDCompressor
from .randomk import RandomKCompressor
from .signum import SignumCompressor
from .state import SegmentStore, StateKey
from .terngrad import TernGradCompressor
from .topk import TopKCompressor

__all__ = [
    "AutoCompressor",
    "COMPRESSORS",
    "AlphaBeta",
    "Compressor",
    "Ctx",
    "ErrorFeedback",
    "Pattern",
    "SegmentStore",
    "StateKey",
    "exchange_busbytes",
    "payload_bits",
    "get_compressor",
    "is_finite",
    "parse_compressor",
    "payload_nbytes",
    "price",
    "register_compressor",
    "roundtrip",
]


@dataclass(frozen=True)
class CompressorEntry:
    """A registry entry: ``factory(arg, **options)`` builds the compressor.

    ``arg`` is the positional parameter (None when absent); ``options`` names the
    integer ``key=value`` options the factory accepts besides ``warmup``.
    """

    factory: Callable[..., Compressor]
    param: str
    doc: str
    options: tuple[str, ...] = ()


COMPRESSORS: dict[str, CompressorEntry] = {}

#: options every compressor accepts (handled here, not by the factories)
COMMON_OPTIONS = ("warmup", "fuse", "correct", "ef")


def register_compressor(name: str, factory: Callable[..., Compressor], param: str = "", doc: str = "",
                        options: tuple[str, ...] = ()) -> None:
    """Add ``name`` to the registry; ``factory(arg, **options)`` receives the parsed parameters.

    Raises ValueError for a name that cannot be written in the grammar or that is registered already.
    """
    if ":" in name or not name:
        raise ValueError(f"compressor names must be non-empty and contain no ':', got {name!r}")
    if name in COMPRESSORS:
        raise ValueError(f"compressor {name!r} is registered already; pick another name")
    COMPRESSORS[name] = CompressorEntry(factory, param, doc, tuple(options))


def _syntax(name: str, entry: CompressorEntry) -> str:
    return name + (f":{entry.param}" if entry.param else "") + "".join(f"[:{o}=N]" for o in entry.options)


def _valid_names() -> str:
    return ", ".join(_syntax(n, e) for n, e in sorted(COMPRESSORS.items()))


def parse_compressor(spec: str) -> tuple[str, str | None, dict[str, int]]:
    """Split ``"name[:param][:key=value]..."`` into (name, param or None, options).

    Raises:
        ValueError: an unknown name or option, two positional parameters, or a non-integer option.
    """
    name, *parts = str(spec).strip().split(":")
    name = name.lower()
    entry = COMPRESSORS.get(name)
    if entry is None:
        raise ValueError(f"unknown compressor {spec!r}; valid names: {_valid_names()}")
    positional = [p for p in parts if "=" not in p]
    if len(positional) > 1:
        raise ValueError(f"compressor {spec!r}: at most one positional parameter; write {_syntax(name, entry)}")
    options: dict[str, int] = {}
    for part in parts:
        if "=" not in part:
            continue
        key, _, value = part.partition("=")
        key = key.strip().lower()
        if key not in entry.options + COMMON_OPTIONS:
            allowed = ", ".join(entry.options + COMMON_OPTIONS)
            raise ValueError(f"compressor {spec!r}: unknown option {key!r} (options of {name}: {allowed})")
        try:
            options[key] = int(value)
        except ValueError:
            raise ValueError(f"compressor {spec!r}: option {key} must be an integer, got {value!r}") from None
    return name, (positional[0] if positional and positional[0] else None), options


def get_compressor(spec: str | Compressor) -> Compressor:
    """Build a compressor from ``"name"``, ``"name:param"``, ``"name:key=N"``... (a Compressor passes through).

    Raises:
        ValueError: unknown name or option (the message lists the valid ones) or a bad parameter.
    """
    if isinstance(spec, Compressor):
        return spec
    name, arg, options = parse_compressor(spec)
    warmup = options.pop("warmup", 0)
    if warmup < 0:
        raise ValueError(f"compressor {spec!r}: warmup must be >= 0 steps, got {warmup}")
    fuse = options.pop("fuse", None)
    if fuse is not None and fuse < 0:
        raise ValueError(f"compressor {spec!r}: fuse must be >= 0 elements (0: never fuse buckets), got {fuse}")
    correct = options.pop("correct", 0)
    if correct not in (0, 1):
        raise ValueError(f"compressor {spec!r}: correct must be 0 (every rank applies the same average) or 1 "
                         f"(the local correction), got {correct}")
    ef = options.pop("ef", 100)
    if not 0 <= ef <= 100:
        raise ValueError(f"compressor {spec!r}: ef is the percent of the residual error feedback keeps, "
                         f"0 to 100, got {ef}")
    compressor = COMPRESSORS[name].factory(arg, **options)
    compressor.warmup = warmup
    compressor.fuse = fuse
    if correct and (compressor.unbiased or not compressor.averages):
        why = "its exchange is a vote, not an average" if not compressor.averages else "it is unbiased (no error feedback)"
        raise ValueError(f"compressor {spec!r}: correct=1 needs error feedback and an average; {why}; drop correct=1")
    compressor.correct = bool(correct)
    compressor.ef = ef
    return compressor


def _number(kind: type, default: float | int, what: str) -> Callable[[str | None], float | int]:
    def parse(arg: str | None) -> float | int:
        if arg is None:
            return default
        try:
            return kind(arg)
        except ValueError:
            raise ValueError(f"{what} must be a {kind.__name__}, got {arg!r}") from None

    return parse


def _no_arg(cls: Callable[..., Compressor], name: str) -> Callable[..., Compressor]:
    def make(arg: str | None, **options: int) -> Compressor:
        if arg is not None:
            raise ValueError(f"compressor {name!r} takes no parameter, got {arg!r}")
        return cls(**options)

    return make


def _int8(arg: str | None, block: int = DEFAULT_BLOCK) -> Compressor:
    compressor = QSGDCompressor(127, norm="max", block=block, pattern=arg or Pattern.TWO_PHASE)
    compressor.name = "int8"
    return compressor


_ratio = _number(float, 0.01, "ratio")
_levels = _number(int, 16, "qsgd levels")
_rank = _number(int, 4, "powersgd rank")

def _auto(arg: str | None, every: int = AUTO_EVERY) -> Compressor:
    names = AUTO_CANDIDATES if not arg else tuple(n.strip() for n in arg.split("/") if n.strip() != "none")
    for n in names:
        if ":" in n or n not in COMPRESSORS or n == "auto":
            raise ValueError(f"auto: unknown candidate {n!r}; write auto:NAME/NAME/... with plain compressor "
                             f"names ({', '.join(sorted(set(COMPRESSORS) - {'auto'}))})")
    return AutoCompressor([get_compressor(n) for n in names], every=every)


register_compressor("none", _no_arg(NoneCompressor, "none"), doc="no compression (reference)")
register_compressor("fp16", _no_arg(FP16Compressor, "fp16"), doc="half precision cast")
register_compressor("bf16", _no_arg(BF16Compressor, "bf16"), doc="bfloat16 cast")
register_compressor("int8", _int8, "two_phase|allgather", "stochastic int8, max scale per block", ("block",))
register_compressor("qsgd", lambda a: QSGDCompressor(int(_levels(a))), "s", "QSGD with s levels (1..127)")
register_compressor("terngrad", _no_arg(TernGradCompressor, "terngrad"), doc="stochastic ternary, 2 bits")
register_compressor("onebit", lambda a, **o: OneBitCompressor(a or Pattern.TWO_PHASE, **o), "two_phase|allgather",
                    "sign + RMS scale per block", ("block", "rms"))
register_compressor("signum", _no_arg(SignumCompressor, "signum"), doc="majority vote of signs", options=("block",))
register_compressor("topk", lambda a: TopKCompressor(_ratio(a)), "ratio", "largest magnitudes, sampled threshold")
register_compressor("randomk", lambda a: RandomKCompressor(_ratio(a)), "ratio", "shared random coordinates")
register_compressor("powersgd", lambda a: PowerSGDCompressor(int(_rank(a))), "r", "rank-r power iteration")
register_compressor("auto", _auto, "fp16/int8/onebit", "per exchange, the candidate cheapest on the measured link",
                    ("every",))
