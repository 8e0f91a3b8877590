"""DDP with ``optimizer.step(closure)``: forward and backward run inside the step (Lightning's automatic
optimization does this; ``CLOSURE_OPT=lbfgs`` evaluates the closure several times per step)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 8


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    if os.environ.get("CLOSURE_OPT") == "lbfgs":
        opt: torch.optim.Optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(STEPS):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
