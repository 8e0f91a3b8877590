"""The comparison's books, shared by the bundled models and a script: one process, no training."""
from __future__ import annotations

import json

import pytest

from gradwire.compare.ledger import Ledger, rotation
from gradwire.compare.processes import ComparisonStopped
from gradwire.compare.results import FAILED, SeedResult

RUNS = [("net", "compute-only"), ("net", "sync"), ("net", "fp16")]


def test_rotation_rounds_by_seed_each_rotated():
    assert rotation(RUNS[:2], (0, 1)) == [("net", "compute-only", 0), ("net", "sync", 0),
                                          ("net", "sync", 1), ("net", "compute-only", 1)]


def test_books_as_trainings_end_drop_a_failed_runs_seeds_and_keep_an_earlier_comparison(tmp_path):
    events = []
    ledger = Ledger(tmp_path, ("results.json",), {"mode": "script"}, RUNS, (0, 1, 2), events.append)
    saved = lambda: {r["strategy"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}  # noqa: E731
    assert all(r["status"] == "not finished" and r["error"] == "not run yet" for r in saved().values())
    ledger.ok("net", "sync", SeedResult(0, seconds=2.0), 2.0, note="moved x")
    assert saved()["sync"]["error"] == "not finished: 1 of 3 seeds so far" and not saved()["sync"]["ok"]
    ledger.not_ok("net", "fp16", 0, FAILED, "RuntimeError: boom", 1.0)
    assert (events[0].ok, events[0].note) == (True, "moved x")
    assert (events[1].status, events[1].dropped) == (FAILED, 2)  # its seeds 1 and 2 will not run
    assert not ledger.pending("net", "fp16") and ledger.pending("net", "sync")
    for seed in (1, 2):
        ledger.ok("net", "sync", SeedResult(seed, seconds=2.0), 2.0)
    assert saved()["sync"]["ok"] and ledger.runs[("net", "sync")].seconds == 6.0
    ledger.stop("a training modified a.pt", "003-sync-seed1")
    assert not ledger.pending("net", "compute-only")
    assert saved()["compute-only"]["error"] == 'not run: the comparison stopped after 003-sync-seed1 (see "stopped")'
    (tmp_path / "runs").mkdir()
    Ledger(tmp_path, ("results.json",), {"mode": "script"}, RUNS, (0,))
    (kept,) = tmp_path.glob("previous-*")
    assert json.loads((kept / "results.json").read_text())["stopped"] == "a training modified a.pt"
    assert (kept / "runs").is_dir() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), ComparisonStopped(15)])
def test_an_interrupt_keeps_what_finished_and_marks_the_rest(tmp_path, stop):
    ledger = Ledger(tmp_path, ("results.json",), {}, RUNS, (0, 1))
    with pytest.raises(KeyboardInterrupt):
        with ledger.running():
            ledger.ok("net", "compute-only", SeedResult(0), 1.0)
            ledger.ok("net", "compute-only", SeedResult(1), 1.0)
            ledger.ok("net", "sync", SeedResult(0), 1.0)
            raise stop
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["interrupted"] is True
    assert [(r["ok"], r["finished"], r["error"]) for r in saved["runs"]] == [
        (True, True, ""), (False, False, "interrupted after 1 of 2 seeds"), (False, False, "interrupted after 0 of 2 seeds")]
