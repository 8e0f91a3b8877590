"""`gradwire compare` end to end on a tiny run, and its bad-input errors."""
import json
import statistics

import pytest

from gradwire.cli.main import main
from gradwire.compare import CompareConfig


def test_compare_small_run_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    # the prediction beside the measurement is calibrated on this host: it belongs to the realtime clock
    rc = main(["compare", "--workers", "2", "--model", "cnn", "--epochs", "1", "--seeds", "2", "--clock", "realtime",
               "--strategies", "sync,fp16,localsgd:2", "--net", "bandwidth=100mbit,latency=1ms", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["clock"] == {"clock": "realtime", "device": "this host"}
    assert [r["strategy"] for r in res["runs"]] == ["compute-only", "sync", "fp16", "localsgd:2"]
    assert all(r["ok"] and r["ranks_agree"] for r in res["runs"])
    rows = {r["strategy"]: r for r in res["rows"]}
    # the table is the runs' own figures: time per epoch averaged over epochs, then seeds; speedups and
    # reductions against sync (the arithmetic on hand-made runs: tests/compare/test_report.py)
    runs = {r["strategy"]: r for r in res["runs"]}
    epoch = {s: statistics.fmean(statistics.fmean(x["epoch_seconds"]) for x in r["seeds"]) for s, r in runs.items()}
    wire = {s: statistics.fmean(x["wire_bytes"] for x in r["seeds"]) for s, r in runs.items()}
    close = {"rel": 1e-5}  # results.json keeps 6 significant digits
    for s in ("sync", "fp16", "localsgd:2"):
        assert rows[s]["epoch_seconds"] == pytest.approx(epoch[s], **close)
        assert rows[s]["speedup"] == pytest.approx(epoch["sync"] / epoch[s], **close)
        assert rows[s]["reduction"] == pytest.approx(wire["sync"] / wire[s], **close)
        assert rows[s]["of_ideal"] == pytest.approx(epoch["compute-only"] / epoch[s], **close)
    assert rows["fp16"]["ideal_speedup"] == pytest.approx(epoch["sync"] / epoch["compute-only"], **close)
    # half the bytes per step (every rank applies the same average: no parameter average at the end)
    assert 1.5 < rows["fp16"]["reduction"] <= 2.0
    assert rows["localsgd:2"]["reduction"] > 1.5  # a parameter average every 2 steps
    # compute-only sends nothing (its time against sync's is a timing: a busy host may reverse it on 12 steps)
    assert wire["compute-only"] < 0.1 * wire["sync"]
    assert len(res["runs"][1]["seeds"]) == 2
    for name in ("table.md", "accuracy.png", "breakdown.png", "bandwidth.png"):
        assert (out / name).stat().st_size > 0
    # the predicted speedup against bandwidth, on the compute-only run's measured step
    predicted = res["predicted"]
    assert predicted["world"] == 2 and predicted["baseline"] == "sync"
    assert predicted["compute_ms"] == pytest.approx(rows["compute-only"]["compute_ms"], **close)
    assert set(predicted["speedups"]) == {"fp16", "localsgd:2"}
    fp16 = predicted["speedups"]["fp16"]
    # saves more on a slow network than on a free one; how much depends on the host (its compute, and its
    # real collectives, which also move half the bytes under fp16), so only the order is the model's
    assert fp16[0] > fp16[-1]
    at = predicted["crossovers"]["fp16"]
    assert at is None or predicted["bandwidths"][0] < at < predicted["bandwidths"][-1]
    assert "pays fp16" in (out / "table.md").read_text()
    # the prediction at the network measured, beside the measurement (row field, table column), from a
    # calibration of this host: its real collectives and each DDP strategy's exchanges as they ran
    net = res["config"]["nets"][0]
    assert set(predicted["at_nets"][net]) == {"fp16", "localsgd:2"}
    assert set(predicted["step_ms_at_nets"][net]) == {"sync", "fp16", "localsgd:2"}
    for s in ("fp16", "localsgd:2"):
        assert rows[s]["predicted_speedup"] == pytest.approx(predicted["at_nets"][net][s], **close)
    assert rows["sync"]["predicted_speedup"] is None
    calibration = predicted["calibration"]
    assert calibration["scale"] > 0 and set(calibration["profiles"]) == {"sync", "fp16"}
    assert "predicted (vs measured)" in (out / "table.md").read_text()
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, match", [
    ({"strategies": ("sync", "bogus")}, "valid strategies"),
    ({"nets": ("10gbe,speed=1",)}, "speed"),
    ({"model": "resnet"}, "valid models"),
    ({"workers": 1}, "workers"),
    ({"strategies": ("sync", "sync")}, "repeat"),
])
def test_bad_config_names_the_valid_choices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompareConfig(**kwargs)


