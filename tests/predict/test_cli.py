"""`gradwire predict` end to end on a described model: tables, JSON, the ratio column, the plot."""
import json
import textwrap

import pytest

from gradwire.cli.main import main
from tests.net import textbook as tb

NET = "bandwidth=1gbit,latency=50us"
ALPHA, BETA = 50e-6, tb.tcp_beta(1e9)
N = 1 << 20  # the model's one weight: 1 Mi fp32 elements, 4 MiB, one bucket


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "one_layer.py"
    path.write_text(textwrap.dedent("""
        from torch import nn
        def net():
            return nn.Linear(1024, 1024, bias=False)
    """))
    return f"{path}:net"


def test_described_model_end_to_end(tmp_path, factory, capsys):
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    rc = main(["predict", "--model", factory, "--compute-ms", "10", "--net", NET, "--net", "wan",
               "--worlds", "2,8,64", "--strategies", "sync,delayed", "--batch-size", "16", "--codec", "free",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0 and png.stat().st_size > 0
    res = json.loads(out.read_text())
    by = {(p["net"], p["world"], p["strategy"]): p for p in res["predictions"]}
    assert len(by) == 2 * 3 * 2
    # forward 5 ms (half the backward), backward 10 ms, the one bucket ready at its end, then the all_reduce
    sync8 = by[(NET, 8, "sync")]
    comm = tb.auto("all_reduce", 8, 4 * N, ALPHA, BETA)[0]
    assert sync8["step_seconds"] == pytest.approx(0.015 + comm)
    assert sync8["efficiency"] == pytest.approx(0.015 / (0.015 + comm))
    assert sync8["throughput"] == pytest.approx(8 * 16 / (0.015 + comm))
    assert by[(NET, 8, "delayed")]["step_seconds"] == pytest.approx(max(0.015, comm))
    # the ratio column: two-phase of m = 4N / r bytes must fit in 15 / 0.9 - 15 ms after backward: pairwise
    # all_to_all (p-1) a + (p-1)/p m b, then all_gather by recursive doubling (the cheapest at these sizes)
    # lg p a + (p-1)/p m b
    budget = 0.015 / 0.9 - 0.015
    ratios = {(r["net"], r["world"]): r["ratio"] for r in res["ratio_needed"]}
    for p, lg in ((2, 1), (8, 3)):
        need = 2 * (p - 1) / p * 4 * N * BETA / (budget - (p - 1 + lg) * ALPHA)
        assert need <= ratios[(NET, p)] <= need * 1.011
    assert ratios[("wan", 64)] == "not reachable"  # 2 x 63 latencies of 20 ms: no ratio helps
    printed = capsys.readouterr().out
    assert f"{sync8['step_seconds'] * 1e3:.1f} ms" in printed and "not reachable" in printed
    assert "2 buckets" not in printed and "1 buckets" in printed


def test_fast_network_needs_no_compression_and_profiles_round_trip(tmp_path, factory, capsys):
    out = tmp_path / "p.json"
    net = "25gbe,topology=1x8,intra=nvlink"
    assert main(["predict", "--model", factory, "--compute-ms", "10", "--net", net, "--worlds", "8",
                 "--strategies", "sync,onebit", "--codec", "free", "--json", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["ratio_needed"][0]["ratio"] == "none needed"  # one node over NVLink
    again = tmp_path / "q.json"
    assert main(["predict", "--profiles", str(out), "--net", net, "--worlds", "8", "--strategies", "sync,onebit",
                 "--codec", "free", "--json", str(again)]) == 0
    assert json.loads(again.read_text())["predictions"] == first["predictions"]


def test_a_bundled_model_is_measured_then_predicted(tmp_path):
    """--device host: a short loopback run per DDP strategy on this host's clock; model averaging priced from
    sync's run."""
    out = tmp_path / "p.json"
    assert main(["predict", "--device", "host", "--model", "tiny", "--measure-world", "2", "--steps", "7", "--strategies",
                 "sync,localsgd:2", "--worlds", "2,4", "--codec", "free", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["profiles"]) == {"sync", "*"} and res["profiles"]["sync"]["source"] == "measured"
    assert res["profiles"]["sync"]["world"] == 2 and len(res["predictions"]) == 4
    assert res["profiles"]["sync"]["stretch"] != 1.0  # calibrated against its own loopback run


def test_a_bundled_model_is_priced_on_the_device_model(tmp_path, capsys):
    """The default: each strategy's short run on the simulated clock (cpu-core), fitted to its own run with
    little stretching (the replay follows the clock's rules), and labelled as the simulated cluster's."""
    out = tmp_path / "p.json"
    assert main(["predict", "--model", "tiny", "--measure-world", "2", "--strategies", "sync,onebit",
                 "--worlds", "2,8", "--json", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["clock"] == "sim" and first["device"] == "cpu-core"
    for s in ("sync", "onebit"):
        prof = first["profiles"][s]
        assert prof["net"] == "loopback,clock=sim,device=cpu-core" and prof["shared"] == 1.0
        # the replay of its own run is that run within microseconds (a 0.2 ms step: backward barely moves)
        assert prof["stretch"] == pytest.approx(1.0, abs=0.1)
    printed = capsys.readouterr().out
    assert "times on the simulated cluster clock; device cpu-core" in printed
    assert "compression time priced on cpu-core" in printed
