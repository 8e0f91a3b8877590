"""`gradwire compare --tolerance`: the tolerance given judges the rows and is recorded (one process, no training)."""
import json
import sys

import pytest

from gradwire.cli.main import main
from gradwire.compare.config import COMPUTE_ONLY
from gradwire.compare.results import Results, Run, SeedResult


def _seed(loss):
    return SeedResult(0, step_seconds=[0.02] * 4, steps=4, wire_bytes=4096.0, train_seconds=0.08,
                      metrics={"train_loss": loss})


@pytest.fixture
def trained(monkeypatch):
    """A comparison whose trainings are made up: sync at a loss of 1.0, onebit 2.5% worse, one seed each."""
    import gradwire.compare.script as script

    def run_script_compare(cfg, on_training=None):
        net = cfg.net_names[0]
        cfg.out.mkdir(parents=True, exist_ok=True)  # as the ledger does
        return Results(cfg.as_dict(), "", [Run(COMPUTE_ONLY, net, "ok", seeds=[_seed(1.0)]),
                                           Run("sync", net, "ok", seeds=[_seed(1.0)]),
                                           Run("onebit", net, "ok", seeds=[_seed(1.025)])])

    monkeypatch.setattr(script, "run_script_compare", run_script_compare)


@pytest.mark.parametrize("given, recorded, status", [
    ([], "loss=2%,accuracy=1pt", "unsound"),
    (["--tolerance", "loss=5%"], "loss=5%,accuracy=1pt", "ok"),
    (["--tolerance", "accuracy=0.5pt,loss=3%"], "loss=3%,accuracy=0.5pt", "ok"),
])
def test_the_tolerance_judges_the_rows_and_is_recorded(tmp_path, capsys, trained, given, recorded, status):
    out = tmp_path / "cmp"
    assert main(["compare", "--strategies", "sync,onebit", "--out", str(out), *given, "--",
                 sys.executable, "-c", "pass"]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["tolerance"] == recorded
    rows = {r["strategy"]: r for r in saved["rows"]}
    assert rows["onebit"]["status"] == status and rows["onebit"]["sound_by"] == "tolerance alone"
    assert "Soundness rests on the tolerance alone here: sync ran 1 seed" in (out / "table.md").read_text()
