"""The strategy registry and the composed-name parser.

Names (``STRATEGIES``; positional parameters after ``:``, options as ``key=value``, flags as bare words):

======================  ====================================================
sync                    DDP, bucketed all_reduce overlapped with backward
delayed[:naive]         each bucket's average overlaps the whole next step;
                        applies the fresh local gradient at once and swaps in
                        the average one step later (sync's stability); naive:
                        the stale average alone (unstable with momentum)
localsgd:H[:warmup=W]   local steps, blocking parameter average every H steps,
                        after W synchronous steps (post-local SGD)
async-average:H         parameter average every H steps, overlapped, applied
                        when it arrives
handler                 AsyncGradientHandler: per-parameter async all_reduce
                        from autograd hooks, synchronize() before step
======================  ====================================================

Composition with a compressor uses ``+``: ``onebit+delayed``,
``topk:0.01+localsgd:4:warmup=50``. A bare compressor name means ``sync`` with
that compressor; ``none`` means no compressor. Colons, not commas, separate
parameters so that a comma-separated list of runs stays unambiguous.

A strategy is one :class:`StrategyEntry` in ``STRATEGIES`` (a new one:
:func:`register_strategy`, docs/extending.md). The parser asks the entry,
never the strategy's name: its grammar (``positional``, ``options``,
``flags``, ``floats``), the compressors it refuses (``refuses``; those that
are not an average, :data:`NOT_AN_AVERAGE`, are read off each compressor's
``averages``), its parameters' least values (``minimums``) and the flags
that lift its refusals (``lifts_refusals``).
"""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch.distributed as dist

from gradwire.exchange import COMPRESSORS, AutoCompressor, Compressor, get_compressor

from .averaging import AsyncAverageStrategy, LocalSGDStrategy
from .base import ExchangeTraits, Strategy, Timing
from .delayed import DelayedStrategy
from .diloco import DiLoCoStrategy, StreamingDiLoCoStrategy
from .handler import HandlerStrategy
from .sync import SyncStrategy
from .torch_hooks import TorchFP16Strategy, TorchPostLocalSGDStrategy, TorchPowerSGDStrategy
from .torchft_diloco import TorchFTDiLoCoStrategy

__all__ = ["NOT_AN_AVERAGE", "STRATEGIES", "StrategyChoice", "StrategyEntry", "StrategySpec", "build_strategy",
           "parse_strategy", "register_strategy"]


class _NotAnAverage(Mapping[str, str]):
    """The compressors whose exchange is not an average (``averages`` False: a vote), each with the reason.

    Asked of the compressor registry at each lookup, so a compressor registered later is covered too: the
    compressor says what it is, this map does not repeat it by name.
    """

    why = "its exchange is a vote, not an average"

    def __getitem__(self, name: str) -> str:
        if name in COMPRESSORS and not get_compressor(name).averages:
            return self.why
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in COMPRESSORS if n in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in COMPRESSORS and not get_compressor(name).averages


#: compressors whose exchange is not an average: a strategy that averages cannot take them
NOT_AN_AVERAGE: Mapping[str, str] = _NotAnAverage()

#: DiLoCo's outer gradient is one round's whole parameter change, sent once per H steps
_DILOCO_REFUSES: Mapping[str, str] = ChainMap({
    # benchmarks/diloco_outer_compression.py: diverged on the GPT example, and no variant came within 2%
    "onebit": "a sign-compressed outer gradient misses 60-70% of a round's change (the GPT example); error "
              "feedback carries that miss, as large as a whole round's change, into later rounds taken from "
              "another model, so it grows every round (it diverged), and without error feedback it stays "
              "(18-46% worse at 600 steps); use int8 (4x fewer bytes, the loss of plain diloco)",
}, NOT_AN_AVERAGE)  # type: ignore[arg-type]  # ChainMap only reads it


