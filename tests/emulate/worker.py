"""Run by the tests on every rank of an emulated cluster: a timed gloo all_reduce and what the rank saw.

Usage: worker.py OUT_DIR NBYTES. Writes OUT_DIR/rank<R>.json and leaves
without tearing the group down (gloo's teardown may abort a process that
already delivered its result, see gradwire.launch).
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gradwire.net.spec import parse_spec, resolve_topology

out, nbytes = Path(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.full((nbytes // 4,), float(rank + 1))
dist.all_reduce(x)  # warm-up: connections are set up on the first call
dist.barrier()
t0 = time.perf_counter()
dist.all_reduce(x)
seconds = time.perf_counter() - t0
expected = float(sum(range(1, world + 1))) * world  # two all_reduces of the per-rank values
topology = resolve_topology(parse_spec("topology=auto"), world, os.environ).topology
(out / f"rank{rank}.json").write_text(json.dumps({
    "rank": rank, "world": world, "seconds": seconds, "correct": bool(torch.all(x == expected)),
    "topology": topology, "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    "master_addr": os.environ.get("MASTER_ADDR"), "group_rank": int(os.environ["GROUP_RANK"]),
    "emulated_net": os.environ.get("GRADWIRE_EMULATED_NET"),
}))
sys.stdout.flush()
os._exit(0)
