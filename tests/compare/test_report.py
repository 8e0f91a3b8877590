"""The comparison table from hand-made runs: every figure worked out by hand (one process)."""
from __future__ import annotations

import math

import pytest

from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.report import rows_of, to_markdown

MiB = 2**20


def _seed(epochs, accuracy, wire, steps, compute, test=0.9):
    return {"epoch_seconds": epochs, "epoch_accuracy": accuracy, "test_accuracy": test, "wire_bytes": wire,
            "step_seconds": steps, "step_compute": compute}


def _results() -> dict:
    run = lambda strategy, net, seeds: {"strategy": strategy, "net": net, "ok": True, "seeds": seeds}  # noqa: E731
    return {
        "config": {"target_accuracy": 0.9, "strategies": ["sync", "fp16"]},
        "runs": [
            run(COMPUTE_ONLY, "100mbit", [_seed([1.0, 1.0], [0.5, 0.6], 0, [0.010, 0.010], [0.010, 0.010])]),
            run("sync", "100mbit", [
                _seed([2.0, 2.2], [0.80, 0.95], 100 * MiB, [0.030, 0.034], [0.012, 0.012], 0.95),
                _seed([1.9, 2.1], [0.91, 0.93], 100 * MiB, [0.030, 0.034], [0.012, 0.012], 0.93),
            ]),
            run("fp16", "100mbit", [_seed([1.0, 1.5], [0.85, 0.93], 50 * MiB, [0.020, 0.020], [0.015, 0.015])]),
            {"strategy": "onebit", "net": "100mbit", "ok": False, "error": "Traceback ...\nRuntimeError: boom\n",
             "seeds": []},
        ],
    }


def test_rows_are_the_runs_averaged_and_set_against_the_baseline() -> None:
    rows = {r.strategy: r for r in rows_of(_results())}
    sync, fp16, ideal = rows["sync"], rows["fp16"], rows[COMPUTE_ONLY]
    # sync: epochs (2.0 + 2.2) / 2 = 2.1 and (1.9 + 2.1) / 2 = 2.0 -> 2.05 s; 100 MiB over 2 epochs -> 50 MiB
    assert sync.epoch_seconds == pytest.approx(2.05)
    assert sync.wire_mb_per_epoch == pytest.approx(50.0)
    assert sync.speedup == pytest.approx(1.0) and sync.reduction == pytest.approx(1.0)
    assert sync.step_ms == pytest.approx(32.0)
    # accuracy: mean, min, max of the seeds' test accuracies; 0.9 reached after 4.2 s and 1.9 s
    assert (sync.accuracy_mean, sync.accuracy_min, sync.accuracy_max) == pytest.approx((0.94, 0.93, 0.95))
    assert sync.time_to_target == pytest.approx((4.2 + 1.9) / 2) and (sync.reached, sync.seeds) == (2, 2)
    # fp16: 1.25 s per epoch -> 2.05 / 1.25 = 1.64x; 25 MiB per epoch -> 2x fewer bytes
    assert fp16.epoch_seconds == pytest.approx(1.25)
    assert fp16.speedup == pytest.approx(1.64)
    assert fp16.reduction == pytest.approx(2.0)
    assert fp16.time_to_target == pytest.approx(2.5) and fp16.reached == 1
    # the same work without a network: 2.05 / 1.0
    assert fp16.ideal_speedup == pytest.approx(2.05) and ideal.ideal_speedup == pytest.approx(2.05)
    # step breakdown against compute-only's 10 ms: fp16 computes 15 ms (5 ms its own), steps 20 ms (5 exposed)
    assert (fp16.compute_ms, fp16.overhead_ms, fp16.exposed_ms) == pytest.approx((10.0, 5.0, 5.0))
    assert fp16.exposed_share == pytest.approx(0.25)
    # sync: compute 12 ms (2 overhead), steps 32 ms: 20 exposed
    assert (sync.overhead_ms, sync.exposed_ms, sync.exposed_share) == pytest.approx((2.0, 20.0, 20 / 32))
    # compute-only reaches no target: never 0.9
    assert ideal.time_to_target is None and ideal.reached == 0
    failed = rows["onebit"]
    assert not failed.ok and failed.error == "RuntimeError: boom" and math.isnan(failed.speedup)


def test_markdown_shows_the_figures() -> None:
    text = to_markdown(rows_of(_results()), 0.9)
    assert "network `100mbit` (time to accuracy 0.90)" in text
    line = next(l for l in text.splitlines() if l.startswith("| fp16 "))
    assert line.split(" | ")[1:5] == ["1.250", "1.64x", "25.00", "2.0x"]
    assert "0.9000 [0.900, 0.900]" in line and "2.50 (1/1)" in line and "25%" in line
    assert "RuntimeError: boom" in next(l for l in text.splitlines() if l.startswith("| onebit "))
