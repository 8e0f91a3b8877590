"""Run by the outage test on every rank: gloo all_reduces back to back across an outage of the emulated links.

Usage: outage_worker.py OUT_DIR NBYTES UNTIL. Calls all_reduce until UNTIL
seconds after the run's t = 0 (GRADWIRE_EMULATE_T0) and writes, per call, its
start and end on that clock (the end after the small all_reduce that agrees on
stopping: an outage may begin in either) and whether its result was right, to
OUT_DIR/rank<R>.json; leaves without tearing the group down (see worker.py).
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out, nbytes, until = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
t0 = float(os.environ["GRADWIRE_EMULATE_T0"])
dist.init_process_group("gloo")
group_at = time.monotonic() - t0
rank, world = dist.get_rank(), dist.get_world_size()
calls = []
x = torch.empty(nbytes // 4)
while True:
    stop = torch.tensor([float(time.monotonic() - t0 > until)])
    x.fill_(rank + 1)
    begin = time.monotonic() - t0
    dist.all_reduce(x)
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops after the same call
    end = time.monotonic() - t0
    calls.append([begin, end, bool(torch.all(x == sum(range(1, world + 1))))])
    if stop.item():
        break
(out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "group_at": group_at, "calls": calls}))
sys.stdout.flush()
os._exit(0)
