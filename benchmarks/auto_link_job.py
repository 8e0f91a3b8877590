"""The training ``auto_link.py`` runs on real packets and on the simulated backend (a torchrun script).

DDP (gloo) of one 256 x 512 linear layer (131 k elements, one bucket), SGD, the ``auto`` hook deciding
every 4 steps, 40 steps; rank 0 writes what ``auto`` measured and chose to ``--out``.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire.exchange import CompressionState
from gradwire.hooks import compression_hook


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(256, 512))
    state = CompressionState("auto:every=4", momentum=0.9)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert state.auto is not None
    if rank == 0:
        summary = state.auto.summary()
        last = summary["decisions"][-1]["choices"] if summary["decisions"] else {}
        summary["choice"] = Counter(last.values()).most_common(1)[0][0] if last else "none"
        with open(args.out, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
