"""`gradwire compare -- CMD` on a script that accumulates gradients: a step is an optimizer step (issue 44).

Counts only (a busy host moves the times): the timed steps are the script's
optimizer steps, and each step's bytes are one exchange of the gradients, not
one per micro-step. ``benchmarks/README.md`` (accumulate.py) has the time per step
against the script's own.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gradwire.cli.main import main
from gradwire.launch import free_port

SCRIPT = Path(__file__).resolve().parents[1] / "profile" / "accumulate_ddp.py"
STEPS = 8


@pytest.mark.timeout(300)
def test_compare_times_optimizer_steps_of_an_accumulating_script(tmp_path, monkeypatch, capsys):
    for key, value in {"ACCUM_MICRO": "2", "ACCUM_MODE": "flag", "ACCUM_STEPS": str(STEPS), "OMP_NUM_THREADS": "1",
                       "ACCUM_OUT": str(tmp_path / "measured{rank}.json")}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "cmp"
    code = main(["compare", "--no-ideal", "--net", "bandwidth=500mbit", "--strategies", "sync", "--seeds", "1",
                 "--out", str(out),
                 "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                 f"--master-port={free_port()}", str(SCRIPT)])
    assert code == 0, capsys.readouterr().err[-3000:]
    (run,) = [d for d in (out / "runs").iterdir() if d.name.endswith("-sync-seed0")]
    for rank in range(2):
        record = json.loads((run / f"rank{rank}.json").read_text())["compare"]
        mine = json.loads((tmp_path / f"measured{rank}.json").read_text())
        assert record["timed_by"] == "optimizer" and record["steps"] == STEPS
        assert len(record["step_seconds"]) == len(mine["step_seconds"]) == STEPS
        param_bytes = 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)  # the script's MLP, width 128
        # one exchange of the gradients per optimizer step (the first also carries DDP's start-up broadcast)
        assert all(param_bytes <= b < 1.5 * param_bytes for b in record["step_wire_bytes"][1:])
