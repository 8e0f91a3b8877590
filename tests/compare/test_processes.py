"""Every process of a training ends when it times out: torchrun's workers in their own sessions, their children."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from gradwire.cli.main import main

HANG = str(Path(__file__).parent / "hang_ddp.py")


def noted(folder: Path) -> list[psutil.Process]:
    """The processes hang_ddp.py wrote down that are still running (same pid and start time, not a zombie)."""
    alive = []
    for name in os.listdir(folder):
        pid, started = name.split("-", 1)
        try:
            p = psutil.Process(int(pid))
            if p.create_time() == float(started) and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def kill_noted(folder: Path) -> None:
    """However the test ends, nothing it started stays (by pid and start time, never by name)."""
    for p in noted(folder):
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(noted(folder), timeout=5)


def hang_cmd(pids: Path, hang_under: str) -> list[str]:
    """torchrun, 2 ranks of hang_ddp.py, hung under ``hang_under``."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", HANG, str(pids), hang_under]


def test_the_default_time_limit_is_derived_from_the_baseline():
    from gradwire.compare.script import FIRST_TIMEOUT, training_timeout

    assert training_timeout(30.0, [1000.0]) == (30.0, "--timeout")  # given: as given
    assert training_timeout(None, [])[0] == FIRST_TIMEOUT  # the baseline trains first, under the old cap
    limit, rule = training_timeout(None, [20.0, 50.0])
    assert limit == 200.0 and "4 x the baseline's 50 s, at least 120 s" in rule  # its slowest seed
    assert training_timeout(None, [3.0])[0] == 120.0  # a floor for start-up and a loaded machine


@pytest.mark.slow
def test_a_hung_torchrun_job_times_out_and_leaves_no_process(tmp_path, monkeypatch):
    from gradwire.compare import script

    monkeypatch.setattr(script, "TIMEOUT_FLOOR", 5.0)  # the rule as it is, on a short scale
    monkeypatch.setattr(script, "TIMEOUT_FACTOR", 1.5)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # a working directory of its own (the pids folder is not in it)
    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "out"
    try:
        # sync trains (no compute-only before it); fp16 hangs and is stopped at 1.5 x sync's measured time
        # (at least 5 s)
        rc = main(["compare", "--no-ideal", "--strategies", "sync,fp16", "--out", str(out), "--",
                   *hang_cmd(pids, "fp16")])
        assert len(os.listdir(pids)) == 5, os.listdir(pids)  # the launcher, 2 ranks and a child of each
        left = noted(pids)
        assert not left, [(p.pid, p.cmdline()) for p in left]
    finally:
        kill_noted(pids)
    assert rc == 1
    saved = json.loads((out / "results.json").read_text())
    runs = {r["strategy"]: r for r in saved["runs"]}
    assert list(runs) == ["sync", "fp16"] and runs["sync"]["ok"]
    limit = max(5.0, 1.5 * runs["sync"]["seeds"][0]["seconds"])
    fp16 = runs["fp16"]
    assert fp16["status"] == "timed out" and not fp16["ok"] and fp16["finished"], fp16
    assert fp16["error"].startswith(f"timed out after {limit:.0f} s (1.5 x the baseline's"), fp16["error"]
    row = next(r for r in saved["rows"] if r["strategy"] == "fp16")
    assert row["status"] == "timed out" and row["error"] == fp16["error"].splitlines()[0]
    assert "| fp16 | TIMED OUT |" in (out / "table.md").read_text()
