"""Parsing composed strategy names (pure, one process)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from gradwire.strategies import (
    NOT_AN_AVERAGE, STRATEGIES, StrategyChoice, StrategySpec, parse_strategy, register_strategy,
)


@pytest.mark.parametrize("text, compressor, spec", [
    ("sync", None, StrategySpec("sync")),
    ("delayed", None, StrategySpec("delayed")),
    ("onebit+delayed", "onebit", StrategySpec("delayed")),
    ("delayed+onebit", "onebit", StrategySpec("delayed")),
    ("topk:0.01+localsgd:4", "topk:0.01", StrategySpec("localsgd", {"H": 4})),
    ("localsgd:4:warmup=50", None, StrategySpec("localsgd", {"H": 4, "warmup": 50})),
    ("fp16", "fp16", StrategySpec("sync")),
    ("none+async-average:2", None, StrategySpec("async-average", {"H": 2})),
    ("handler", None, StrategySpec("handler")),
    ("delayed:naive", None, StrategySpec("delayed", {"naive": 1})),
    ("signum+delayed:naive", "signum", StrategySpec("delayed", {"naive": 1})),
])
def test_parse(text: str, compressor: str | None, spec: StrategySpec) -> None:
    assert parse_strategy(text) == StrategyChoice(compressor, spec)


def test_spec_round_trips_through_str() -> None:
    for text in ("sync", "localsgd:4:warmup=50", "async-average:8", "delayed:naive"):
        assert str(parse_strategy(text)) == text
    assert str(parse_strategy("onebit+delayed")) == "onebit+delayed" and str(parse_strategy("delayed+fp16")) == "fp16+delayed"
    assert str(parse_strategy("fp16")) == str(parse_strategy("fp16+sync")) == "fp16"


@pytest.mark.parametrize("text, fragment", [
    ("localsgd:0", "must be >= 1"),
    ("async-average:-2", "must be >= 1"),
    ("localsgd:x", "must be an integer"),
    ("localsgd", "expected localsgd:H"),
    ("foo+delayed", "valid strategies: sync, delayed"),
    ("foo+delayed", "valid compressors: "),
    ("delayed+sync", "two strategies"),
    ("onebit+fp16", "two compressors"),
    ("localsgd:4:bar=1", "unknown option 'bar'"),
    ("signum+localsgd:4", "valid compressors for localsgd:4"),
    ("delayed:local=1", "unknown option 'local' \\(options of delayed: naive\\)"),
    ("delayed:slow", "expected delayed\\[:naive\\]"),
    ("signum+delayed", "a vote, not an average; valid compressors for delayed: "),
    ("onebit++delayed", "empty part"),
])
def test_bad_names_say_what_is_valid(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("+", r"\+")):
        parse_strategy(text)


def test_every_strategy_builds_with_and_without_compressor() -> None:
    for name, entry in STRATEGIES.items():
        params = {p: 2 for p in entry.positional}
        for compressor in (None, "fp16"):
            if compressor in entry.refuses:  # PyTorch's hooks are their own compression
                continue
            s = StrategySpec(name, params).build(compressor, momentum=0.9)
            assert s.name == name
            # gradient strategies own the momentum when they compress (error feedback + momentum trap)
            expected = 0.0 if compressor and s.averages_gradients else 0.9
            assert s.optimizer_momentum == expected


def test_a_compressor_that_is_not_an_average_is_refused_because_it_says_so() -> None:
    """The refusal reads the compressor's ``averages``; a vote registered later is refused too."""
    from gradwire.compress import COMPRESSORS, register_compressor
    from gradwire.compress.signum import SignumCompressor

    class Majority(SignumCompressor):
        name = "majority"

    assert "signum" in NOT_AN_AVERAGE and "fp16" not in NOT_AN_AVERAGE
    register_compressor("majority", lambda arg: Majority())
    try:
        assert "majority" in NOT_AN_AVERAGE
        with pytest.raises(ValueError, match="majority.*a vote, not an average"):
            parse_strategy("majority+localsgd:2")
        assert str(parse_strategy("majority+delayed:naive")) == "majority+delayed:naive"  # naive lifts it
    finally:
        COMPRESSORS.pop("majority", None)
    assert "majority" not in NOT_AN_AVERAGE


def test_torch_powersgd_start_is_a_minimum_on_its_entry() -> None:
    assert STRATEGIES["torch-powersgd"].minimums["start"][0] == 2
    with pytest.raises(ValueError, match=r"start must be >= 2 \(PyTorch's PowerSGD compresses from the third"):
        parse_strategy("torch-powersgd:4:start=1")
    assert str(parse_strategy("torch-powersgd:4:start=2")) == "torch-powersgd:4:start=2"


def test_register_strategy_refuses_a_taken_name_and_rules_on_no_parameter() -> None:
    entry = STRATEGIES["localsgd"]
    for taken in ("localsgd", "fp16"):
        with pytest.raises(ValueError, match="already names a"):
            register_strategy(taken, entry)
    with pytest.raises(ValueError, match="without ':'"):
        register_strategy("a+b", entry)
    with pytest.raises(ValueError, match=r"\['K'\] are none of its parameters"):
        register_strategy("toy", replace(entry, minimums={"K": (1, "")}))
    assert "toy" not in STRATEGIES
