"""Accounting, trace export, errors and the CUDA path of the gradwire backend."""
import pytest
import torch

from gradwire.backend.process_group import cuda_inner_for
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
        assert r["cuda_inner"] == [None]  # one live group; no CUDA op chose a CUDA backend


def test_unsupported_op_names_op_and_backend():
    msg = spawn(workers.unsupported_op, 1, timeout=60)[0]
    assert "all_reduce" in msg and "gloo" in msg.lower()


def test_topology_that_does_not_match_world_size_is_rejected():
    msg = spawn(workers.bad_topology, 2, timeout=60)[0]
    assert "2x4" in msg or "8" in msg


def test_cuda_inner_is_nccl_only_with_one_gpu_per_rank():
    assert cuda_inner_for(["a/GPU-0", "a/GPU-1", "b/GPU-0"], True)[0] == "nccl"
    name, why = cuda_inner_for(["a/GPU-0", "a/GPU-1", "a/GPU-0"], True)
    assert name == "gloo" and "[0, 2]" in why and "a/GPU-0" in why
    name, why = cuda_inner_for(["a/GPU-0", "a/GPU-1"], False)
    assert name == "gloo" and "no nccl" in why


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_run_on_nccl_or_shared_gpu_gloo():
    """Two ranks always: on a one-GPU machine they share it and run on gloo (NCCL refuses that)."""
    world = 2
    res = spawn(workers.cuda_ops, world, timeout=120)
    expected_inner = "nccl" if torch.cuda.device_count() >= world else "gloo"
    for rank, r in enumerate(res):
        assert r["inner"] == [expected_inner, "None"]  # the pair group saw only a send: no choice made
        assert r["hello"] == [0.0, 0.0]
        assert r["all_reduce"] == [3.0] * 3
        assert r["broadcast"] == [1.0] * 5
        assert r["all_gather"] == [[0] * 4, [1] * 4]
        assert r["all_to_all"] == [rank, 10 + rank]
        assert r["recv"] == [float(1 - rank)] * 6  # point-to-point: staged through the host on gloo
        calls = dict(r["calls"])
        point_to_point = calls.pop("send", 0) + calls.pop("recv", 0)  # a receive is counted as recv
        assert calls == {"all_reduce": 2, "broadcast": 1, "all_gather": 1, "all_to_all": 1} and point_to_point == 3
