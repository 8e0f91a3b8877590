"""A peer that dies or stalls: every survivor raises within the group timeout + 5 s, in every strategy.

No segfault, no hang, no silent continuation (a future chain that dropped an
inner failure would let training finish). ``benchmarks/dead_peer_matrix.py``
runs the whole matrix (2 and 4 ranks, exit / kill / stall, gloo and gradwire).
"""
from __future__ import annotations

import pytest

from tests.faults import GROUP_TIMEOUT, run_fault

STRATEGIES = ["sync", "onebit", "topk:0.1", "fp16", "delayed", "onebit+delayed", "localsgd:2", "async-average:2",
              "handler", "torch-fp16", "torch-powersgd:1"]


def _assert_raised(outcomes, world: int) -> None:
    assert len(outcomes) == world - 1
    for o in outcomes:
        assert o.kind == "raised", o
        assert o.seconds is not None and o.seconds <= GROUP_TIMEOUT + 5.0, o
        assert o.error.startswith(("RuntimeError", "DistBackendError", "DistNetworkError", "TimeoutError")), o


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_survivor_raises_when_a_peer_exits(strategy: str) -> None:
    _assert_raised(run_fault(strategy, 2, "exit"), 2)


@pytest.mark.parametrize("strategy", ["sync", "onebit", "onebit+delayed"])
def test_every_survivor_of_four_raises_when_a_peer_is_killed(strategy: str) -> None:
    _assert_raised(run_fault(strategy, 4, "kill"), 4)


@pytest.mark.parametrize("strategy", ["sync", "onebit+delayed", "handler"])
def test_survivor_raises_when_a_peer_stalls_past_the_timeout(strategy: str) -> None:
    outcomes = run_fault(strategy, 2, "stall")
    _assert_raised(outcomes, 2)
    assert all(o.seconds >= GROUP_TIMEOUT - 0.5 for o in outcomes)  # not before the timeout
