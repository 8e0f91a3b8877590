"""A real DDP job recorded by a ProfileSession (as ``gradwire profile`` runs it) and read back by predict."""
import json
import os

import pytest
import torch

from gradwire.launch import spawn
from gradwire.predict import predict
from gradwire.predict.describe import bucket_layout
from gradwire.predict.recorded import load_profile_dir
from tests.predict import workers


def _layout():
    with torch.device("meta"):
        params = list(workers.model().parameters())
    return [sum(params[i].numel() * 4 for i in b) for b in bucket_layout(params, 0.25)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two jobs in one set of ranks: DDP's own all_reduce, and gradwire's onebit hook."""
    out = tmp_path_factory.mktemp("recorded")
    spawn(workers.recorded_ddp, 2, (["none", "onebit"], str(out)), timeout=180)
    return out


@pytest.mark.parametrize("hook, label", [("none", "sync"), ("onebit", "onebit")])
def test_recorded_buckets_are_ddp_buckets(recorded, hook, label):
    prof = load_profile_dir(str(recorded / hook), skip=2)
    # from the second iteration on DDP runs its rebuilt buckets: sizes as bucket_layout says, in launch order
    assert [b.nbytes for b in prof.buckets] == _layout()
    assert prof.world == 2 and prof.strategy == label
    ready = [b.ready for b in prof.buckets]
    assert ready == sorted(ready) and 0 < ready[-1] <= prof.backward
    assert prof.forward > 0 and prof.backward > 0 and prof.optimizer > 0
    assert prof.exchanges is not None and len(prof.exchanges) == len(prof.buckets)
    two_phase = ("all_to_all", "all_gather")
    # onebit compresses buckets of 1024 elements and more (the hooks' cutoff); the rest, and plain DDP, all_reduce
    expected = [two_phase if hook == "onebit" and b.numel >= 1024 else ("all_reduce",) for b in prof.buckets]
    assert [m.ops for m in prof.exchanges] == expected
    # the profile prices its own strategy with its own measured costs, any other with the model's
    assert predict(prof, label, "1gbe", 2).step_seconds >= prof.compute_seconds  # equal where all of it hides
    # where the ranks computed: 2 CPU ranks on this host's cores
    assert prof.shared == max(1.0, 2 / len(os.sched_getaffinity(0)))
    assert prof.net is None  # rank files alone do not say which network the job ran on (profile.json does)


def test_profile_json_says_the_network_and_calibrates_on_it(recorded, tmp_path):
    from gradwire.predict import calibrated

    ranks = [json.loads((recorded / "none" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(set(r["host"]) == {"hostname", "cores", "cuda"} and r["host"]["cuda"] is False for r in ranks)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"net": "loopback", "ranks": ranks}))
    prof = load_profile_dir(str(folder), skip=2)
    assert prof.net == "loopback" and prof.loop_seconds is not None
    cal = calibrated(prof)
    assert cal.stretch != 1.0 and predict(cal, "sync", "loopback", 2).step_seconds == pytest.approx(
        prof.loop_seconds, rel=1e-2)


def test_cli_predicts_from_a_profile_folder(recorded, tmp_path, capsys):
    from gradwire.cli.main import main

    out = tmp_path / "p.json"
    assert main(["predict", "--profile", str(recorded / "none"), "--net", "1gbe", "--worlds", "2,16",
                 "--strategies", "sync,delayed", "--codec", "free", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["profiles"]["*"]["strategy"] == "sync" and len(res["predictions"]) == 4
    assert "1gbe" in capsys.readouterr().out
