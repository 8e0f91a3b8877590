"""The simulated cluster clock (``clock=sim``): compute from the device model, communication from the
network model, overlap credited where the rank observes a completion; nothing read from the wall clock."""
from __future__ import annotations

import pytest

from gradwire.launch import spawn
from tests.backend import sim_workers


def test_compute_between_issue_and_wait_overlaps_the_transfer() -> None:
    for matmuls in (2, 400):  # compute shorter, then longer, than the transfer
        res = spawn(sim_workers.overlap, 2, (matmuls,), timeout=120)
        for r in res:
            assert r["value"] == 2.0
            assert r["computed"] == pytest.approx(r["compute"], rel=0.02)  # the roofline's price, not this host's
            # max(compute, comm) plus the op's start after the barrier, never their sum
            assert r["total"] == pytest.approx(max(r["computed"], r["model"]), rel=0.05), (matmuls, r)


def test_a_collective_starts_when_the_last_rank_issues_it() -> None:
    res = spawn(sim_workers.late_peer, 2, (200,), timeout=120)
    late = res[1]["late"]
    assert late > 0.004 and res[0]["late"] < 1e-3
    for r in res:  # rank 0 waits for rank 1's compute, then the transfer: the ranks agree on the instant
        assert r["total"] == pytest.approx(late + r["model"], rel=0.02), r


@pytest.mark.parametrize("strategy", ["sync", "onebit+delayed"])
def test_the_same_training_gives_the_same_times(strategy: str) -> None:
    """Two runs of a training on a roofline device: every step's time equal, whatever the host did meanwhile."""
    net = "bandwidth=500mbit,latency=100us,clock=sim,device=cpu-core"
    first, second = (spawn(sim_workers.train, 2, (net, strategy, 12), timeout=180) for _ in range(2))
    for a, b in zip(first, second):
        assert a["steps"] == pytest.approx(b["steps"], rel=1e-9)
        assert a["exposed"] == pytest.approx(b["exposed"], rel=1e-9, abs=1e-12)
    assert first[0]["checksum"] == first[1]["checksum"]  # the ranks hold the same model


def test_a_scripts_own_timers_read_the_simulated_clock_when_asked() -> None:
    from gradwire.backend.simclock import TIME_ENV

    (seen,) = spawn(sim_workers.own_timers, 1, (50,), timeout=120, env={TIME_ENV: "1"})
    assert seen["perf"] == pytest.approx(seen["priced"], rel=0.02)
    assert seen["time"] == pytest.approx(seen["priced"], rel=0.02)
    assert seen["other_thread_is_real"]  # the backend's threads keep the real clocks


def test_trainings_in_turns_in_one_set_of_processes_time_alike() -> None:
    """compare trains its strategies in turns in one set of processes: a training's clock starts afresh."""
    from gradwire.train.loop import TrainConfig, run_in_turns

    net = "bandwidth=500mbit,latency=100us,clock=sim,device=cpu-core"
    configs = [TrainConfig(strategy=s, net=net, model="cnn", epochs=1, max_steps=6)
               for s in ("onebit", "torch-powersgd:4", "onebit")]
    first, _, again = run_in_turns(configs, 2, timeout=300)
    for a, b in zip(first, again):
        assert a.step_seconds == pytest.approx(b.step_seconds, rel=1e-9)
        # the first step's instant on the schedule: the set-up after the group's t = 0 (building the model, DDP's
        # first broadcast; the first training of a set also reads the data)
        assert a.first_step_at is not None and b.first_step_at is not None
        assert 0 < b.first_step_at <= a.first_step_at < 0.05


@pytest.mark.parametrize("late", [False, True], ids=["chained-in-flight", "chained-when-done"])
def test_a_callbacks_wait_for_the_collective_it_issued_is_seen(late: bool) -> None:
    """PyTorch's PowerSGD hook issues its P all_reduce in a callback, waits for it on its future, then computes
    Q: on the clock that compute starts at the P all_reduce's end, as on a GPU, not at its issue. The same
    when the callback is chained on a future that is done already (torch runs it at once, on the training
    thread): which of the two happens depends on the host's speed, the clock's reading must not."""
    for r in spawn(sim_workers.callback_wait, 2, (100, late), timeout=120):
        assert r["value"] == 2.0
        transfer = r["issued"]  # the first all_reduce of the same size, from the barrier
        assert transfer > 0.3, r  # 4 MiB at 100 Mbit/s: about 0.34 s
        assert r["waited"] - r["issued"] == pytest.approx(transfer, rel=0.05), r
        assert r["computed"] - r["waited"] == pytest.approx(r["priced"], rel=0.02), r


def test_one_bucket_at_a_time_starts_a_hook_when_the_previous_exchange_ended() -> None:
    """PyTorch's PowerSGD runs one bucket at a time (:func:`~gradwire.exchange.futures.one_bucket_at_a_time`);
    its future is a ``then`` of a ``then``, which carries no instant of the clock's: the next bucket's hook
    still starts at the previous exchange's end, as in real time, whichever thread runs it."""
    for r in spawn(sim_workers.chained_hooks, 2, (), timeout=120):
        assert r["value"] == 2.0
        first, second = r["starts"]
        assert first == pytest.approx(0.0, abs=1e-3)
        assert second > 0.3, r  # a 4 MiB all_reduce at 100 Mbit/s: about 0.34 s


@pytest.mark.parametrize("late", [False, True], ids=["chained-in-flight", "chained-when-done"])
def test_a_callbacks_wait_for_a_collective_that_times_out_raises_the_timeout(late: bool) -> None:
    """The future a callback waits on carries the op's own error, as ``Work.wait()`` (and gloo) raise it,
    whichever thread runs the callback."""
    for r in spawn(sim_workers.callback_wait_fails, 2, (late,), timeout=120):
        assert r.get("error") == "DistBackendError", r
        assert "timed out" in r["message"]
