"""A plain DDP script that knows nothing of gradwire (run with torchrun).

``PLAIN_DDP_DEVICE=cuda``: the model on the GPU and the nccl backend, as GPU
scripts are written (ranks beyond the GPU count share one).
"""
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4


def main() -> None:
    device = os.environ.get("PLAIN_DDP_DEVICE", "cpu")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
        opt.step()
    if dist.get_rank() == 0 and os.environ.get("PLAIN_DDP_OUT"):
        nparams = sum(p.numel() for p in model.parameters())
        with open(os.environ["PLAIN_DDP_OUT"], "w") as f:
            json.dump({"param_bytes": nparams * 4, "steps": STEPS, "backend": dist.get_backend(),
                       "group": type(dist.group.WORLD).__name__}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
