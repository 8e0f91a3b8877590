"""Accounting, trace export, errors and the CUDA path of the gradwire backend."""
import pytest
import torch

from gradwire.launch import spawn
from tests.backend import workers


def test_stats_events_and_trace(tmp_path):
    res = spawn(workers.accounting, 2, (str(tmp_path / "trace.json"),), timeout=90)
    for r in res:
        ar = r["stats"]["all_reduce"]
        assert ar["calls"] == 2 and ar["payload_bytes"] == 2 * (1 << 20)
        # 1 Gbit/s TCP: wire bytes exceed payload by the framing (1514/1448) and no more
        assert 1.04 < ar["wire_bytes"] / ar["sent_bytes"] < 1.05
        assert ar["model_seconds"] > 2 * (1 << 20) * 8 / 1e9  # at least the serialisation time
        assert r["stats"]["broadcast"]["calls"] == 1
        assert r["stats"]["total"]["calls"] == 3
        names = [e["name"] for e in r["trace"]["traceEvents"] if e["ph"] == "X"]
        assert names == ["all_reduce", "broadcast", "all_reduce"]
        assert all(e["dur"] > 0 for e in r["trace"]["traceEvents"] if e["ph"] == "X")
        assert r["events"] == 0 and r["empty"]["total"]["calls"] == 0


def test_unsupported_op_names_op_and_backend():
    msg = spawn(workers.unsupported_op, 1, timeout=60)[0]
    assert "all_reduce" in msg and "gloo" in msg.lower()


def test_topology_that_does_not_match_world_size_is_rejected():
    msg = spawn(workers.bad_topology, 2, timeout=60)[0]
    assert "2x4" in msg or "8" in msg


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nccl inner group)")
def test_cuda_tensors_run_on_nccl():
    world = min(2, torch.cuda.device_count())
    res = spawn(workers.cuda_allreduce, world, timeout=120)
    total = sum(range(1, world + 1))
    assert all(r[0] == [float(total)] * 3 and r[1] == 1 for r in res)
