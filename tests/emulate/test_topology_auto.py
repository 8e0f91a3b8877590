"""``topology=auto``: the gradwire backend reads nodes and ranks per node in torchrun's environment."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.launch import free_port
from gradwire.net import NetworkModel, parse_spec
from gradwire.net.spec import resolve_topology

AUTO = parse_spec("bandwidth=1gbit,topology=auto")


def torchrun_env(rank, node, per_node, nodes):
    return {"RANK": str(rank), "GROUP_RANK": str(node), "LOCAL_RANK": str(rank - node * per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_WORLD_SIZE": str(nodes)}


def test_auto_parses_and_round_trips():
    assert AUTO.topology == "auto"
    assert parse_spec(AUTO.to_string()) == AUTO and "topology=auto" in AUTO.to_string()


def test_resolves_to_nodes_by_ranks_per_node():
    for rank in range(6):
        spec = resolve_topology(AUTO, 6, torchrun_env(rank, rank // 3, 3, 2))
        assert spec.topology == (2, 3)
    assert resolve_topology(AUTO, 4, {"LOCAL_WORLD_SIZE": "4"}).topology == (1, 4)
    fixed = parse_spec("bandwidth=1gbit,topology=2x2")
    assert resolve_topology(fixed, 4, {}) is fixed


@pytest.mark.parametrize("env, match", [
    ({}, "launch it with torchrun"),
    ({"LOCAL_WORLD_SIZE": "3"}, "do not split"),
    ({"LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "3"}, "nodes of different sizes"),
    ({**torchrun_env(1, 0, 2, 2), "RANK": "2"}, "contiguous"),
])
def test_layouts_that_are_not_n_by_m_are_refused(env, match):
    with pytest.raises(ValueError, match=match):
        resolve_topology(AUTO, 4, env)


def test_an_unresolved_auto_is_not_priced():
    with pytest.raises(ValueError, match="topology=auto is resolved with torchrun"):
        NetworkModel(AUTO, 4)


@pytest.mark.slow
def test_two_torchrun_nodes_price_intra_and_inter_links(tmp_path):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", GRADWIRE_NET="bandwidth=1gbit,topology=auto,clock=virtual")
    script = str(Path(__file__).parent / "auto_script.py")
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2",
         "--rdzv-backend=static", f"--rdzv-endpoint=127.0.0.1:{port}", script, str(tmp_path)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    try:
        errors = [a.communicate(timeout=100)[1] for a in agents]
    finally:
        for a in agents:
            a.kill()
    got = {r["rank"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("rank*.json"))}
    assert sorted(got) == [0, 1, 2, 3], errors
    for rank, r in got.items():
        assert r["topology"] == [2, 2] and r["node"] == rank // 2 == r["group_rank"] and r["value"] == 4.0
