"""Every registered name is exercised: kinds of network change, compressors, strategies.

Two checks per registry. Each name must appear in some test of the suite
(in a string: a spec, a compressor or strategy name), so a new entry without
a test fails here and says which. And a tiny check runs over every entry as
it is registered now: the name parses and comes back the same.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from gradwire.compress import COMPRESSORS, get_compressor, roundtrip
from gradwire.net import parse_spec
from gradwire.net.schedule import CHANGE_KINDS, Schedule
from gradwire.strategies import STRATEGIES, parse_strategy

TESTS = Path(__file__).parent
#: files that name every entry by reading the registries (they would count every name as tested)
_SELF = {Path(__file__).name}


@lru_cache(maxsize=1)
def words_in_tests() -> frozenset[str]:
    """Every word of every string constant in the tests (``onebit+delayed:2`` -> onebit, delayed, 2)."""
    words: set[str] = set()
    for path in TESTS.rglob("*.py"):
        if path.name in _SELF:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                words.update(re.findall(r"[A-Za-z0-9_-]+", node.value.lower()))
    return frozenset(words)


@pytest.mark.parametrize("registry, names", [
    ("kind of network change", sorted(CHANGE_KINDS)),
    ("compressor", sorted(COMPRESSORS)),
    ("strategy", sorted(STRATEGIES)),
])
def test_every_registered_name_is_named_by_a_test(registry: str, names: list[str]) -> None:
    untested = [n for n in names if n not in words_in_tests()]
    assert not untested, f"no test names the {registry} {untested}: add one beside its family's tests"


@pytest.mark.parametrize("key", sorted(CHANGE_KINDS))
def test_every_kind_of_network_change_parses_round_trips_and_applies(key: str, tmp_path: Path) -> None:
    kind = CHANGE_KINDS[key]
    token = kind.grammar
    if "FILE" in token:  # a trace: a file of two rows
        trace = tmp_path / "trace.csv"
        trace.write_text("time,bandwidth\n0s,1gbit\n1s,100mbit\n")
        token = f"{key}={trace}"
    token = re.sub(r"\[[^]]*\]", "", token)  # optional parts left out
    spec = parse_spec(f"10gbe,{token}")
    assert [type(e) for e in spec.events] == [kind]
    assert parse_spec(spec.to_string()) == spec
    conditions = {cond for _, cond in zip(range(8), Schedule(spec.events).segments(0.0, spec.bandwidth))}
    assert len(conditions) > 1, f"{token}: the schedule never changed the network"


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_compressor_builds_and_round_trips_on_one_rank(name: str) -> None:
    compressor = get_compressor(name)
    if name == "auto":  # chooses among the others per exchange; it compresses nothing itself
        assert compressor.candidates
        return
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    y = roundtrip(compressor, x)
    assert y.shape == x.shape and y.dtype == x.dtype and torch.isfinite(y).all()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_parses_from_its_syntax_and_names_itself_back(name: str) -> None:
    entry = STRATEGIES[name]
    text = ":".join([name, *("2" for _ in entry.positional)])
    choice = parse_strategy(text)
    assert choice.spec.name == name
    assert parse_strategy(str(choice)) == choice
