"""`gradwire compare` end to end on a tiny run, and its bad-input errors."""
import json

import pytest

from gradwire.cli.main import main
from gradwire.compare import CompareConfig


def test_compare_small_run_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--workers", "2", "--model", "cnn", "--epochs", "1", "--seeds", "2",
               "--strategies", "sync,fp16,localsgd:2", "--net", "bandwidth=100mbit,latency=1ms", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert [r["strategy"] for r in res["runs"]] == ["compute-only", "sync", "fp16", "localsgd:2"]
    assert all(r["ok"] and r["ranks_agree"] for r in res["runs"])
    rows = {r["strategy"]: r for r in res["rows"]}
    assert rows["sync"]["speedup"] == pytest.approx(1.0)
    # half the bytes per step; the exact fp32 average that makes replicas identical at the end
    # (local correction, see gradwire.hooks.state) adds one full all_reduce to the short run
    assert 1.6 < rows["fp16"]["reduction"] <= 2.0
    assert rows["localsgd:2"]["reduction"] > 1.5  # a parameter average every 2 steps
    assert rows["compute-only"]["ideal_speedup"] > 1.0  # the 1 ms network costs something
    assert len(res["runs"][1]["seeds"]) == 2
    for name in ("table.md", "accuracy.png", "breakdown.png"):
        assert (out / name).stat().st_size > 0
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


def test_failed_run_is_recorded_and_others_kept(tmp_path, monkeypatch):
    from gradwire.compare import runner

    real = runner.run_one

    def flaky(cfg, net, strategy):
        if strategy == "fp16":
            return {"strategy": strategy, "net": net, "ok": False, "error": "rank 1 failed:\nboom", "seconds": 0.0}
        return real(cfg, net, strategy)

    monkeypatch.setattr(runner, "run_one", flaky)
    cfg = CompareConfig(strategies=("sync", "fp16"), workers=2, model="tiny", epochs=1, seeds=(0,), out=tmp_path)
    res = runner.run_compare(cfg)
    assert [r["ok"] for r in res["runs"]] == [True, True, False]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["runs"][2]["error"].endswith("boom")
    # a second comparison in the same folder keeps the first one's results
    runner.run_compare(CompareConfig(strategies=("sync",), workers=2, model="tiny", epochs=1, seeds=(0,), out=tmp_path))
    kept = list(tmp_path.glob("previous-*/results.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["runs"][2]["error"].endswith("boom")
