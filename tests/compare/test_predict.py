"""The step-time predictor: pure formulas on a hand-made profile."""
import json

import pytest

from gradwire.net import NetworkModel
from gradwire.predict import Collective, StepProfile, predict

NET = "bandwidth=1gbit,latency=50us"


def _sync(world=4):
    return StepProfile("sync", world, compute_seconds=0.020, real_comm_seconds=0.002,
                       collectives=[Collective("all_reduce", 4e6, 1.0)])


def test_blocking_step_is_compute_plus_modelled_comm():
    p = predict(_sync(), NET, 8)
    comm = NetworkModel(NET, 8).cost("all_reduce", 4_000_000).seconds
    assert p.comm_seconds == pytest.approx(comm)
    assert p.step_seconds == pytest.approx(0.020 + comm)
    assert p.efficiency == pytest.approx(0.020 / (0.020 + comm))


def test_real_collective_bounds_a_fast_network():
    p = predict(_sync(), "loopback", 4)
    assert p.step_seconds == pytest.approx(0.022)


def test_overlapped_step_is_the_slower_of_compute_and_comm():
    prof = StepProfile("delayed", 4, 0.020, 0.001, [Collective("all_reduce", 4e6, 1.0)], overlapped=True)
    comm = NetworkModel(NET, 4).cost("all_reduce", 4_000_000).seconds
    assert predict(prof, NET, 4).step_seconds == pytest.approx(max(0.021, comm))


def test_the_loopback_median_step_is_the_base_when_measured():
    """Bursty waits: a median wait of 0 must not hide the waits of a few steps (see predict's doc)."""
    overlapped = StepProfile("delayed", 4, 0.020, 0.0, [Collective("all_reduce", 4e3, 1.0)], overlapped=True,
                             loop_seconds=0.0225)
    assert predict(overlapped, NET, 4).step_seconds == pytest.approx(0.0225)
    blocking = StepProfile("sync", 4, 0.020, 0.002, [Collective("all_reduce", 4e6, 1.0)], loop_seconds=0.023)
    comm = NetworkModel(NET, 4).cost("all_reduce", 4_000_000).seconds
    assert predict(blocking, NET, 4).step_seconds == pytest.approx(0.023 + comm - 0.002)


def test_gathered_bytes_grow_with_world_unless_two_phase():
    gather = StepProfile("topk:0.01", 4, 0.01, 0.0, [Collective("all_gather", 4000, 1.0)])
    two = StepProfile("onebit", 4, 0.01, 0.0, [Collective("all_gather", 4000, 1.0)], two_phase=True)
    m = NetworkModel(NET, 16)
    assert predict(gather, NET, 16).comm_seconds == pytest.approx(m.cost("all_gather", 16000).seconds)
    assert predict(two, NET, 16).comm_seconds == pytest.approx(m.cost("all_gather", 4000).seconds)


def test_topology_keeps_ranks_per_node_and_rejects_a_bad_world():
    prof = _sync()
    assert predict(prof, "10gbe,topology=2x4,intra=nvlink", 16).step_seconds > 0
    with pytest.raises(ValueError, match="multiple of 4"):
        predict(prof, "10gbe,topology=2x4", 6)
    with pytest.raises(ValueError, match=">= 2"):
        predict(prof, NET, 1)


def test_profile_round_trips_through_dict():
    p = _sync()
    assert StepProfile.from_dict(p.as_dict()) == p


def test_cli_predicts_from_saved_profiles(tmp_path, capsys):
    from gradwire.cli.main import main

    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"profiles": [_sync().as_dict()]}))
    out, png = tmp_path / "pred.json", tmp_path / "scaling.png"
    rc = main(["predict", "--profiles", str(profiles), "--net", NET, "--worlds", "2,8,64",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    res = json.loads(out.read_text())
    steps = [p["step_seconds"] for p in res["predictions"]]
    assert [p["world"] for p in res["predictions"]] == [2, 8, 64]
    assert steps == sorted(steps) and steps[0] == pytest.approx(predict(_sync(), NET, 2).step_seconds)
    assert png.stat().st_size > 0
    assert f"{steps[-1] * 1e3:.1f} (" in capsys.readouterr().out  # the printed table shows the same figures


def test_cli_rejects_bad_world_sizes(tmp_path):
    from gradwire.cli.main import main

    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"profiles": [_sync().as_dict()]}))
    assert main(["predict", "--profiles", str(profiles), "--worlds", "1,4"]) == 2
