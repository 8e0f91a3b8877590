"""A small DDP script for ``gradwire profile --ops`` and its replay (run with torchrun; ``OPS_DDP_WIDTH`` sets the model)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    width = int(os.environ.get("OPS_DDP_WIDTH", "64"))
    model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for step in range(int(os.environ.get("OPS_DDP_STEPS", "8"))):
        opt.zero_grad()
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
