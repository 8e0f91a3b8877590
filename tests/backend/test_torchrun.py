import json
import os
import subprocess
import sys
from pathlib import Path

from gradwire.launch import free_port


def test_torchrun_with_spec_from_environment(tmp_path):
    out = tmp_path / "out.json"
    env = dict(os.environ, GRADWIRE_NET="wan", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", f"--master-port={free_port()}",
           str(Path(__file__).parent / "torchrun_script.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["value"] == 2.0 and got["world"] == 2
    assert got["spec"].startswith("wan") and got["model"] > 0.02  # 20 ms latency per message
