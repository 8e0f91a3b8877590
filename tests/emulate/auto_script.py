"""Run by the tests on every rank of a two-node torchrun launch: what topology=auto resolved to."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import gradwire

dist.init_process_group("gradwire")  # GRADWIRE_NET=...,topology=auto from the environment
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(1 << 10)
dist.all_reduce(x)
model = gradwire.network()
(Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps({
    "rank": rank, "topology": model.spec.topology, "node": model.node_of(rank), "value": x[0].item(),
    "group_rank": int(os.environ["GROUP_RANK"]),
}))
sys.stdout.flush()
os._exit(0)  # gloo's teardown may abort a process that already wrote its result
