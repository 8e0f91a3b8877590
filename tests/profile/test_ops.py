"""`gradwire profile --ops` records a DDP script's ops; `device=profile:DIR` replays them on the simulated clock."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.launch import free_port

HERE = Path(__file__).parent


def _profile(net: str, out: Path, *extra: str, width: int = 64) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPS_DDP_WIDTH=str(width))
    cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", net, "--out", str(out), *extra, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", f"--master-port={free_port()}",
           str(HERE / "ops_ddp.py")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110)


def _ok(proc: subprocess.CompletedProcess) -> bool:  # gloo's teardown abort after the records were written
    return proc.returncode == 0 or "terminate called without an active exception" in proc.stderr


def test_record_then_replay_on_the_simulated_clock(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    proc = _profile("1gbe", rec, "--ops", "--ops-steps", "2")
    assert _ok(proc), proc.stderr[-3000:]
    recording = json.loads((rec / "ops" / "cpu.json").read_text())
    assert recording["world_size"] == 2 and recording["steps_recorded"] == 2 and recording["clean_steps"] >= 1
    assert recording["model"]["parameters"] == 32 * 64 + 64 + 64 * 10 + 10 and recording["batch"] == 16
    assert recording["device"]["kind"] == "cpu" and recording["torch"]
    assert recording["ops_per_step"] > 10 and recording["step_seconds"] >= recording["compute_seconds"] > 0
    assert f"device=profile:{rec}" in proc.stdout

    rep = tmp_path / "rep"
    proc = _profile(f"1gbe,clock=sim,device=profile:{rec}", rep)
    assert _ok(proc), proc.stderr[-3000:]
    ranks = [json.loads((rep / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(s["step"] > 0 for r in ranks for s in r["steps"])
    # each rank computes as its recorded rank did (one clean step: one factor per rank), the same ops priced alike
    factors = [recording["step_factors"][str(r)][0] for r in (0, 1)]
    computes = [[s["step"] - s["backward_wait"] - s["waited"] for s in r["steps"][1:]] for r in ranks]
    assert all(b / a == pytest.approx(factors[1] / factors[0], rel=1e-3) for a, b in zip(*computes))

    from gradwire.backend.simclock import SimClock
    from gradwire.device import parse_device

    clock = SimClock()  # another model at its first forward, in this process: refused in one line
    clock.enable(parse_device(f"profile:{rec}"))
    try:
        import torch

        other = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        try:
            other(torch.randn(2, 32))
            raise AssertionError("another model was not refused")
        except ValueError as exc:
            assert "was recorded on another model" in str(exc) and "\n" not in str(exc)
    finally:
        clock.disable()
