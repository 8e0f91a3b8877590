"""Realtime completion, overlap, virtual clock and faults of the gradwire backend.

Networks here are slow enough that the modelled time dominates the machine's
own noise (see shared facts: small messages are CPU-bound on 2 cores).
"""
import re

import pytest

from gradwire.launch import spawn
from tests import workers as workers_common
from tests.backend import timing_workers, workers


def test_blocking_allreduce_takes_modelled_time():
    res = spawn(workers.timed_allreduce, 2, ("gradwire", "bandwidth=100mbit,latency=1ms", 1 << 20, 3), timeout=90)
    model = res[0]["stats"]["all_reduce"]["model_seconds"] / res[0]["stats"]["all_reduce"]["calls"]
    assert model > 0.05
    assert res[0]["median"] == pytest.approx(model, rel=0.15)


def test_async_ops_queue_on_the_link_and_hide_compute():
    # 8 ops of 1 MiB at 100 Mbit/s: ~88 ms each on the link, ~0.7 s together; both phases in one run,
    # every figure a ratio of that run's own times (a loaded 2-core machine slows both alike)
    n_ops = 8
    res = spawn(timing_workers.overlap_in_one_run, 2, ("bandwidth=100mbit,latency=50us", n_ops, 1 << 20, 0.4),
                timeout=90)[0]
    wait, compute = res["wait"], res["compute"]
    assert wait["calls"] == compute["calls"] == n_ops
    per_op = wait["model"] / n_ops
    assert per_op > 0.05
    # issuing does not wait for the link: blocking per op would take the whole phase
    assert wait["issued"] < 0.25 * wait["total"] and compute["issued"] < 0.25 * compute["total"]
    # the ops queue one after another on the link (in parallel they would take ~1/8 of this)
    assert 0.9 < wait["total"] / (n_ops * per_op) < 1.3
    # 0.4 s of other work between issue and wait hides behind ~0.7 s of transfers (not hidden: ~1.57)
    assert compute["total"] / wait["total"] < 1.3


def test_virtual_clock_does_not_wait():
    res = spawn(workers.timed_allreduce, 2, ("gradwire", "bandwidth=10mbit,latency=1ms,clock=virtual", 1 << 20, 5), timeout=90)
    model = res[0]["stats"]["all_reduce"]["model_seconds"] / res[0]["stats"]["all_reduce"]["calls"]
    assert model > 0.5
    assert res[0]["median"] < 0.1 * model


def test_sim_clock_overlaps_isend_with_the_next_recv():
    # Rank 0's isend finishes for real during its pause, before it issues its recv: on the simulated
    # clock the two still overlap on the full-duplex link (one transfer, not two). The pause is a sleep:
    # no CPU time, so no compute on the host device.
    pause = 0.05
    res = spawn(workers.virtual_sendrecv, 2, ("bandwidth=10mbit,latency=1ms,clock=sim", 1 << 20, pause), timeout=90)
    model = res[0]["model_per_op"]
    assert model > 0.8
    # one transfer each way, not two in a row (2 x model): bounds in units of the run's own model time
    assert 0.95 * model <= res[0]["elapsed"] < 1.3 * model
    assert 0.95 * model <= res[1]["elapsed"] < 1.3 * model


def test_survivor_of_a_dead_peer_raises_at_once():
    """A peer dies between two collectives: the survivor's next all_reduce raises the inner group's
    connection error well before the group's timeout (40 s), instead of hanging."""
    survivor, peer = spawn(workers_common.survivor_of_a_dead_peer, 2, ("gradwire", "1gbe", 40.0), timeout=90)
    assert peer == {"child_exit": 3}
    assert survivor["raised"] is not None and survivor["is_runtime_error"], survivor
    assert re.search(r"Connection (closed|reset) by peer", survivor["message"]), survivor
    assert survivor["seconds"] < 10, survivor


def test_groups_over_the_same_ranks_share_one_link():
    """Two groups of the same 2 ranks send 4 MiB each at once on 100 Mbit/s (~0.35 s each): the NIC is one,
    so the second completes about one op-time after the first, not with it."""
    res = spawn(timing_workers.two_groups_same_ranks, 2, ("bandwidth=100mbit,latency=50us", 4 << 20), timeout=90)
    for r in res:
        (g1, start1, done1, op1), (g2, start2, done2, op2) = r["model"]
        assert g1 != g2 and op1 == pytest.approx(op2) and op1 > 0.3
        assert start2 == pytest.approx(done1, abs=0.02)  # queued behind the other group's op
        # wall clock: the first at ~1 op-time, the second at ~2
        assert r["first"] == pytest.approx(op1, rel=0.25)
        assert r["second"] - r["first"] > 0.7 * op1, r


def test_links_are_shared_by_equal_rank_sets_only():
    from gradwire.backend.link import link_for

    model = object()
    assert link_for(model, (0, 1)) is link_for(model, [1, 0])
    assert link_for(model, (0, 1)) is not link_for(model, (0, 1, 2))
    assert link_for(model, (0, 1)) is not link_for(object(), (0, 1))  # a new world starts on idle links
