"""The realtime backend on a network that changes: each op takes what the model of its conditions says,
an outage holds a training's step and it goes on, an outage past the timeout fails every rank."""
from __future__ import annotations

import statistics
import time

import pytest
import torch

from gradwire.launch import spawn
from gradwire.net import NetworkModel

from . import schedule_workers as w

#: slow enough that the modelled time dominates the real collective on a loaded 2-core host
DROP = "bandwidth=200mbit,latency=1ms,drop=20mbit:for=1.5s:at=1s"


@pytest.mark.slow
def test_each_op_takes_the_time_of_the_conditions_it_met() -> None:
    nbytes = 1 << 20
    got = spawn(w.ops_across_a_drop, 2, (DROP, nbytes, 3.5), timeout=90)[0]
    model = NetworkModel(DROP, 2)
    crossing = 0
    for start, seconds in got[1:]:  # the first op also waits for the peer's first call
        expected = model.cost("all_reduce", nbytes, start=start).seconds
        static = model.cost("all_reduce", nbytes, start=0.0).seconds
        if 1.0 - expected < start < 2.5:
            crossing += start < 1.0 or start + expected > 2.5
        # the op ends at max(model, real collective), and its start is read a little after issue
        assert expected * 0.95 - 0.01 <= seconds <= expected * 1.05 + 0.02, (start, seconds, expected, static)
    slow = [s for t, s in got if 1.1 < t < 2.3]
    assert slow and min(slow) > 5 * model.cost("all_reduce", nbytes, start=0.0).seconds
    assert crossing >= 1  # an op that ran across a change was priced piecewise and still matched