class _Everything(Mapping[str, str]):
    """A refusal map that holds every name, for one reason (strategies that are their own compression)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __getitem__(self, key: str) -> str:
        return self.why

    def __contains__(self, item: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_ANY_COMPRESSOR = _Everything("it is its own compression")


@dataclass(frozen=True)
class StrategyEntry:
    """How to build one strategy: its class, parameter grammar and compressor rule."""

    cls: type[Strategy]
    positional: tuple[str, ...]
    options: tuple[str, ...]
    doc: str
    #: compressor names this strategy refuses, each with the reason (its exchange would not mean what the
    #: strategy needs)
    refuses: Mapping[str, str] = field(default_factory=dict)
    #: options written as a bare word (``delayed:naive``), passed as ``name=1``
    flags: tuple[str, ...] = ()
    #: options that take a number with a fraction (``lr=0.7``); the others are integers
    floats: tuple[str, ...] = ()
    #: parameters with a least value, each with the reason (checked when a name is parsed)
    minimums: Mapping[str, tuple[float, str]] = field(default_factory=dict)
    #: flags that lift ``refuses``: with one set, the strategy applies whatever the exchange returns
    lifts_refusals: tuple[str, ...] = ()

    @property
    def timing(self) -> Timing | None:
        """How ``gradwire predict`` prices it (None: not a strategy predict can price)."""
        return self.cls.timing

    @property
    def owns_step(self) -> bool:
        """Whether every optimizer step goes through the strategy's own step."""
        return self.cls.owns_step

    @property
    def syntax(self) -> str:
        return ("".join(f":{p}" for p in self.positional) + "".join(f"[:{o}=N]" for o in self.options)
                + "".join(f"[:{f}]" for f in self.flags))


STRATEGIES: dict[str, StrategyEntry] = {
    "sync": StrategyEntry(SyncStrategy, (), (), "DDP bucketed all_reduce (baseline)"),
    "delayed": StrategyEntry(DelayedStrategy, (), (), "local gradient now, its average one step later",
                             NOT_AN_AVERAGE, flags=("naive",), lifts_refusals=("naive",)),
    "localsgd": StrategyEntry(LocalSGDStrategy, ("H",), ("warmup",), "parameter average every H steps",
                              NOT_AN_AVERAGE),
    "async-average": StrategyEntry(AsyncAverageStrategy, ("H",), (), "overlapped parameter average every H steps",
                                   NOT_AN_AVERAGE),
    "handler": StrategyEntry(HandlerStrategy, (), (), "AsyncGradientHandler, no DDP"),
    "diloco": StrategyEntry(DiLoCoStrategy, ("H",), ("lr", "mu", "overlap"),
                            "H inner steps, then an outer Nesterov step on the averaged parameter change",
                            _DILOCO_REFUSES, floats=("lr", "mu")),
    "streaming-diloco": StrategyEntry(StreamingDiLoCoStrategy, ("H",), ("fragments", "lr", "mu", "overlap"),
                                      "DiLoCo with the parameters in F fragments synchronised in turn",
                                      _DILOCO_REFUSES, floats=("lr", "mu")),
    "torch-postlocalsgd": StrategyEntry(TorchPostLocalSGDStrategy, ("H",), ("warmup",),
                                        "PyTorch's PostLocalSGDOptimizer + PeriodicModelAverager", _ANY_COMPRESSOR),
    "torchft-diloco": StrategyEntry(TorchFTDiLoCoStrategy, ("H",), ("lr", "mu"),
                                    "torchft's DiLoCo (lighthouse, Manager) over gradwire groups; needs torchft",
                                    _Everything("torchft's DiLoCo sends its outer gradient through its own Manager, "
                                                "uncompressed"), flags=("bucket",), floats=("lr", "mu")),
    # PyTorch's own hooks, as peers; they are the compression, so they take no compressor
    "torch-fp16": StrategyEntry(TorchFP16Strategy, (), (), "DDP + PyTorch's fp16_compress_hook", _ANY_COMPRESSOR),
    "torch-powersgd": StrategyEntry(TorchPowerSGDStrategy, ("R",), ("start",), "DDP + PyTorch's powerSGD_hook, rank R",
                                    _ANY_COMPRESSOR,
                                    minimums={"start": (2, "PyTorch's PowerSGD compresses from the third iteration "
                                                           "on, after DDP rebuilt its buckets")}),
}


def register_strategy(name: str, entry: StrategyEntry) -> None:
    """Make ``name`` a strategy: ``parse_strategy``, ``build_strategy`` and the commands know it from now on.

    ``entry.cls`` takes its positional parameters first, then ``compressor``, ``momentum``, ``group`` and its
    options as keywords (docs/extending.md). Raises ValueError for a name that is taken (by a strategy or a
    compressor: a composed name must say which part is which) or that the grammar cannot hold.
    """
    if not name or name != name.lower() or any(c in name for c in ":+, "):
        raise ValueError(f"a strategy name is lower case, without ':', '+', ',' or spaces, got {name!r}")
    if name in STRATEGIES or name in COMPRESSORS:
        raise ValueError(f"{name!r} already names a {'strategy' if name in STRATEGIES else 'compressor'}")
    unknown = [k for k in (*entry.minimums, *entry.lifts_refusals)
               if k not in entry.positional + entry.options + entry.flags]
    if unknown:
        raise ValueError(f"strategy {name!r}: {unknown} are none of its parameters")
    STRATEGIES[name] = entry


