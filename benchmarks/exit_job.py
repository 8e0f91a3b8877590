"""The job ``exit_aborts.py`` starts: a DDP script that trains a few steps and returns at once (a torchrun script).

``exit_job.py BACKEND``: ``gloo``, or ``gradwire`` (imports gradwire; the network is ``GRADWIRE_NET``).
It ends right after its last step, as most training scripts do, which is when
gloo's workers may still hold the last works (src/gradwire/backend/teardown.py).
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    backend = sys.argv[1]
    if backend == "gradwire":
        import gradwire  # noqa: F401 - registers the backend
    dist.init_process_group(backend)
    model = DDP(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        loss = model(torch.randn(4, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
