"""`gradwire profile` breaks an FSDP2 job's and a pipeline's traffic down per op: bytes and exposed time."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from gradwire.profile.session import exposed_by_op
from tests.parallel import workers

SCRIPT = Path(__file__).with_name("profile_script.py")


def test_exposed_time_is_split_by_op_type():
    ev = lambda op, a, b: SimpleNamespace(op=op, issued=a, completed=b)  # noqa: E731
    events = [ev("all_gather", 0.0, 2.0), ev("reduce_scatter", 1.0, 4.0), ev("all_gather", 5.0, 6.0)]
    waits = [(1.5, 3.0), (5.5, 7.0)]
    got = exposed_by_op(0.0, 10.0, events, waits)
    assert got == {"all_gather": 0.5 + 0.5, "reduce_scatter": 1.5}


def test_profile_shows_fsdp_and_pipeline_ops(tmp_path):
    out = tmp_path / "prof"
    cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", "bandwidth=1gbit,latency=50us",
           "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(SCRIPT)]
    env = dict(os.environ, COLUMNS="160")  # the table's op names in full
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for op in ("all_gather", "reduce_scatter", "send", "recv"):
        assert op in proc.stdout, proc.stdout
    assert "exposed (s)" in proc.stdout
    ranks = json.loads((out / "profile.json").read_text())["ranks"]
    n_params = sum(p.numel() for p in workers._blocks().parameters())
    for r in ranks:
        ops = r["ops"]
        # FSDP2 (3 steps: parameters gathered for forward and for backward, gradients reduce-scattered) ...
        assert ops["all_gather"]["payload_bytes"] == workers.STEPS * 2 * n_params * 4
        assert ops["reduce_scatter"]["payload_bytes"] == workers.STEPS * n_params * 4
        # ... and the pipeline's activations and gradients, one message per microbatch each way
        assert ops["send"]["calls"] >= (workers.STEPS - 1) * 4 and ops["recv"]["calls"] >= (workers.STEPS - 1) * 4
        for op in ("all_gather", "reduce_scatter", "send", "recv"):
            assert 0.0 <= ops[op]["exposed_seconds"] <= r["exposed_seconds"] + 1e-9, (op, ops[op])
        assert ops["total"]["exposed_seconds"] == r["exposed_seconds"]
