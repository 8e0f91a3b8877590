import re

import pytest

from gradwire.launch import RankError, spawn
from tests import workers

#: what gloo says when the other end of a pair went away
PEER_GONE = r"Connection (closed|reset) by peer"


def test_spawn_returns_values_by_rank():
    assert spawn(workers.echo_rank, 3) == [0, 10, 20]


def test_failing_rank_reraises_with_traceback():
    with pytest.raises(RankError) as info:
        spawn(workers.fail_on_rank_one, 2, timeout=60)
    assert info.value.rank == 1
    assert "boom on rank 1" in str(info.value)


def test_rank_dying_in_collective_does_not_hang_others():
    # whichever the parent hears first: rank 1's death, or rank 0's error about it (what rank 0 raises
    # and when: test_survivor_of_a_dead_peer_raises_at_once)
    with pytest.raises(RankError) as info:
        spawn(workers.die_in_collective, 2, timeout=90)
    err = info.value
    assert (err.rank == 1 and "process exited with code 3" in str(err)) or (
        err.rank == 0 and re.search(PEER_GONE, str(err))), str(err)


def test_survivor_of_a_dead_peer_raises_at_once():
    """The survivor's all_reduce raises a connection error well before the group's timeout (40 s)."""
    survivor, peer = spawn(workers.survivor_of_a_dead_peer, 2, ("gloo", None, 40.0), timeout=90)
    assert peer == {"child_exit": 3}
    assert survivor["raised"] is not None and survivor["is_runtime_error"], survivor
    assert re.search(PEER_GONE, survivor["message"]), survivor
    assert survivor["seconds"] < 10, survivor  # noticed the closed socket; did not wait out the timeout


def test_reports_arrive_in_order_before_a_failure():
    got = []
    with pytest.raises(RankError, match="boom after reporting"):
        spawn(workers.report_then_fail_on_rank_one, 2, timeout=60, on_report=lambda r, v: got.append((r, v)))
    assert [v for r, v in got if r == 1] == [("first", 1), ("second", 1)]


def test_report_outside_a_rank_says_where_it_belongs():
    from gradwire.launch import report

    with pytest.raises(RuntimeError, match="spawn"):
        report(1)


def test_ranks_see_the_environment_as_it_is_at_spawn(monkeypatch):
    """Ranks start from a fork server that imported torch once; what a fresh process would read
    from the environment (a variable set after the server started, the thread count, torch's
    distributed debug level) is still what the parent has at spawn time."""
    names = ("GRADWIRE_TEST_MARK", "OMP_NUM_THREADS")
    spawn(workers.echo_rank, 2)  # the server is running from here on
    monkeypatch.setenv("GRADWIRE_TEST_MARK", "after")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    seen = spawn(workers.environment_seen, 2, (names,))
    assert all(s["env"] == {"GRADWIRE_TEST_MARK": "after", "OMP_NUM_THREADS": "2"} for s in seen), seen
    assert all(s["threads"] == 2 and s["debug"].endswith("DETAIL") for s in seen), seen
    monkeypatch.delenv("GRADWIRE_TEST_MARK")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    seen = spawn(workers.environment_seen, 2, (names,), env={"GRADWIRE_TEST_MARK": "given"})
    assert all(s["env"]["GRADWIRE_TEST_MARK"] == "given" and s["threads"] == 1 for s in seen), seen
    assert all(s["debug"].endswith("OFF") for s in seen), seen


def test_every_rank_of_every_group_draws_its_own_random_numbers():
    """Forked from one server, ranks would share its random state; like fresh processes, they do not."""
    first, second = spawn(workers.random_state, 2), spawn(workers.random_state, 2)
    seeds = [seed for seed, _ in first + second]
    draws = [draw for _, draw in first + second]
    assert len(set(seeds)) == 4 and len(set(draws)) == 4, (first, second)


def test_free_port_is_below_the_ephemeral_range_and_free_on_every_address(monkeypatch):
    # a port from the ephemeral range can be taken by any outgoing connection before the store binds it (a
    # parallel suite met EADDRINUSE at init_process_group): free_port picks below the range, and checks it
    import socket

    from gradwire import launch

    low = launch._ephemeral_low()
    for _ in range(20):
        port = launch.free_port()
        assert launch._LOWEST_PORT <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
    # taken numbers are passed over; a range that leaves no room falls back to the kernel's choice
    first, second = launch.free_port(), launch.free_port()
    taken = iter([first, second])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("", first))
        monkeypatch.setattr(launch.random.SystemRandom, "randrange", lambda self, a, b: next(taken))
        assert launch.free_port() == second
    monkeypatch.setattr(launch, "_ephemeral_low", lambda: launch._LOWEST_PORT + 10)
    assert launch.free_port() >= launch._LOWEST_PORT + 10
