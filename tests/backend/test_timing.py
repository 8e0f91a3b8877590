"""Realtime completion, overlap, virtual clock and faults of the gradwire backend.

Networks here are slow enough that the modelled time dominates the machine's
own noise (see shared facts: small messages are CPU-bound on 2 cores).
"""
import pytest

from gradwire.launch import RankError, spawn
from tests.backend import workers


def test_blocking_allreduce_takes_modelled_time():
    res = spawn(workers.timed_allreduce, 2, ("gradwire", "bandwidth=100mbit,latency=1ms", 1 << 20, 3), timeout=90)
    model = res[0]["stats"]["all_reduce"]["model_seconds"] / res[0]["stats"]["all_reduce"]["calls"]
    assert model > 0.05
    assert res[0]["median"] == pytest.approx(model, rel=0.15)


def test_async_ops_queue_on_the_link_and_hide_compute():
    # 8 ops of 1 MiB at 100 Mbit/s: ~88 ms each on the link
    res = spawn(workers.overlap, 2, ("bandwidth=100mbit,latency=50us", 8, 1 << 20, 0.0), timeout=90)[0]
    assert res["issued"] < 0.05, "issuing async ops must not block"
    assert res["total"] == pytest.approx(8 * res["model_per_op"], rel=0.15)
    res2 = spawn(workers.overlap, 2, ("bandwidth=100mbit,latency=50us", 8, 1 << 20, 0.4), timeout=90)[0]
    # 0.4 s of compute between issue and wait is hidden behind ~0.7 s of transfers
    assert res2["total"] == pytest.approx(res["total"], rel=0.15)


def test_virtual_clock_does_not_wait():
    res = spawn(workers.timed_allreduce, 2, ("gradwire", "bandwidth=10mbit,latency=1ms,clock=virtual", 1 << 20, 5), timeout=90)
    model = res[0]["stats"]["all_reduce"]["model_seconds"] / res[0]["stats"]["all_reduce"]["calls"]
    assert model > 0.5
    assert res[0]["median"] < 0.1 * model


def test_virtual_clock_overlaps_isend_with_the_next_recv():
    # Rank 0's isend finishes for real during its pause, before it issues its recv: in virtual time
    # the two still overlap on the full-duplex link (one transfer, not two; the pause is real time).
    pause = 0.05
    res = spawn(workers.virtual_sendrecv, 2, ("bandwidth=10mbit,latency=1ms,clock=virtual", 1 << 20, pause), timeout=90)
    model = res[0]["model_per_op"]
    assert model > 0.8
    assert res[0]["elapsed"] == pytest.approx(model + pause, abs=0.1)
    assert res[1]["elapsed"] == pytest.approx(model, abs=0.1)


def test_rank_dying_mid_collective_raises_on_the_others():
    with pytest.raises(RankError):
        spawn(workers.die_mid_collective, 2, timeout=60)
