"""The default comparison: workers per core, both regimes, the verdict, the crossover, compact results."""
from __future__ import annotations

import json
import math

import pytest

from gradwire.compare import CompareConfig
from gradwire.compare.config import DEFAULT_NETS, default_workers
from gradwire.compare.crossover import crossover, rate, speedup_curves
from gradwire.compare.report import Row, verdict
from gradwire.compare.results import compact_json
from gradwire.net import parse_spec


def test_workers_default_to_one_per_core_at_least_two(monkeypatch):
    import gradwire.compare.config as config

    for cores, want in ((1, 2), (2, 2), (8, 8), (64, 16)):
        monkeypatch.setattr(config, "usable_cores", lambda c=cores: c)
        assert default_workers() == want
        assert CompareConfig().workers == want


def test_two_default_networks_a_slow_and_a_fast_one():
    slow, fast = (parse_spec(n) for n in DEFAULT_NETS)
    assert slow.bandwidth * 10 <= fast.bandwidth
    # on the simulated cluster clock, computing on the default device: the same figures on any host
    assert CompareConfig().net_names == tuple(f"{parse_spec(n).to_string()},clock=sim,device=cpu-core"
                                              for n in DEFAULT_NETS)


def _row(strategy: str, speedup: float, exposed: float, of_ideal: float = math.nan) -> Row:
    return Row("net", strategy, "ok", speedup=speedup, exposed_share=exposed, of_ideal=of_ideal)


def test_verdict_names_the_regime_and_the_strategies_that_do_not_pay():
    bound = [_row("compute-only", 3.0, 0.0), _row("sync", 1.0, 0.71), _row("onebit+delayed", 2.8, 0.0, 0.98)]
    said = verdict(bound, "net")
    assert "71%" in said and "communication-bound" in said and "Slower" not in said
    assert "Fastest: onebit+delayed 2.80x (98% of ideal)" in said
    free = [_row("sync", 1.0, 0.08), _row("onebit", 0.92, 0.0), _row("torch-fp16", 0.99, 0.0),
            _row("delayed", 1.02, 0.0, 1.03)]
    said = verdict(free, "net")
    assert "compute-bound" in said and "onebit 0.92x" in said
    assert "torch-fp16" not in said.split("Fastest")[0]  # within 3%: a tie, not "slower"
    assert "between the two regimes" in verdict([_row("sync", 1.0, 0.3)], "net")
    assert verdict([], "net") == ""


def test_crossover_is_where_the_speedup_falls_through_one():
    bw = [1e8, 1e9, 1e10, 1e11]
    assert crossover(bw, [4.0, 2.0, 0.5, 0.4]) == pytest.approx(10 ** (9 + 2 / 3))  # log-linear between 1G and 10G
    assert crossover(bw, [1.5, 1.2, 1.1, 1.0]) == pytest.approx(1e11)
    assert crossover(bw, [2.0, 1.5, 1.2, 1.05]) is None  # pays everywhere
    assert crossover(bw, [0.9, 0.8, 0.8, 0.8]) is None  # pays nowhere
    assert crossover(bw, [2.0, 0.9, 1.2, 0.9]) == pytest.approx(10 ** (10 + 2 / 3))  # the last crossing
    assert rate(6.04e9) == "6.04 Gbit/s" and rate(4.8e8) == "480 Mbit/s"


def test_speedup_curves_on_a_model_step():
    curves = speedup_curves("cnn-wide", 10.0, ["sync", "fp16", "delayed"], parse_spec("bandwidth=1gbit,latency=50us"),
                            2, bandwidths=[1e8, 1e9, 1e10, 1e11])
    fp16, delayed = curves.speedups["fp16"], curves.speedups["delayed"]
    assert fp16[0] > 1.5 and fp16 == sorted(fp16, reverse=True)  # half the bytes matter less as the link speeds up
    assert fp16[-1] < 1.0 and curves.crossovers["fp16"] is not None  # on a free link the cast is pure cost
    assert min(delayed) >= 1.0 and curves.crossovers["delayed"] is None  # hiding communication never costs
    assert json.loads(json.dumps(curves.as_dict()))["world"] == 2
    with pytest.raises(ValueError, match="compute_ms"):
        speedup_curves("cnn-wide", 0.0, ["sync", "fp16"], parse_spec("1gbe"), 2)


def test_compact_json_keeps_numbers_on_one_line_and_round_trips():
    obj = {"config": {"a": 1, "b": "x"}, "runs": [{"step_seconds": [0.0123456789, 1.5, 2.0], "nan": math.nan,
                                                   "none": None, "ok": True, "nested": [[1, 2], [3]]}]}
    text = compact_json(obj)
    assert '"step_seconds": [0.0123457, 1.5, 2.0]' in text
    back = json.loads(text)
    assert back["runs"][0]["step_seconds"][0] == pytest.approx(0.0123456789, rel=1e-5)
    assert math.isnan(back["runs"][0]["nan"]) and back["runs"][0]["nested"] == [[1, 2], [3]]
    assert len(text.splitlines()) == 15
    with pytest.raises(TypeError, match="not JSON"):
        compact_json({"x": object()})


def test_a_failed_run_shows_the_line_that_says_why(tmp_path):
    from gradwire.compare.report import _error_line
    from gradwire.compare.results import Run
    from gradwire.compare.script import _tail

    log = tmp_path / "stderr.log"
    log.write_text("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                   "  what():  [enforce fail at pair.cc:456] Received data size doesn't match expected size.\n"
                   + "[rank1]: noise\n" * 40
                   + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=" * 50 + "\n")
    assert _error_line(Run("s", "n", "failed", _tail(log))).startswith("what():  [enforce fail")
    traceback = "Traceback (most recent call last):\n  File \"x.py\"\nValueError: bad input\n" + "=" * 50
    assert _error_line(Run("s", "n", "failed", traceback)) == "ValueError: bad input"
    assert _error_line(Run("s", "n", "failed", "")) == ""


def test_the_crossover_line_names_each_strategy_once():
    from gradwire.compare.crossover import SpeedupCurves

    curves = SpeedupCurves("sync", "1gbe", 2, 10.0, [1e8, 1e9, 1e10],
                           {"fp16": [1.9, 1.2, 0.9], "delayed": [1.5, 1.1, 1.0], "powersgd:4": [0.8, 0.7, 0.7]},
                           {"fp16": 5e9, "delayed": None, "powersgd:4": None})
    assert curves.verdict() == ("predicted on the measured step, 2 ranks: pays fp16 below 5 Gbit/s, "
                                "delayed everywhere in 100 Mbit/s-10 Gbit/s, powersgd:4 nowhere in 100 Mbit/s-10 Gbit/s")


def test_the_table_prints_a_strategy_name_as_written(capsys):
    # rich turns ":100:" into an emoji unless told not to: "diloco:100:lr=1" printed as "diloco💯lr=1"
    from gradwire.compare.report import print_table

    print_table([_row("sync", 1.0, 0.9), _row("diloco:100:lr=1:mu=0.5", 3.0, 0.1)], None)
    out = capsys.readouterr().out
    assert "\U0001f4af" not in out and ":100:" in out.replace("\n", "").replace("│", "").replace(" ", "")
