"""Ctrl-C on `gradwire compare`: one line, finished trainings kept, unfinished runs never marked good."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.slow
def test_ctrl_c_keeps_finished_runs_and_marks_the_rest(tmp_path):
    out = tmp_path / "cmp"
    # compute-only (no network) trains first and fast; sync waits for a 10 ms network on this host's clock,
    # 430 steps of at least 20 ms each: many seconds
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradwire.cli.main", "compare", "--workers", "2", "--model", "tiny", "--epochs", "10",
         "--batch-size", "16", "--seeds", "1", "--strategies", "sync", "--net", "bandwidth=100mbit,latency=10ms",
         "--clock", "realtime", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # a shell without job control starts background jobs with SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler: give the child a terminal's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    saved_path = out / "results.json"

    def compute_only_done() -> bool:  # results.json is rewritten after every training
        try:
            runs = json.loads(saved_path.read_text())["runs"]
        except (OSError, ValueError, KeyError):
            return False
        return any(r["strategy"] == "compute-only" and r.get("ok") for r in runs)

    try:
        deadline = time.monotonic() + 100
        while not compute_only_done() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert compute_only_done(), "compute-only did not finish in 100 s"
        time.sleep(1.0)  # sync is training now
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("gradwire compare: interrupted; 1 of 2 trainings finished"), err
    assert not stdout  # no table for an unfinished comparison
    saved = json.loads((out / "results.json").read_text())
    assert saved["interrupted"] is True
    runs = {r["strategy"]: r for r in saved["runs"]}
    assert runs["compute-only"]["ok"] and runs["compute-only"]["finished"] and len(runs["compute-only"]["seeds"]) == 1
    assert not runs["sync"]["ok"] and not runs["sync"]["finished"] and runs["sync"]["seeds"] == []
    assert runs["sync"]["error"] == "interrupted after 0 of 1 seeds"
    for r in saved["runs"]:
        assert not (r["ok"] and not r["seeds"])  # never "ok" without a trained seed


def test_unfinished_run_shows_as_not_finished_in_the_table():
    from gradwire.compare.report import rows_of, to_markdown
    from gradwire.compare.results import Results

    results = Results.from_json({"config": {"target_accuracy": 0.9, "strategies": ["sync"]}, "runs": [
        {"strategy": "sync", "net": "1gbe", "ok": False, "finished": False, "seeds": [],
         "error": "interrupted after 0 of 3 seeds"}]})
    (row,) = rows_of(results)
    assert not row.ok and not row.finished
    assert "NOT FINISHED" in to_markdown([row], 0.9) and "interrupted after 0 of 3 seeds" in to_markdown([row], 0.9)


@pytest.mark.slow
def test_sigterm_stops_every_process_of_a_hung_torchrun_job(tmp_path):
    """torchrun puts each worker in a session of its own: SIGTERM to compare must still end them all, and their children."""
    from tests.compare.test_processes import hang_cmd, kill_noted, noted

    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "cmp"
    (tmp_path / "cwd").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradwire.cli.main", "compare", "--strategies", "sync", "--timeout", "600",
         "--out", str(out), "--", *hang_cmd(pids, "sync")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path / "cwd")
    try:
        deadline = time.monotonic() + 90
        while len(os.listdir(pids)) < 5 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(os.listdir(pids)) == 5, proc.communicate(timeout=30)  # the launcher, 2 ranks, a child of each
        time.sleep(0.5)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # compare itself only, as `kill PID` does
        stdout, err = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
        assert len(os.listdir(pids)) == 5  # still there to check (the pids folder is outside the working directory)
        left = noted(pids)
        assert not left, [(p.pid, p.cmdline()) for p in left]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_noted(pids)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 15, took  # SIGTERM, a 3 s grace, SIGKILL: within seconds
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "gradwire compare: interrupted by SIGTERM; 0 of 2 trainings finished"), err
    saved = json.loads((out / "results.json").read_text())
    assert saved["interrupted"] is True and not any(r["ok"] for r in saved["runs"])
