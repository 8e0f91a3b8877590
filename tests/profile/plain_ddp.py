"""A plain DDP script that knows nothing of gradwire (run with torchrun)."""
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(torch.randn(32, 64)), torch.randint(0, 10, (32,))).backward()
        opt.step()
    if dist.get_rank() == 0 and os.environ.get("PLAIN_DDP_OUT"):
        nparams = sum(p.numel() for p in model.parameters())
        with open(os.environ["PLAIN_DDP_OUT"], "w") as f:
            json.dump({"param_bytes": nparams * 4, "steps": STEPS, "backend": dist.get_backend()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