def test_schedule_interleaves_seeds_and_rotates_the_order():
    from gradwire.compare import COMPUTE_ONLY, schedule

    cfg = CompareConfig(nets=("1gbe",), strategies=("sync", "fp16", "onebit"), workers=2, seeds=(0, 1))
    (turns,) = schedule(cfg)
    assert [(t.strategy, t.config.seed) for t in turns] == [
        (COMPUTE_ONLY, 0), ("sync", 0), ("fp16", 0), ("onebit", 0),
        ("fp16", 1), ("onebit", 1), (COMPUTE_ONLY, 1), ("sync", 1)]
    assert [t.index for t in turns] == list(range(8))
    co = turns[0].config
    assert (str(co.strategy), co.net.to_string()) == ("sync", "local") and turns[0].net == cfg.net_names[0]
    apart = schedule(CompareConfig(nets=("1gbe",), strategies=("sync", "fp16"), workers=2, seeds=(0, 1),
                                   interleave=False))
    assert [[(t.strategy, t.config.seed) for t in g] for g in apart] == [
        [(COMPUTE_ONLY, 0), (COMPUTE_ONLY, 1)], [("sync", 0), ("sync", 1)], [("fp16", 0), ("fp16", 1)]]
    # --no-ideal: no compute-only training, the baseline first
    (bare,) = schedule(CompareConfig(nets=("1gbe",), strategies=("sync", "fp16"), workers=2, seeds=(0,), ideal=False))
    assert [(t.strategy, t.config.seed) for t in bare] == [("sync", 0), ("fp16", 0)]


def test_failed_run_is_recorded_and_others_kept(tmp_path, monkeypatch):
    from gradwire.compare import runner

    real = runner._training

    def broken(cfg, index, net, strategy, seed):
        t = real(cfg, index, net, strategy, seed)
        if strategy == "fp16" and seed == 1:  # fails inside the ranks, past the parent's checks
            from gradwire.strategies import StrategyChoice, StrategySpec

            object.__setattr__(t.config, "strategy", StrategyChoice("no-such-strategy", StrategySpec("sync")))
        return t

    monkeypatch.setattr(runner, "_training", broken)
    cfg = CompareConfig(nets=("1gbe",), strategies=("sync", "fp16"), workers=2, model="tiny", epochs=1, seeds=(0, 1),
                        out=tmp_path)
    events = []
    res = runner.run_compare(cfg, on_training=events.append)
    # round 1 runs sync, fp16 (fails), then compute-only in fresh processes
    assert [(e.strategy, e.seed, e.ok) for e in events] == [
        ("compute-only", 0, True), ("sync", 0, True), ("fp16", 0, True),
        ("sync", 1, True), ("fp16", 1, False), ("compute-only", 1, True)]
    assert [r.ok for r in res.runs] == [True, True, False]
    assert [len(r.seeds) for r in res.runs] == [2, 2, 1]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert "rank" in saved["runs"][2]["error"] and "no-such-strategy" in saved["runs"][2]["error"]
    assert saved["runs"][2]["status"] == "failed" and saved["runs"][2]["finished"] and not saved["runs"][2]["ok"]
    # a second comparison in the same folder (each strategy in processes of its own this time)
    # keeps the first one's results
    again = runner.run_compare(CompareConfig(nets=("1gbe",), strategies=("sync",), workers=2, model="tiny", epochs=1,
                                             seeds=(0, 1), out=tmp_path, interleave=False), on_training=events.append)
    assert [(e.strategy, e.seed) for e in events[6:]] == [
        ("compute-only", 0), ("compute-only", 1), ("sync", 0), ("sync", 1)]
    assert all(r.ok and r.ranks_agree and len(r.seeds) == 2 for r in again.runs)
    kept = list(tmp_path.glob("previous-*/results.json"))
    assert len(kept) == 1 and "no-such-strategy" in json.loads(kept[0].read_text())["runs"][2]["error"]


def test_compare_runs_on_the_simulated_clock_and_says_so(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--workers", "2", "--model", "cnn", "--epochs", "1", "--seeds", "1", "--device", "a100",
               "--strategies", "sync,onebit", "--net", "bandwidth=100mbit,latency=1ms", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["clock"]["clock"] == "sim" and res["clock"]["device"] == "a100"
    assert res["config"]["nets"] == ["bandwidth=100mbit,latency=1ms,clock=sim,device=a100"]
    table = (out / "table.md").read_text()
    assert "simulated cluster clock; device a100 (19.5 TFLOP/s fp32" in table
    rows = {r["strategy"]: r for r in res["rows"]}
    # an a100 computes the small CNN's step in well under a millisecond: the 100 Mbit/s network is all of it
    assert rows["sync"]["exposed_share"] > 0.5 and rows["onebit"]["speedup"] > 2
    # compare's own prediction: each step priced on the same device by the clock's rules, no host calibrated
    predicted = res["predicted"]
    assert "calibration" not in predicted and predicted["world"] == 2
    assert rows["onebit"]["predicted_speedup"] == pytest.approx(rows["onebit"]["speedup"], rel=0.05)


@pytest.mark.parametrize("argv, words", [
    (["--clock", "realtime", "--device", "a100"], "--device a100 prices compute on the simulated clock"),
    (["--device", "a1000"], "unknown device 'a1000'"),
    (["--device", "host:x0"], "the factor must be a positive finite number"),
    (["--device", "step=0ms"], "the step's time must be positive"),
    (["--device", "step=35ms", "--", "python", "-c", "pass"], "scales compute by a training step, which a command"),
])
def test_compare_refuses_a_bad_clock_or_device_in_one_line(argv, words, tmp_path, capsys):
    """Refused before anything runs: one line that says what was wrong and what would be right."""
    rc = main(["compare", *argv, "--out", str(tmp_path / "cmp")])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
