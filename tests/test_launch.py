import pytest

from gradwire.launch import RankError, spawn
from tests import workers


def test_spawn_returns_values_by_rank():
    assert spawn(workers.echo_rank, 3) == [0, 10, 20]


def test_failing_rank_reraises_with_traceback():
    with pytest.raises(RankError) as info:
        spawn(workers.fail_on_rank_one, 2, timeout=60)
    assert info.value.rank == 1
    assert "boom on rank 1" in str(info.value)


def test_rank_dying_in_collective_does_not_hang_others():
    with pytest.raises(RankError):
        spawn(workers.die_in_collective, 2, timeout=90)


def test_reports_arrive_in_order_before_a_failure():
    got = []
    with pytest.raises(RankError, match="boom after reporting"):
        spawn(workers.report_then_fail_on_rank_one, 2, timeout=60, on_report=lambda r, v: got.append((r, v)))
    assert [v for r, v in got if r == 1] == [("first", 1), ("second", 1)]


def test_report_outside_a_rank_says_where_it_belongs():
    from gradwire.launch import report

    with pytest.raises(RuntimeError, match="spawn"):
        report(1)
