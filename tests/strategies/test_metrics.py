"""Exposed-time attribution from the event log (pure, one process)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gradwire.strategies import network_wait, split_exposed, step_comm_seconds


def _op(issued: float, modelled_done: float, completed: float, error: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(issued=issued, modelled_done=modelled_done, completed=completed, error=error,
                           model_seconds=modelled_done - issued)


def test_wait_for_the_network_counts_until_the_modelled_arrival() -> None:
    # issued at 0, the model delivers at 3, the future completes at 3.1; the thread waits from 1 to 3.2
    assert network_wait(1.0, 3.2, [_op(0.0, 3.0, 3.1)]) == pytest.approx(2.0)


def test_waiting_for_a_late_peer_is_not_network_time() -> None:
    # the model says 1.0, but the real collective ends at 4.0 (the other rank arrived late)
    assert network_wait(0.5, 4.0, [_op(0.0, 1.0, 4.0)]) == pytest.approx(0.5)
    assert network_wait(2.0, 4.0, [_op(0.0, 1.0, 4.0)]) == 0.0


def test_ops_not_waited_for_do_not_count() -> None:
    # completed after the wait ended (the next step's traffic), or before it began, or failed
    ops = [_op(0.0, 5.0, 6.0), _op(-2.0, -1.0, -0.5), _op(0.0, 3.0, 1.5, error="RuntimeError: x")]
    assert network_wait(0.0, 2.0, ops) == 0.0


def test_chained_and_overlapping_ops_count_once() -> None:
    # two-phase: phase 1 [0, 2], CPU work until 2.5, phase 2 [2.5, 3.5]; plus a bucket overlapping phase 1
    ops = [_op(0.0, 2.0, 2.1), _op(2.5, 3.5, 3.6), _op(1.0, 2.0, 2.1)]
    assert network_wait(0.0, 3.6, ops) == pytest.approx(3.0)


def test_split_exposed_per_step() -> None:
    ops = [_op(0.0, 3.0, 3.1), _op(10.0, 11.0, 14.0)]
    waits = [[(1.0, 3.2)], [], [(10.5, 14.0), (20.0, 21.0)]]
    assert split_exposed(ops, waits) == pytest.approx([2.0, 0.0, 0.5])


def test_step_comm_seconds_counts_by_issue_time() -> None:
    ops = [_op(0.5, 3.0, 3.1), _op(1.5, 2.0, 2.0), _op(9.0, 9.5, 9.5)]
    seconds, counted = step_comm_seconds(ops, [(0.0, 1.0), (1.0, 2.0)])
    assert seconds == pytest.approx([2.5, 0.5]) and counted == 2
