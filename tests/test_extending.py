"""The recipes of docs/extending.md, each run end to end on a toy added here.

- A compressor: a class with ``encode``/``decode``, one ``register_compressor``
  call; it round-trips through the compressed exchange on a one-rank group.
- A kind of network change: a dataclass with ``key``, ``stage``, ``parse``,
  ``state``, ``apply``, ``to_string`` and ``@register_change``; a spec names
  it and the schedule applies it.
- A strategy: a class and one ``register_strategy`` call; its name parses,
  composes with a compressor, is refused where its entry's rules say, and builds.

Every toy is removed from its registry afterwards, so the rest of the suite
(and tests/test_registries.py) sees the registries as shipped.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, replace
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from gradwire.compress import COMPRESSORS, Compressor, Ctx, Pattern, StateKey, register_compressor
from gradwire.net import NetworkModel, parse_spec
from gradwire.net.schedule import CHANGE_KINDS, RATE, Condition, NetworkChange, register_change
from gradwire.net.units import format_time, parse_time
from gradwire.strategies import (
    NOT_AN_AVERAGE, STRATEGIES, StrategyEntry, build_strategy, parse_strategy, register_strategy,
)
from gradwire.strategies.averaging import LocalSGDStrategy


# ---- a compressor ------------------------------------------------------------------------------------------


class Int16Compressor(Compressor):
    """Toy: int16 values and one fp32 scale per tensor (2 bytes per element)."""

    name = "toy-int16"
    pattern = Pattern.ALLGATHER  # int16 values of different scales cannot be summed on the wire

    def encode(self, flat: Tensor, ctx: Ctx) -> list[Tensor]:
        scale = flat.abs().max().clamp_min(1e-30) / 32767
        return [torch.round(flat / scale).to(torch.int16), scale.reshape(1).to(torch.float32)]

    def decode(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        values, scale = payload
        return (values.to(torch.float32) * scale).to(ctx.dtype)


@pytest.fixture
def toy_compressor() -> Iterator[str]:
    register_compressor("toy-int16", lambda arg: Int16Compressor(), doc="toy: int16 with one scale")
    try:
        yield "toy-int16"
    finally:
        COMPRESSORS.pop("toy-int16", None)


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_a_new_compressor_round_trips_through_the_exchange(toy_compressor: str, one_rank_group: None) -> None:
    from gradwire.exchange import CompressionState

    state = CompressionState(toy_compressor, warmup_iters=0, min_compress_numel=0, local_correction=False)
    assert isinstance(state.compressor, Int16Compressor)
    g = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    out = state.reduce(g.clone(), StateKey.of("w", g.numel())).wait()
    torch.testing.assert_close(out, g, rtol=0, atol=float(g.abs().max()) / 32767)


# ---- a kind of network change ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Brownout(NetworkChange):
    """Toy: ``brownout=FRACTION:for=T[:at=T]``: the link keeps that fraction of its rate for a while, once."""

    key = "brownout"
    stage = RATE
    grammar = "brownout=0.5:for=5s:at=10s"

    fraction: float
    duration: float
    at: float = 0.0

    @classmethod
    def parse(cls, head: str, rest: list[str]) -> "Brownout":
        opts = dict(part.partition("=")[::2] for part in rest)
        return cls(float(head), parse_time(opts["for"]), parse_time(opts.get("at", "0s")))

    def state(self, t: float) -> tuple[bool, float]:
        if t < self.at:
            return False, self.at
        return (True, self.at + self.duration) if t < self.at + self.duration else (False, math.inf)

    def apply(self, cond: Condition, bandwidth: float) -> Condition:
        return replace(cond, bandwidth=bandwidth * self.fraction)

    def to_string(self) -> str:
        return f"brownout={self.fraction:g}:for={format_time(self.duration)}:at={format_time(self.at)}"


@pytest.fixture
def toy_change() -> Iterator[type[Brownout]]:
    register_change(Brownout)
    try:
        yield Brownout
    finally:
        CHANGE_KINDS.pop("brownout", None)


def test_a_new_kind_of_network_change_is_parsed_and_applied_by_the_schedule(toy_change: type[Brownout]) -> None:
    spec = parse_spec("bandwidth=1gbit,latency=0us,protocol=none,brownout=0.5:for=5s:at=10s")
    assert spec.events == (Brownout(0.5, 5.0, 10.0),)
    assert parse_spec(spec.to_string()) == spec
    model = NetworkModel(spec, 2)
    nbytes = 1 << 20
    before = model.cost("all_reduce", nbytes, start=0.0).seconds
    during = model.cost("all_reduce", nbytes, start=11.0).seconds
    assert during == pytest.approx(2 * before, rel=1e-6)


# ---- a strategy --------------------------------------------------------------------------------------------


class EveryOtherAverage(LocalSGDStrategy):
    """Toy: local SGD whose period is given in pairs of steps (``pairs:P`` averages every 2P steps)."""

    name = "pairs"

    def __init__(self, pairs: int, compressor: str | Compressor | None = None, momentum: float = 0.9,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__(2 * pairs, compressor=compressor, momentum=momentum, group=group)
        self.pairs = pairs


@pytest.fixture
def toy_strategy() -> Iterator[str]:
    register_strategy("pairs", StrategyEntry(
        EveryOtherAverage, ("P",), (), "parameter average every 2P steps",
        refuses=NOT_AN_AVERAGE, minimums={"P": (2, "one pair is plain localsgd:2")}))
    try:
        yield "pairs"
    finally:
        STRATEGIES.pop("pairs", None)


def test_a_new_strategy_parses_composes_and_builds(toy_strategy: str) -> None:
    choice = parse_strategy("fp16+pairs:3")
    assert (choice.compressor, choice.spec.name, str(choice)) == ("fp16", "pairs", "fp16+pairs:3")
    strategy = build_strategy(choice)
    assert isinstance(strategy, EveryOtherAverage) and strategy.pairs == 3
    assert strategy.compressor is not None and strategy.compressor.name == "fp16"
    with pytest.raises(ValueError, match=r"P must be >= 2 \(one pair is plain localsgd:2\), got 1"):
        parse_strategy("pairs:1")
    with pytest.raises(ValueError, match="a vote, not an average"):  # the trait its entry gave it
        parse_strategy("signum+pairs:2")
