"""FSDP2, tensor parallel, pipeline parallel and a 2-D mesh train on gradwire exactly as on gloo.

Each world size runs once per backend (a module fixture); the tests compare
this rank's parameters after a few AdamW steps bit for bit (gloo is
deterministic for a fixed world size), and check that the simulated network
counted the traffic these strategies really make.
"""
import pytest
import torch

from gradwire.launch import spawn
from gradwire.net import NetworkModel
from tests.parallel import workers

PARTS_2 = ("fsdp2", "tp", "pp_gpipe", "pp_1f1b")
PARTS_4 = ("fsdp2", "mesh_2d")
#: two nodes of two ranks: TP groups ([0, 1], [2, 3]) stay inside a node, DP groups ([0, 2], [1, 3]) cross
NET_4 = "1gbe,topology=2x2,intra=nvlink"


@pytest.fixture(scope="module")
def runs_2():
    ref = spawn(workers.parallel_suite, 2, ("gloo", None, PARTS_2), timeout=110)
    got = spawn(workers.parallel_suite, 2, ("gradwire", "10gbe", PARTS_2), timeout=110)
    return ref, got


@pytest.fixture(scope="module")
def runs_4():
    ref = spawn(workers.parallel_suite, 4, ("gloo", None, PARTS_4), timeout=110)
    got = spawn(workers.parallel_suite, 4, ("gradwire", NET_4, PARTS_4), timeout=110)
    return ref, got


def _assert_same_params(ref, got, part):
    for rank, (r, g) in enumerate(zip(ref, got)):
        a, b = r[part]["params"], g[part]["params"]
        assert len(a) == len(b) > 0, (part, rank)
        for i, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"{part}: rank {rank} parameter {i} differs from gloo by {(x - y).abs().max()}"


@pytest.mark.parametrize("part", PARTS_2)
def test_two_ranks_match_gloo(runs_2, part):
    _assert_same_params(*runs_2, part)


@pytest.mark.parametrize("part", PARTS_4)
def test_four_ranks_match_gloo(runs_4, part):
    _assert_same_params(*runs_4, part)


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_traffic_is_the_parameters(runs_2, runs_4, world):
    """Per step: every parameter all-gathered for forward and again for backward, every gradient reduce-scattered."""
    got = (runs_2 if world == 2 else runs_4)[1]
    for r in got:
        run = r["fsdp2"]
        ops = run["net"]["stats"]
        param_bytes = run["n_params"] * 4
        assert ops["all_gather"]["payload_bytes"] == workers.STEPS * 2 * param_bytes
        assert ops["reduce_scatter"]["payload_bytes"] == workers.STEPS * param_bytes
        # a ring moves (p-1)/p of the gathered buffer out of each rank
        assert ops["all_gather"]["sent_bytes"] == pytest.approx(workers.STEPS * 2 * param_bytes * (world - 1) / world,
                                                                rel=1e-3)


def test_tensor_parallel_all_reduces_activations(runs_2):
    for r in runs_2[1]:
        ops = r["tp"]["net"]["stats"]
        # RowwiseParallel all-reduces each block's output in forward (2 blocks), ColwiseParallel its input
        # gradient in backward: the second block only (the first block's input is data, without a gradient)
        activation = 8 * workers.WIDTH * 4
        assert ops["all_reduce"]["calls"] == workers.STEPS * (2 + 1)
        assert ops["all_reduce"]["payload_bytes"] == workers.STEPS * (2 + 1) * activation


@pytest.mark.parametrize("schedule", ["pp_gpipe", "pp_1f1b"])
def test_pipeline_sends_activations_forward_and_gradients_back(runs_2, schedule):
    for rank, r in enumerate(runs_2[1]):
        run = r[schedule]
        ops = run["net"]["stats"]
        per_step = run["microbatches"] * run["activation_bytes"]
        steps = workers.STEPS - 1  # the first step is left out (shape exchange)
        # stage 0 sends activations and receives their gradients; stage 1 the reverse
        assert ops["send"]["payload_bytes"] == steps * per_step, (rank, ops)
        assert ops["recv"]["payload_bytes"] == steps * per_step, (rank, ops)
        assert ops["send"]["calls"] == ops["recv"]["calls"] == steps * run["microbatches"]
        assert ops["recv"]["sent_bytes"] == 0 and ops["send"]["sent_bytes"] == steps * per_step


def test_mesh_groups_use_the_link_of_their_nodes(runs_4):
    """On topology=2x2 a TP group is priced as a 2-rank NVLink network, a DP group as a 2-rank 1GbE one."""
    intra, inter = NetworkModel("nvlink", 2), NetworkModel("1gbe", 2)
    seen = {"intra": 0, "inter": 0}
    for r in runs_4[1]:
        for op, ranks, nbytes, seconds, _ in r["mesh_2d"]["net"]["events"]:
            assert ranks is not None and len(ranks) == 2, (op, ranks)
            if op in ("send", "recv", "barrier"):
                continue
            same_node = ranks[0] // 2 == ranks[1] // 2
            flat = intra if same_node else inter
            # rel 1e-6: the backend prices each op from when its link lets it start (a piecewise sum whose
            # rounding differs from one cost() call in the last digits); intra and inter differ by far more
            assert seconds == pytest.approx(flat.cost(op, nbytes).seconds, rel=1e-6), (op, ranks, nbytes)
            seen["intra" if same_node else "inter"] += 1
    # TP traffic (all_reduce) inside nodes, FSDP traffic (all_gather, reduce_scatter) across them
    assert seen["intra"] > 0 and seen["inter"] > 0, seen


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fsdp2_and_tensor_parallel_match_gloo_on_the_same_devices():
    """gradwire on CUDA tensors (nccl, or gloo on a shared GPU) against the same inner backend used directly."""
    world = 2
    inner = "nccl" if torch.cuda.device_count() >= world else "gloo"
    ref = spawn(workers.cuda_suite, world, (inner, None), timeout=150)
    got = spawn(workers.cuda_suite, world, ("gradwire", "10gbe"), timeout=150)
    for rank in range(world):
        for part in ("fsdp2", "tp"):
            for x, y in zip(ref[rank][part], got[rank][part]):
                assert torch.equal(x, y), (rank, part)
