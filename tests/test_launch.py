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
