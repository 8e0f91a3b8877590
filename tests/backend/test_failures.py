"""A peer that dies or stalls, and ops the simulated network cannot finish in time, raise on every rank.

With gloo, survivors of a dead peer raise RuntimeError within seconds; on
gradwire they must too, through DDP's built-in reducer (no comm hook) and
through the backend's Work and future, never crash or hang.
"""
import re

import pytest

from gradwire.launch import spawn
from tests.backend import failure_workers as fw

GROUP_TIMEOUT_S = 3.0
GRACE_S = 5.0  # survivors raise within the group timeout plus this


def _check_survivors(out: dict, world: int) -> list[dict]:
    assert out["died"] is not None, "the victim never reached its step"
    survivors = [out["results"].get(r) for r in range(world - 1)]
    assert all(s is not None for s in survivors), f"a survivor reported nothing (crash or hang): {out}"
    for s in survivors:
        assert "harness_error" not in s, s
        assert s["raised"] is not None, f"a survivor kept training after its peer failed: {s}"
        assert s["runtime_error"], s  # RuntimeError, as gloo raises
        assert s["at"] - out["died"] < GROUP_TIMEOUT_S + GRACE_S, s
    # no survivor died of a signal (the SIGSEGV inside backward)
    assert all(code is None or code >= 0 for code in out["exitcodes"][:-1]), out["exitcodes"]
    return survivors


@pytest.mark.parametrize("world,how", [(2, "exit"), (4, "kill")])
def test_ddp_survivors_of_a_dead_peer_raise(world, how):
    out = fw.run_with_victim(fw.train_until_peer_fails, world, (how, "ddp", GROUP_TIMEOUT_S), timeout=90)
    for s in _check_survivors(out, world):
        assert s["at"] - out["died"] < GRACE_S  # a dead peer closes its sockets: no need to wait for the timeout
        assert re.search(r"[Cc]onnection|peer|[Rr]ead error", s["message"]), s["message"]


def test_survivors_of_a_stalled_peer_raise_after_the_group_timeout():
    # 2 ranks in the suite; benchmarks/failure_timing.py runs 4 ranks and the future path too
    world = 2
    out = fw.run_with_victim(fw.train_until_peer_fails, world, ("stall", "ddp", GROUP_TIMEOUT_S), timeout=90)
    for s in _check_survivors(out, world):
        assert s["at"] - out["died"] > GROUP_TIMEOUT_S - 0.5, s  # not before the timeout: the peer is alive
        assert "Timed out" in s["message"] or "timed out" in s["message"], s["message"]


def test_ops_longer_than_the_group_timeout_raise_in_realtime():
    # 1 MiB all_reduce on 1 Mbit/s: about 8.7 s modelled, against a 1.5 s group timeout
    timeout_s = 1.5
    res = spawn(fw.timeouts, 2, ("bandwidth=1mbit,latency=1ms", timeout_s, 1 << 20, 32 << 10, 0.1), timeout=90)
    for r in res:
        model = r["model"]["all_reduce"]
        for name in ("blocking", "async_wait", "future"):
            err = r[name]["error"]
            assert err is not None, f"{name}: no error"
            kind, is_backend_error, msg = err
            assert is_backend_error or name == "future", err  # the future path re-wraps it as RuntimeError
            assert "all_reduce" in msg and "timed out" in msg and f"{timeout_s:g} s" in msg, msg
            assert timeout_s - 0.1 < r[name]["wall"] < timeout_s + 1.5, (name, r[name])
        # the message names the modelled time of the op
        assert re.search(r"needs (\d+\.\d+) s", r["blocking"]["error"][2])
        assert float(re.search(r"needs (\d+\.\d+) s", r["blocking"]["error"][2]).group(1)) > 8
        # wait(timeout=0.1 s) on a 32 KiB op (~0.27 s) raises at 0.1 s; the op stays in flight and completes
        short = r["wait_short"]
        assert short["error"] is not None and short["error"][1] and "wait(timeout=0.1 s)" in short["error"][2]
        assert 0.08 < short["wall"] < 1.0, short  # an unbounded wait would have returned at ~0.27 s, without error
        assert r["wait_again"]["error"] is None
        assert r["value"] == [3.0, 3.0]
        assert model > 0


def test_ops_longer_than_the_group_timeout_raise_at_once_on_the_simulated_clock():
    timeout_s = 30.0
    res = spawn(fw.timeouts, 2, ("bandwidth=1mbit,latency=1ms,clock=sim", timeout_s, 8 << 20, 4 << 20, 5.0),
                timeout=90)
    for r in res:
        blocking = r["blocking"]
        assert blocking["error"] is not None and blocking["error"][1], blocking
        assert blocking["wall"] < 5, blocking  # no real waiting for the modelled minute
        assert blocking["sim"] == pytest.approx(timeout_s, abs=1.0)  # the simulated clock reached the deadline
        # wait(timeout=5 s) on a ~35 s op: raises in simulated time, at once in wall time
        short = r["wait_short"]
        assert short["error"] is not None and "wait(timeout=5 s)" in short["error"][2], short
        assert short["wall"] < 5 and short["sim"] == pytest.approx(5.0, abs=0.5)
