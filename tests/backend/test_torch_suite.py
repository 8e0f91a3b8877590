"""Cases of PyTorch's own distributed test suite that gradwire once failed, run on gloo and gradwire.

The whole suite takes minutes (benchmarks/torch_suite.py writes its counts to
benchmarks/results/torch_suite.json); these few cover what gradwire had to
fix: receive from any source, subgroup teardown, monitored barriers (including
a zero timeout), batched point-to-point ops, coalesced all_reduce, and the
backend name a group standing in for gloo reports (get_backend, DDP's logging data).
"""
import json
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "benchmarks" / "torch_suite.py"
CASES = (
    "test_send_recv_any_source",
    "test_destroy_group",
    "test_monitored_barrier_gloo_subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_batch_isend_irecv_gloo",
    "test_all_reduce_coalesced_sum",
    "test_get_backend",
    "test_ddp_logging_data_cpu",
)


def test_fixed_cases_pass_on_gradwire_as_on_gloo(tmp_path):
    out = tmp_path / "suite.json"
    args = [sys.executable, str(RUNNER), "--start", "fork", "--out", str(out)]
    for case in CASES:
        args += ["-k", case]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["test"]: r for r in report["rows"]}
    for case in CASES:
        row = rows[case]
        assert row["gloo"]["status"] == "passed", (case, row)
        assert row["gradwire"]["status"] == "passed", (case, row)
