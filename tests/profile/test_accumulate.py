"""Gradient accumulation under ``gradwire profile`` and ``predict``: a step is an optimizer step.

``accumulate_ddp.py`` runs ``ACCUM_MICRO`` backwards per optimizer step, the
earlier ones without synchronising (``no_sync()`` or the
``require_backward_grad_sync`` flag). Structure and counts only: the timing
figures (predict within 5% of the measured step, ``--accumulate 8`` within 10%
of a profile of 8) are ``benchmarks/accumulate.py``'s, on a quiet machine.
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


def _predict(out: Path, *extra: str) -> dict:
    js = out / "predict.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["predict", "--profile", str(out), "--net", "1gbe", "--worlds", "2,8", "--strategies", "sync",
                     "--json", str(js), *extra]) == 0
    assert "optimizer steps/s, samples/s" in printed.getvalue()
    return json.loads(js.read_text())


@pytest.mark.parametrize("mode, micro", [("flag", 2), ("no_sync", 8)])
def test_profile_records_one_step_per_optimizer_step_with_its_micro_steps(tmp_path, mode, micro):
    out = tmp_path / "prof"
    _profile(out, mode, micro)
    for rank in range(2):
        record = json.loads((out / f"rank{rank}.json").read_text())
        assert len(record["steps"]) == STEPS - 1
        for s in record["steps"]:
            assert s["micro_steps"] == micro and len(s["micro_seconds"]) == micro - 1
            assert all(t > 0 for t in s["micro_seconds"]) and s["buckets"]  # the last one synchronises
            assert s["batch"] == 32  # the script's batch, seen at the DDP's forward
            parts = sum(s["micro_seconds"]) + s["forward"] + s["backward"] + s["backward_wait"] \
                + s["after_backward"] + s["optimizer"]
            assert s["step"] == pytest.approx(parts)
            # collectives only in the synchronising backward and after it
            assert all(c["issued"] >= 0 for c in s["collectives"])
    res = _predict(out, "--batch-size", "32")
    prof = res["profiles"]["*"]
    assert prof["accumulate"] == micro and (micro == 1 or prof["micro"] > 0)
    for p in res["predictions"]:
        assert p["accumulate"] == micro and p["step_seconds"] >= prof["forward"] + prof["backward"]
        assert p["throughput"] == pytest.approx(p["world"] * 32 * micro / p["step_seconds"])
    # the what-if: one micro-step more or fewer per optimizer step, the exchange once per step
    fewer = _predict(out, "--accumulate", "1")
    more = _predict(out, "--accumulate", str(micro + 4))
    step = {name: {p["world"]: p["step_seconds"] for p in r["predictions"]}
            for name, r in (("fewer", fewer), ("as", res), ("more", more))}
    assert fewer["profiles"]["*"]["accumulate"] == 1 and more["profiles"]["*"]["accumulate"] == micro + 4
    assert fewer["profiles"]["*"]["batch_size"] == 32  # without --batch-size: the batch the profile saw
    for world in (2, 8):
        assert step["fewer"][world] < step["as"][world] < step["more"][world]