def _valid_strategies() -> str:
    return ", ".join(f"{n}{e.syntax}" for n, e in STRATEGIES.items())


@dataclass(frozen=True)
class StrategySpec:
    """A parsed strategy name: ``name`` and its integer parameters."""

    name: str
    params: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        entry = STRATEGIES[self.name]
        parts = [self.name] + [str(self.params[p]) for p in entry.positional]
        parts += [f"{o}={self.params[o]:g}" for o in entry.options if o in self.params]
        parts += [f for f in entry.flags if self.params.get(f)]
        return ":".join(parts)

    def build(self, compressor: str | Compressor | None = None, momentum: float = 0.9,
              group: dist.ProcessGroup | None = None) -> Strategy:
        """A fresh runtime strategy (one per training run); a compressor name is parsed here, once."""
        entry = STRATEGIES[self.name]
        if isinstance(compressor, str):
            compressor = get_compressor(compressor)
        check_composition(compressor, self)
        kwargs: dict[str, Any] = {o: self.params[o] for o in entry.options + entry.flags if o in self.params}
        args = [self.params[p] for p in entry.positional]
        make: Callable[..., Strategy] = entry.cls  # each class takes its positional parameters first
        return make(*args, compressor=compressor, momentum=momentum, group=group, **kwargs)


def _int(name: str, what: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: {what} must be an integer, got {text!r}") from None


def _float(name: str, what: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}: {what} must be a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name}: {what} must be a finite number, got {text!r}")
    return value


def _parse_one(text: str) -> StrategySpec:
    name, *args = text.split(":")
    entry = STRATEGIES[name]
    flags = [a for a in args if a in entry.flags]
    positional = [a for a in args if "=" not in a and a not in entry.flags]
    options = [a for a in args if "=" in a]
    if len(positional) != len(entry.positional):
        raise ValueError(f"strategy {text!r}: expected {name}{entry.syntax}")
    params: dict[str, float] = {p: _int(name, p, a) for p, a in zip(entry.positional, positional)}
    for opt in options:
        key, _, value = opt.partition("=")
        if key not in entry.options:
            allowed = ", ".join(entry.options + entry.flags) or "none"
            raise ValueError(f"strategy {text!r}: unknown option {key!r} (options of {name}: {allowed})")
        params[key] = _float(name, key, value) if key in entry.floats else _int(name, key, value)
    params.update({f: 1 for f in flags})
    for key, (least, why) in entry.minimums.items():
        if key in params and params[key] < least:
            raise ValueError(f"strategy {text!r}: {key} must be >= {least:g} ({why}), got {params[key]:g}")
    if "R" in params and params["R"] < 1:
        raise ValueError(f"strategy {text!r}: R (PowerSGD rank) must be >= 1, got {params['R']}")
    if "H" in params and params["H"] < 1:
        raise ValueError(f"strategy {text!r}: H (steps between averages) must be >= 1, got {params['H']}")
    if params.get("warmup", 0) < 0:
        raise ValueError(f"strategy {text!r}: warmup must be >= 0 steps, got {params['warmup']}")
    return StrategySpec(name, params)


def check_composition(compressor: str | Compressor | None, spec: StrategySpec) -> None:
    """Raise ValueError when ``spec`` cannot run with ``compressor``."""
    if compressor is None:
        return
    entry = STRATEGIES[spec.name]
    if spec.name != "sync" and get_compressor(compressor).correct:
        raise ValueError(f"compressor {getattr(compressor, 'name', compressor)!r} cannot compose with strategy "
                         f"{spec}: correct=1 is the local correction of sync's DDP hook, and {spec} applies the "
                         "same average on every rank (or corrects in its own way); drop correct=1")
    head = compressor.name if isinstance(compressor, Compressor) else compressor.split(":")[0].lower()
    refuses: Mapping[str, str] = entry.refuses
    if any(spec.params.get(flag) for flag in entry.lifts_refusals):
        refuses = {}  # applies whatever the exchange returns
    if head in refuses:
        valid = ", ".join(sorted(n for n in COMPRESSORS if n not in refuses)) or "none"
        raise ValueError(
            f"compressor {getattr(compressor, 'name', compressor)!r} cannot compose with strategy {spec}: "
            f"{refuses[head]}; "
            f"valid compressors for {spec}: {valid}"
        )


