"""2-rank runs of the whole command: every collective checks out, wrong data fails the command."""
from __future__ import annotations

import csv
import json

import pytest

from gradwire.bench.driver import CORRUPT_ENV
from gradwire.cli.main import main

pytestmark = pytest.mark.slow


def test_all_collectives_on_gloo_are_correct_and_written(tmp_path, capsys) -> None:
    files = {k: tmp_path / f"out.{k}" for k in ("json", "csv", "png")}
    rc = main(["bench", "--op", "all", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1",
               "--json", str(files["json"]), "--csv", str(files["csv"]), "--plot", str(files["png"])])
    out = capsys.readouterr().out
    assert rc == 0, out
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv"):
        assert f"# Collective test: {op}" in out
    assert "# Out of bounds values : 0 OK" in out and "# Avg bus bandwidth" in out
    assert "model" not in out.splitlines()[10]  # no network modelled: no model column
    data = json.loads(files["json"].read_text())
    rows = data["rows"]
    assert data["wrong"] == 0 and data["world_size"] == 2
    # 7 ops x 3 sizes x 2 placements; sendrecv and all_to_all have no in-place form
    assert len(rows) == 42
    assert all(r["wrong"] == 0 for r in rows if r["time_us"] is not None)
    assert {r["placement"] for r in rows} == {"out-of-place", "in-place"}
    assert sum(1 for r in rows if r["time_us"] is None) == 6
    ag = next(r for r in rows if r["op"] == "all_gather" and r["size"] == 512)
    assert ag["busbw"] == pytest.approx(ag["algbw"] * 0.5)
    with files["csv"].open() as fh:
        assert len(list(csv.DictReader(fh))) == 42
    assert files["png"].read_bytes()[:4] == b"\x89PNG"


def test_reducing_collectives_in_other_types() -> None:
    from gradwire.bench.config import BenchConfig
    from gradwire.bench.report import format_table
    from gradwire.launch import spawn
    from tests.bench.workers import several_configs_on_gloo

    cases = [("int8", "max"), ("bfloat16", "avg"), ("half", "prod"), ("int32", "min"), ("double", "sum")]
    configs = [BenchConfig(ops=("all_reduce", "reduce_scatter", "reduce"), root=1, min_bytes=1024, max_bytes=1024,
                           iters=1, warmup=0, dtype=d, redop=o) for d, o in cases]
    results = spawn(several_configs_on_gloo, 2, (configs,), timeout=100)[0]
    for (dtype, redop), result in zip(cases, results):
        assert result.wrong == 0, format_table(result)
        assert {(r.dtype, r.redop) for r in result.rows} == {(dtype, redop)}
        assert {r.root for r in result.rows if r.op == "reduce"} == {1}


def test_wrong_data_shows_in_wrong_and_fails_the_command(monkeypatch, capsys) -> None:
    monkeypatch.setenv(CORRUPT_ENV, "all_gather")  # inherited by the spawned ranks
    rc = main(["bench", "--op", "all_gather", "--op", "all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0",
               "--net", "1gbe"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "priced by the model only" in captured.out and "model" in captured.out  # gloo + --net: what-if column
    assert "# Out of bounds values : 4 FAILED" in captured.out  # 2 ranks x 2 placements, one element each
    assert "# Out of bounds values : 0 OK" in captured.out  # all_reduce untouched
    assert "wrong values" in captured.err


def test_simulated_network_adds_model_column(capsys) -> None:
    # The virtual clock is wall time plus the simulated waits, so a real stall (a 20 ms hiccup of a CI
    # machine) shows in it too; a slow network (0.9 s per MiB, free in virtual time) keeps that small.
    spec = "bandwidth=10mbit,latency=50ms,protocol=none,clock=virtual"
    assert main(["bench", "--backend", "gradwire", "--net", spec, "--op", "sendrecv", "--op", "broadcast",
                 "-b", "1M", "-e", "1M", "-n", "2", "-w", "1"]) == 0
    out = capsys.readouterr().out
    assert "model" in out and "simulated by the gradwire backend" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("     1048576")]
    assert len(rows) == 2
    for r in rows:
        measured, model = float(r[5]), float(r[-1])
        assert measured == pytest.approx(model, rel=0.05)  # virtual clock: the model sets the time
    sendrecv = rows[0]
    assert float(sendrecv[-1]) == pytest.approx(50_000 + 1048576 * 8 / 1e7 * 1e6, rel=1e-3)  # full duplex


def test_doctor_passes_on_two_healthy_ranks(capsys) -> None:
    assert main(["doctor", "--probe-bytes", "65536", "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "probe 0<->1" in out


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_gradwire_on_cuda_tensors_is_correct_and_simulated(tmp_path, capsys) -> None:
    """The ops DDP and the hooks use, on CUDA tensors of 2 ranks (one shared GPU runs them on gloo)."""
    out_json = tmp_path / "cuda.json"
    rc = main(["bench", "--backend", "gradwire", "--tensors", "cuda", "--net", "1gbe", "-b", "64K", "-e", "1M",
               "-f", "16", "-n", "3", "-w", "1", "--op", "all_reduce", "--op", "all_gather", "--op", "broadcast",
               "--op", "all_to_all", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(out_json.read_text())
    assert data["wrong"] == 0 and data["config"]["device"] == "cuda" and "device cuda:0" in out
    timed = [r for r in data["rows"] if r["time_us"] is not None]
    # a simulated 1 Gbit/s link: no op finishes before its model says the data arrived
    assert timed and all(r["time_us"] >= 0.95 * r["model_us"] for r in timed)


def test_sim_clock_with_a_device_prices_the_reduction_on_it(tmp_path, capsys) -> None:
    """--clock sim --device: an in-place all_reduce takes the network model's time plus the ring's additions on the
    device, to the nanosecond; broadcast computes nothing; out-of-place adds the copy the benchmark makes."""
    from gradwire.bench.collectives import COLLECTIVES
    from gradwire.device import DEVICES, op_seconds

    out_json = tmp_path / "sim.json"
    assert main(["bench", "--clock", "sim", "--net", "10gbe", "--device", "cpu-core", "--op", "all_reduce",
                 "--op", "broadcast", "-b", "1M", "-e", "1M", "-n", "2", "-w", "0", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "clock: the simulated cluster clock" in out and "cpu-core" in out
    rows = {(r["op"], r["placement"]): r for r in json.loads(out_json.read_text())["rows"]}
    flops, nbytes, ops = COLLECTIVES["all_reduce"].reduction(COLLECTIVES["all_reduce"].layout(1 << 20, 4, 2), 2)
    assert (flops, nbytes, ops) == (131072.0, 3 << 19, 1)
    add = op_seconds(DEVICES["cpu-core"], flops, nbytes, False) * 1e6
    ar = rows[("all_reduce", "in-place")]
    assert ar["time_us"] == pytest.approx(ar["model_us"] + add, rel=1e-6)
    assert rows[("all_reduce", "out-of-place")]["time_us"] > ar["time_us"]
    bc = rows[("broadcast", "in-place")]
    assert bc["time_us"] == pytest.approx(bc["model_us"], rel=1e-6)


def test_device_cpu_still_places_the_tensors_with_a_note(capsys) -> None:
    assert main(["bench", "--device", "cpu", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"]) == 0
    err = capsys.readouterr().err
    assert "--device cpu places the tensors: it is --tensors cpu now" in err
