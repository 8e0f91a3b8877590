"""What FSDP2, tensor and pipeline parallelism call on a group works on gradwire as on gloo."""
import pytest

from gradwire.launch import spawn
from tests.backend import api_workers
from tests.backend.test_parity import _same


@pytest.fixture(scope="module")
def api_runs():
    ref = spawn(api_workers.api_suite, 2, ("gloo", None), timeout=100)
    got = spawn(api_workers.api_suite, 2, ("gradwire", "10gbe"), timeout=100)
    return ref, got


KEYS = ("new_subgroups", "destroy_subgroup", "device_mesh", "batch_isend_irecv", "allreduce_coalesced",
        "coalesced_all_reduce_async", "coalesced_all_reduce_sync", "coalesced_all_gather_async",
        "coalesced_all_gather_sync", "coalesced_reduce_scatter_async", "coalesced_reduce_scatter_sync",
        "funcol_all_gather_coalesced", "funcol_reduce_scatter_coalesced", "funcol_all_reduce_coalesced",
        "recv_any_source", "monitored_barrier")


@pytest.mark.parametrize("key", KEYS)
def test_op_matches_gloo(api_runs, key):
    ref, got = api_runs
    for rank in range(2):
        assert not (isinstance(ref[rank][key], tuple) and ref[rank][key][:1] == ("error",)), ref[rank][key]
        _same(got[rank][key], ref[rank][key], f"rank {rank} {key}")


def test_groups_have_the_names_torch_gives_them(api_runs):
    ref, got = api_runs
    for rank in range(2):
        assert got[rank]["names"] == ref[rank]["names"] == ("0", "default_pg")
        assert got[rank]["sub_names"] == ref[rank]["sub_names"]
        assert got[rank]["sub_names"][1] == "my_sub"


def test_device_coalescing_runs_point_to_point_ops(api_runs):
    """``_coalescing_manager(device=...)``: gradwire collects the ops into one Work (gloo has no such mode)."""
    ref, got = api_runs
    for rank in range(2):
        recv = got[rank]["device_coalescing"]
        assert not isinstance(recv, tuple), recv
        assert recv.tolist() == api_workers._vals(1 - rank, 4).tolist()


def test_integer_avg_runs_as_on_nccl(api_runs):
    """gloo cannot cast its quotient back to int64; gradwire takes integer AVG as NCCL does (test_avg.py)."""
    ref, got = api_runs
    for key in ("int_reduce_avg", "int_all_reduce_avg"):
        for rank in range(2):
            assert ref[rank][key][0] == "error", (key, rank, ref[rank][key])
            assert got[rank][key] is None, (key, rank, got[rank][key])


def test_coalesced_ops_are_priced_as_one_op_of_their_total_bytes(api_runs):
    for r in api_runs[1]:
        priced = r["priced"]
        assert priced["calls"] == 1
        assert priced["payload_bytes"] == (1000 + 3000) * 2 * 4


def test_detail_debug_mode_detects_mismatched_collectives():
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    ref = spawn(api_workers.mismatches, 2, ("gloo",), timeout=60, env=env)
    got = spawn(api_workers.mismatches, 2, ("gradwire",), timeout=60, env=env)
    for rank in range(2):
        for kind in ("shape", "op"):
            assert "Detected mismatch between collectives" in ref[rank][kind]["message"]
            assert got[rank][kind]["error"] == ref[rank][kind]["error"], (kind, got[rank], ref[rank])
            assert "Detected mismatch between collectives" in got[rank][kind]["message"], (kind, got[rank])