@dataclass(frozen=True)
class StrategyChoice:
    """A parsed ``compressor+strategy`` name: the validated compressor name and the :class:`StrategySpec`.

    It is a description, built into a fresh runtime strategy (and a fresh
    compressor: compressors hold per-tensor state) for every training run.
    """

    compressor: str | None
    spec: StrategySpec

    def __str__(self) -> str:
        """The canonical name: ``onebit+delayed``; a compressor alone means ``sync`` with it (``fp16``)."""
        if self.compressor is None:
            return str(self.spec)
        return self.compressor if str(self.spec) == "sync" else f"{self.compressor}+{self.spec}"

    def build(self, momentum: float = 0.9, group: dist.ProcessGroup | None = None) -> Strategy:
        """A fresh runtime strategy (one per training run)."""
        return self.spec.build(self.compressor, momentum=momentum, group=group)

    @property
    def entry(self) -> StrategyEntry:
        return STRATEGIES[self.spec.name]

    @property
    def timing(self) -> Timing | None:
        """Where the strategy's exchanges sit in a step (what ``gradwire predict`` replays)."""
        return self.entry.timing

    def average_schedule(self) -> tuple[int, int, bool]:
        """A parameter-averaging strategy's steps between exchanges, fragments, and whether it overlaps."""
        schedule = getattr(self.entry.cls, "average_schedule", None)
        if schedule is None:
            raise ValueError(f"strategy {self.spec.name} does not average parameters")
        period, fragments, overlapped = schedule(self.spec.params)
        return int(period), int(fragments), bool(overlapped)

    @property
    def exchange(self) -> ExchangeTraits:
        """What the strategy's exchange of each bucket does (what ``gradwire predict`` replays)."""
        return self.entry.cls.exchange_traits(self.spec.params, self.compressor)

    def auto_candidates(self) -> list[StrategyChoice] | None:
        """The fixed choices an ``auto`` compressor chooses among (None for a fixed compressor).

        ``auto:fp16/onebit+delayed`` -> ``delayed``, ``fp16+delayed``, ``onebit+delayed``: what
        ``gradwire predict`` replays ``auto`` as (at each point, the fastest of them).
        """
        if self.compressor is None:
            return None
        auto = get_compressor(self.compressor)
        if not isinstance(auto, AutoCompressor):
            return None
        return [StrategyChoice(None, self.spec)] + [StrategyChoice(c.name, self.spec) for c in auto.candidates]


def parse_strategy(text: str | StrategyChoice) -> StrategyChoice:
    """Parse ``"compressor+strategy"`` into a :class:`StrategyChoice` (a choice passes through).

    Examples: ``"delayed"`` -> (None, delayed); ``"onebit+delayed"`` -> ("onebit", delayed);
    ``"fp16"`` -> ("fp16", sync); ``"topk:0.01+localsgd:4:warmup=50"``.

    Raises:
        ValueError: an unknown part (naming the valid strategies and compressors),
            two strategies or two compressors, a bad parameter, or a composition
            that cannot work.
    """
    if isinstance(text, StrategyChoice):
        return text
    parts = [p.strip() for p in str(text).split("+")]
    if not text or any(not p for p in parts):
        raise ValueError(f"empty part in strategy name {text!r}; write e.g. 'onebit+delayed'")
    compressor: str | None = None
    spec: StrategySpec | None = None
    seen_compressor = False
    for part in parts:
        head = part.split(":")[0].lower()
        if head in STRATEGIES:
            if spec is not None:
                raise ValueError(f"{text!r} names two strategies ({spec.name}, {head}); use one")
            spec = _parse_one(part.lower())
        elif head in COMPRESSORS:
            if seen_compressor:
                raise ValueError(f"{text!r} names two compressors; compose one compressor with one strategy")
            seen_compressor = True
            get_compressor(part)  # validates its parameter with the compressor's own message
            compressor = None if head == "none" else part
        else:
            comps = ", ".join(sorted(COMPRESSORS))
            raise ValueError(
                f"unknown part {part!r} in {text!r}; valid strategies: {_valid_strategies()}; "
                f"valid compressors: {comps}"
            )
    spec = spec or StrategySpec("sync")
    check_composition(compressor, spec)
    return StrategyChoice(compressor, spec)


def build_strategy(text: str | StrategyChoice, momentum: float = 0.9,
                   group: dist.ProcessGroup | None = None) -> Strategy:
    """Parse ``text`` (once) and build the runtime strategy in one call."""
    return parse_strategy(text).build(momentum=momentum, group=group)
