"""Gradient accumulation under ``gradwire profile`` and ``predict``: a step is an optimizer step.

``accumulate_ddp.py`` runs ``ACCUM_MICRO`` backwards per optimizer step, the
earlier ones without synchronising (``no_sync()`` or the
``require_backward_grad_sync`` flag). The flag's run is on this host's wall
clock, structure and counts only: a busy host moves its times. The timing
figures (predict within 5% of the measured step, ``--accumulate 8`` within 10%
of a profile of 8) are checked on the simulated cluster clock, which no host's
load moves, and ``no_sync()``'s structure on the same runs;
``benchmarks/accumulate.py`` measures them on both clocks.
"""
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.cli.main import main
from gradwire.launch import free_port

HERE = Path(__file__).parent
STEPS = 6  # optimizer steps; the first only starts the series


def _profile(out: Path, mode: str, micro: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCUM_MODE=mode, ACCUM_MICRO=str(micro), ACCUM_STEPS=str(STEPS))
    cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", "1gbe", "--out", str(out), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           f"--master-port={free_port()}", str(HERE / "accumulate_ddp.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    teardown_abort = "terminate called without an active exception" in proc.stderr
    assert proc.returncode == 0 or teardown_abort, proc.stderr[-3000:]
    assert f"{STEPS - 1} training steps recorded per rank (optimizer steps" in proc.stdout
    assert (f"{micro} micro-steps each" in proc.stdout) == (micro > 1)


def _predict(out: Path, *extra: str, net: str = "1gbe") -> dict:
    js = out / "predict.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["predict", "--profile", str(out), "--net", net, "--worlds", "2,8", "--strategies", "sync",
                     "--json", str(js), *extra]) == 0
    assert "optimizer steps/s, samples/s" in " ".join(printed.getvalue().split())  # the table's title may wrap
    return json.loads(js.read_text())


def _check_records(out: Path, micro: int, steps: int) -> None:
    """One recorded step per optimizer step (the first only starts the series), its ``micro`` micro-steps in it."""
    for rank in range(2):
        record = json.loads((out / f"rank{rank}.json").read_text())
        assert len(record["steps"]) == steps - 1
        for s in record["steps"]:
            assert s["micro_steps"] == micro and len(s["micro_seconds"]) == micro - 1
            assert all(t > 0 for t in s["micro_seconds"]) and s["buckets"]  # the last one synchronises
            assert s["batch"] == 32  # the script's batch, seen at the DDP's forward
            parts = sum(s["micro_seconds"]) + s["forward"] + s["backward"] + s["backward_wait"] \
                + s["after_backward"] + s["optimizer"]
            assert s["step"] == pytest.approx(parts)
            # collectives only in the synchronising backward and after it
            assert all(c["issued"] >= 0 for c in s["collectives"])


def _check_what_if(out: Path, micro: int, net: str) -> None:
    """predict on the profile: the accumulation it saw, and one micro-step more or fewer per optimizer step
    (the exchange once per step) moves the step the right way."""
    res = _predict(out, "--batch-size", "32", net=net)
    prof = res["profiles"]["*"]
    assert prof["accumulate"] == micro and (micro == 1 or prof["micro"] > 0)
    for p in res["predictions"]:
        assert p["accumulate"] == micro and p["step_seconds"] >= prof["forward"] + prof["backward"]
        assert p["throughput"] == pytest.approx(p["world"] * 32 * micro / p["step_seconds"])
    fewer = _predict(out, "--accumulate", "1", net=net)
    more = _predict(out, "--accumulate", str(micro + 4), net=net)
    step = {name: {p["world"]: p["step_seconds"] for p in r["predictions"]}
            for name, r in (("fewer", fewer), ("as", res), ("more", more))}
    assert fewer["profiles"]["*"]["accumulate"] == 1 and more["profiles"]["*"]["accumulate"] == micro + 4
    assert fewer["profiles"]["*"]["batch_size"] == 32  # without --batch-size: the batch the profile saw
    for world in (2, 8):
        assert step["fewer"][world] < step["as"][world] < step["more"][world]


def test_profile_records_one_step_per_optimizer_step_with_its_micro_steps(tmp_path):
    """The ``require_backward_grad_sync`` flag on this host's wall clock; ``no_sync()`` over 8 micro-steps is
    the simulated-clock test's profile below."""
    out = tmp_path / "prof"
    _profile(out, "flag", 2)
    _check_records(out, 2, STEPS)
    _check_what_if(out, 2, "1gbe")


def test_on_the_simulated_clock_predict_is_the_measured_optimizer_step_and_the_what_if_agrees(tmp_path, monkeypatch):
    """The acceptance figures, where a busy host cannot move them: the simulated cluster clock prices compute
    by a device model and the script's own timer reads it (``GRADWIRE_SIM_TIME=1``)."""
    import statistics

    monkeypatch.setenv("GRADWIRE_SIM_TIME", "1")
    net = "bandwidth=500mbit"
    step, measured = {}, {}
    for micro in (1, 8):
        out = tmp_path / f"sim{micro}"
        env = dict(os.environ, OMP_NUM_THREADS="1", ACCUM_MODE="no_sync", ACCUM_MICRO=str(micro),
                   ACCUM_STEPS="8", ACCUM_WIDTH="512", ACCUM_OUT=str(tmp_path / f"m{micro}.{{rank}}.json"))
        cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", f"{net},clock=sim,device=cpu-core",
               "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               f"--master-port={free_port()}", str(HERE / "accumulate_ddp.py")]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
        assert proc.returncode == 0 or "terminate called" in proc.stderr, proc.stderr[-3000:]
        # the steps predict takes: its records start at the script's second step, it skips 3 and the last
        measured[micro] = statistics.median(t for r in range(2) for t in json.loads(
            (tmp_path / f"m{micro}.{r}.json").read_text())["step_seconds"][4:-1])
        js = tmp_path / f"p{micro}.json"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["predict", "--profile", str(out), "--net", net, "--worlds", "2,8", "--strategies", "sync",
                         "--json", str(js)]) == 0
        step[micro] = {p["world"]: p["step_seconds"] for p in json.loads(js.read_text())["predictions"]}
        assert step[micro][2] == pytest.approx(measured[micro], rel=0.05)
    # the records of no_sync() over 8 micro-steps, and predict's what-if on them
    _check_records(tmp_path / "sim8", 8, 8)
    _check_what_if(tmp_path / "sim8", 8, net)
    js = tmp_path / "whatif.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["predict", "--profile", str(tmp_path / "sim1"), "--net", net, "--worlds", "2,8",
                     "--strategies", "sync", "--accumulate", "8", "--json", str(js)]) == 0
    whatif = {p["world"]: p["step_seconds"] for p in json.loads(js.read_text())["predictions"]}
    for world in (2, 8):
        assert whatif[world] == pytest.approx(step[8][world], rel=0.10)
