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


def hang_cmd(pids: Path, marker: Path | None = None) -> list[str]:
    """torchrun, 2 ranks of hang_ddp.py; with ``marker`` only the first start hangs."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", HANG, str(pids),
            *([str(marker)] if marker else [])]


@pytest.mark.slow
def test_a_timed_out_torchrun_job_leaves_no_process(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "out"
    try:
        # compute-only (the first training) hangs; sync, the second, fails at once
        main(["compare", "--strategies", "sync", "--timeout", "20", "--out", str(out), "--",
              *hang_cmd(pids, tmp_path / "marker")])
        assert len(os.listdir(pids)) == 5, os.listdir(pids)  # the launcher, 2 ranks and a child of each
        left = noted(pids)
        assert not left, [(p.pid, p.cmdline()) for p in left]
        runs = {r["strategy"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
        assert "timed out after 20 s" in runs["compute-only"]["error"]
        assert runs["sync"]["error"].startswith("exit code 1")
    finally:
        kill_noted(pids)
