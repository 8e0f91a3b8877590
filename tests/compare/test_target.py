"""A target set by the baseline, the bytes to it, per-step bursts and a strategy's own arguments (one process)."""
from __future__ import annotations

import math

import pytest

from gradwire.compare.child import _per_step
from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.report import relative_target, rows_of, to_markdown
from gradwire.compare.results import Curve, Results, Run, SeedResult
from gradwire.compare.script import ScriptConfig, parse_strategy_args

KiB = 1024


def _seed(step_ms: float, step_bytes: list[float], curve: list[float], final: float) -> SeedResult:
    """Steps of ``step_ms``; a val loss at steps 2, 4, 6, ...; the bytes of each step."""
    n = len(step_bytes)
    steps = list(range(2, n + 1, 2))
    return SeedResult(0, step_seconds=[step_ms / 1e3] * n, steps=n, wire_bytes=sum(step_bytes),
                      step_wire_bytes=step_bytes, metrics={"val_loss": final},
                      curves={"val_loss": Curve([s * step_ms / 1e3 for s in steps], curve, steps)})


def _results() -> Results:
    cfg = {"mode": "script", "strategies": ["sync", "diloco:4"], "metric": "val_loss", "target_within": 0.02}
    return Results(cfg, "", [
        Run(COMPUTE_ONLY, "wan", "ok", seeds=[_seed(10, [0] * 8, [2.0, 1.5, 1.2, 1.1], 1.1)]),
        # sync: 100 ms steps, 8 KiB each; final 1.00 -> target 1.02, reached at step 6 (0.6 s, 48 KiB)
        Run("sync", "wan", "ok", seeds=[_seed(100, [8 * KiB] * 8, [1.8, 1.3, 1.01, 1.00], 1.00)]),
        # diloco:4 over 16 steps of 20 ms: a round of 8 KiB every 4th step; 1.02 reached at step 12 (0.24 s, 24 KiB)
        Run("diloco:4", "wan", "ok", seeds=[_seed(20, [0, 0, 0, 8 * KiB] * 4,
                                                  [2.0, 1.6, 1.4, 1.2, 1.1, 1.02, 1.015, 1.01], 1.01)]),
    ])


def test_the_target_is_the_baselines_final_widened_and_each_row_is_set_against_it() -> None:
    rows = {r.strategy: r for r in rows_of(_results())}
    sync, diloco, ideal = rows["sync"], rows["diloco:4"], rows[COMPUTE_ONLY]
    assert sync.target == diloco.target == pytest.approx(1.02)
    assert (sync.time_to_target, sync.bytes_to_target) == pytest.approx((0.6, 48 * KiB))
    assert (diloco.time_to_target, diloco.bytes_to_target) == pytest.approx((0.24, 24 * KiB))
    assert diloco.sooner == pytest.approx(2.5) and diloco.fewer_bytes_to_target == pytest.approx(2.0)
    assert diloco.vs_baseline == pytest.approx(0.01) and sync.vs_baseline == 0
    # a round's burst: 8 KiB in one step, against a mean of 2 KiB
    assert diloco.peak_kib_per_step == pytest.approx(8.0) and diloco.wire_mb_per_step * 1024 == pytest.approx(2.0)
    assert ideal.time_to_target is None and math.isnan(ideal.sooner)  # 1.1 never reaches 1.02
    text = to_markdown(list(rows.values()), None)
    assert "time to 1.02" in text and "| peak KiB/step |" in text and "| vs sync |" in text
    line = next(l for l in text.splitlines() if l.startswith("| diloco:4 "))
    assert "| 8.0 |" in line and "| +1.0% | 0.24 (1/1) | 2.5x | 24 | 2.0x |" in line
    assert "Fastest: diloco:4 reached 1.02 in 0.24 s (sync 0.60 s)." in text


def test_relative_target_goes_the_worse_way_and_needs_a_direction() -> None:
    assert relative_target("val_loss", 0.50, 0.02) == pytest.approx(0.51)
    assert relative_target("test_accuracy", 0.90, 0.02) == pytest.approx(0.882)
    assert relative_target("score", 0.90, 0.02) is None


def test_step_bytes_fall_in_the_step_they_were_issued_in() -> None:
    bounds = [0.0, 1.0, 2.0, 3.0]
    issued = [(-0.5, 99), (0.0, 1), (0.5, 2), (1.0, 4), (2.9, 8), (3.0, 16), (3.5, 99)]
    assert _per_step(bounds, issued) == [3, 4, 24]  # the last step keeps what its own end issued


def test_a_strategy_gets_its_own_arguments_after_the_command() -> None:
    cfg = ScriptConfig(cmd=("python", "t.py", "--seed", "{seed}"), workers=2, strategies=("sync", "diloco:100"),
                       strategy_args={"diloco:100": ("--steps", "1200", "--tag", "{seed}")})
    assert cfg.command("sync", 3) == ["python", "t.py", "--seed", "3"]
    assert cfg.command("diloco:100", 3) == ["python", "t.py", "--seed", "3", "--steps", "1200", "--tag", "3"]
    assert cfg.as_dict()["strategy_args"] == {"diloco:100": ["--steps", "1200", "--tag", "{seed}"]}
    assert parse_strategy_args("diloco:100:lr=0.5=--steps 1200") == ("diloco:100:lr=0.5", ("--steps", "1200"))
    with pytest.raises(ValueError, match="not one of the strategies"):
        ScriptConfig(cmd=("python", "t.py"), strategies=("sync",), strategy_args={"diloco:100": ("-x",)})
    with pytest.raises(ValueError, match="the baseline runs the command as given"):
        ScriptConfig(cmd=("python", "t.py"), strategies=("sync", "diloco:100"), strategy_args={"sync": ("-x",)})
    with pytest.raises(ValueError, match="give one"):
        ScriptConfig(cmd=("python", "t.py"), target=1.0, target_within=0.02)
    with pytest.raises(ValueError, match="STRATEGY=ARGS"):
        parse_strategy_args("diloco:100")