@pytest.mark.slow
def test_an_outage_holds_the_step_and_training_goes_on() -> None:
    base = "bandwidth=1gbit,latency=100us"
    plain = spawn(w.ddp_through_an_outage, 2, (base, 40, 30.0), timeout=90)
    # an outage of 1 s in every 3 s: the training meets some wherever its first step falls on a loaded host
    held = spawn(w.ddp_through_an_outage, 2, (base + ",outage=1s:at=1s:every=3s", 40, 30.0), timeout=90)

    def down(t: float) -> bool:
        return t >= 1.0 and (t - 1.0) % 3.0 < 1.0

    for a, b in zip(plain, held):
        assert "error" not in b, b.get("error")
        for x, y in zip(a["params"], b["params"]):
            assert torch.equal(x, y)  # the outage changes when, never what
        # a step that starts in an outage waits for its end (its collectives cannot start before), within 0.2 s
        met = [(s, t) for s, t in zip(b["starts"], b["times"]) if down(s + 0.01)]
        assert met, "the training met no outage"
        for s, t in met:
            left = 1.0 - ((s - 1.0) % 3.0)
            assert t >= left - 0.05, (s, t, left)
        clear = sorted(t for s, t in zip(b["starts"], b["times"]) if not any(down(s + d / 10) for d in range(11)))
        assert clear and clear[len(clear) // 2] < 0.1


@pytest.mark.slow
def test_an_outage_past_the_timeout_fails_every_rank_at_the_timeout() -> None:
    t0 = time.perf_counter()
    outs = spawn(w.ddp_through_an_outage, 2, ("bandwidth=1gbit,latency=100us,outage=20s:at=1s", 30, 2.0),
                 timeout=60)
    for out in outs:
        assert "DistBackendError" in out["error"] and "down from" in out["error"], out["error"]
        # every rank raises within 1 s of its op's timeout (2 s after the work that met the outage began)
        assert 2.0 - 0.05 <= out["raised_after"] <= 3.0, out["raised_after"]
    assert time.perf_counter() - t0 < 30


def test_a_peer_that_ends_in_an_outage_is_heard_only_at_the_timeout() -> None:
    """Ranks that disagree on whether an op met the outage (one issued it just before, on a loaded host): the
    first to time out ends, and its peer's unmatched op still fails with its own timeout, not the closed
    connection, since an outage delivers no packet, a close included."""
    outs = spawn(w.disagree_on_the_outage, 2, ("bandwidth=1gbit,latency=100us,outage=20s:at=1s", 1.5), timeout=60)
    for out in outs:
        assert "DistBackendError" in out["error"] and "down from" in out["error"], out["error"]
        assert 1.5 - 0.05 <= out["raised_after"] <= 2.5, out["raised_after"]


@pytest.mark.slow
@pytest.mark.parametrize("congestion, restarts", [("cubic", True), ("bbr", False)])
def test_tcp_restarts_its_window_after_an_idle_longer_than_the_rto(congestion: str, restarts: bool) -> None:
    """A WAN link (50 ms RTT): after 1 s of quiet (> RTO = srtt + 200 ms) CUBIC slow-starts again, BBR does not."""
    net = f"bandwidth=100mbit,latency=25ms,congestion={congestion}"
    nbytes = 1 << 20
    got = spawn(w.warm_and_after_idle, 2, (net, nbytes, 1.0), timeout=90)[0]
    model = NetworkModel(net, 2)
    warm = model.cost("all_reduce", nbytes, idle=0.0).seconds
    cold = model.cost("all_reduce", nbytes, idle=got["idle"]).seconds  # the quiet the link really saw
    assert got["warm"] == pytest.approx(warm, rel=0.05, abs=0.01)
    if restarts:
        assert cold > 1.3 * warm
        assert got["after_idle"] == pytest.approx(cold, rel=0.05, abs=0.01)
    else:
        assert cold == pytest.approx(warm)
        assert got["after_idle"] == pytest.approx(warm, rel=0.05, abs=0.01)


@pytest.mark.slow
def test_two_jobs_on_one_named_link_share_it_and_one_alone_has_all_of_it() -> None:
    import threading
    import uuid

    net = f"bandwidth=50mbit,latency=1ms,protocol=none,link=test-{uuid.uuid4().hex[:8]}"
    nbytes = 1 << 20
    alone = NetworkModel(net, 2).cost("all_reduce", nbytes).seconds
    solo = spawn(w.ops_on_a_shared_link, 2, (net, nbytes, 6), timeout=90)[0]
    assert statistics.median(solo) == pytest.approx(alone, rel=0.1)
    both: list[list[float]] = []

    def job() -> None:
        both.append(spawn(w.ops_on_a_shared_link, 2, (net, nbytes, 12), timeout=120)[0])

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(both) == 2
    for ops in both:  # while both send, each op gets half the link (the first may start alone)
        assert statistics.median(ops[2:-2]) == pytest.approx(2 * alone, rel=0.1), ops


def test_the_group_says_what_link_its_model_has_now_and_when_it_next_changes() -> None:
    # what ``auto`` reads on the simulated backend: alpha and beta of the condition now, seconds to its next change;
    # read in the middle of a drop's window and of the link's own, whenever the group's start left the clock
    net = "bandwidth=200mbit,latency=1ms,drop=20mbit:for=1s:every=2s"
    got = spawn(w.network_now_across_a_drop, 2, (net, 2.0, [0.5, 1.5, 0.5, 1.5]), timeout=60)[0]
    model = NetworkModel(net, 2)
    nbytes = 1 << 22
    betas: dict[bool, list[float]] = {True: [], False: []}
    for t, alpha, beta, change in got:
        cond, edge = model.condition(t)
        now = model.at(cond)  # the condition held (an op of 4 MiB may outlast it)
        assert alpha == pytest.approx(now.cost("all_reduce", 4).seconds)
        assert alpha + beta * nbytes == pytest.approx(now.cost("all_reduce", nbytes).seconds)  # 2 ranks: the bus bytes
        assert change == pytest.approx(edge - t, abs=0.05)
        betas[cond.bandwidth is not None].append(beta)
    (fast, *_), (slow, *_) = betas[False], betas[True]  # each phase read at least once
    assert slow == pytest.approx(10 * fast, rel=0.05) and all(b == pytest.approx(fast) for b in betas[False])
