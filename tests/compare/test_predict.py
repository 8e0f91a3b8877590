"""The step-time predictor: pure formulas on a hand-made profile."""
import json

import pytest

from gradwire.predict import Collective, StepProfile, predict
from tests.net import textbook as tb

NET = "bandwidth=1gbit,latency=50us"
ALPHA, BETA = 50e-6, tb.tcp_beta(1e9)  # NET's alpha and beta: TCP framing, 1448 payload bytes per 1514


def _comm(op: str, p: int, n: int) -> float:
    """Textbook time of one ``op`` on NET (tests/net/textbook.py), not the model's own number."""
    return tb.auto(op, p, n, ALPHA, BETA)[0]


def _sync(world=4):
    return StepProfile("sync", world, compute_seconds=0.020, real_comm_seconds=0.002,
                       collectives=[Collective("all_reduce", 4e6, 1.0)])


def test_blocking_step_is_compute_plus_modelled_comm():
    p = predict(_sync(), NET, 8)
    comm = 6 * ALPHA + 7 / 4 * 4e6 * BETA  # Rabenseifner at p = 8, the cheapest for 4 MB
    assert comm == pytest.approx(_comm("all_reduce", 8, 4_000_000))
    assert p.comm_seconds == pytest.approx(comm)
    assert p.step_seconds == pytest.approx(0.020 + comm)
    assert p.efficiency == pytest.approx(0.020 / (0.020 + comm))
    assert p.wire_bytes_per_step == tb.tcp_wire(7 / 4 * 4e6)  # the busiest rank's share, framed


def test_real_collective_bounds_a_fast_network():
    p = predict(_sync(), "loopback", 4)
    assert p.step_seconds == pytest.approx(0.022)


def test_overlapped_step_is_the_slower_of_compute_and_comm():
    prof = StepProfile("delayed", 4, 0.020, 0.001, [Collective("all_reduce", 4e6, 1.0)], overlapped=True)
    comm = _comm("all_reduce", 4, 4_000_000)
    assert comm > 0.021  # the network is the bound here
    assert predict(prof, NET, 4).step_seconds == pytest.approx(comm)
    fast = StepProfile("delayed", 4, 0.060, 0.001, [Collective("all_reduce", 4e6, 1.0)], overlapped=True)
    assert predict(fast, NET, 4).step_seconds == pytest.approx(0.061)  # and here compute


def test_the_loopback_median_step_is_the_base_when_measured():
    """Bursty waits: a median wait of 0 must not hide the waits of a few steps (see predict's doc)."""
    overlapped = StepProfile("delayed", 4, 0.020, 0.0, [Collective("all_reduce", 4e3, 1.0)], overlapped=True,
                             loop_seconds=0.0225)
    assert predict(overlapped, NET, 4).step_seconds == pytest.approx(0.0225)
    blocking = StepProfile("sync", 4, 0.020, 0.002, [Collective("all_reduce", 4e6, 1.0)], loop_seconds=0.023)
    comm = _comm("all_reduce", 4, 4_000_000)
    assert predict(blocking, NET, 4).step_seconds == pytest.approx(0.023 + comm - 0.002)


def test_gathered_bytes_grow_with_world_unless_two_phase():
    gather = StepProfile("topk:0.01", 2, 0.01, 0.0, [Collective("all_gather", 4000, 2.0)])
    two = StepProfile("onebit", 2, 0.01, 0.0, [Collective("all_gather", 4000, 2.0)], two_phase=True)
    # measured on 2 ranks, predicted on 8: the gathered buffer grows 4x, unless two-phase
    assert predict(gather, NET, 8).comm_seconds == pytest.approx(2 * (3 * ALPHA + 7 / 8 * 16000 * BETA))
    assert predict(two, NET, 8).comm_seconds == pytest.approx(2 * (3 * ALPHA + 7 / 8 * 4000 * BETA))
    assert predict(gather, NET, 8).wire_bytes_per_step == 2 * tb.tcp_wire(7 / 8 * 16000)


def test_topology_keeps_ranks_per_node_and_rejects_a_bad_world():
    prof = _sync()
    # 2 ranks per node kept, 4 nodes at 8 ranks: node-local reduce and broadcast on NVLink, ring of 4 leaders
    p = predict(prof, "10gbe,topology=2x2,intra=nvlink", 8)
    ai, bi = 3e-6, 8 / 2.4e12  # nvlink: unframed
    ae, be = 20e-6, tb.tcp_beta(10e9)
    hierarchical = 2 * (ai + 4e6 * bi) + 6 * ae + 3 / 2 * 4e6 * be
    assert p.comm_seconds == pytest.approx(hierarchical)
    assert p.step_seconds == pytest.approx(0.020 + hierarchical)
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
    assert steps == sorted(steps) and steps[0] == pytest.approx(0.020 + ALPHA + 4e6 * BETA)  # recursive doubling
    assert png.stat().st_size > 0
    assert f"{steps[-1] * 1e3:.1f} (" in capsys.readouterr().out  # the printed table shows the same figures


def test_cli_rejects_bad_world_sizes(tmp_path):
    from gradwire.cli.main import main

    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"profiles": [_sync().as_dict()]}))
    assert main(["predict", "--profiles", str(profiles), "--worlds", "1,4"]) == 2
