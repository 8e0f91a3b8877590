"""A DDP script in the shape of PyTorch's own "Getting Started with Distributed Data Parallel" tutorial.

It knows nothing of gradwire: a ``ToyModel``, ``setup``/``cleanup`` with a
fixed ``MASTER_ADDR``/``MASTER_PORT`` and the gloo backend,
``torch.multiprocessing.spawn`` to start the ranks, ``DistributedDataParallel``
and plain SGD on random data (a short loop here, where the tutorial takes
one step). ``gradwire compare`` runs it unchanged under every strategy:

    python examples/ddp_tutorial.py
    gradwire compare --strategies sync,onebit,delayed,onebit+delayed,localsgd:4 -- python examples/ddp_tutorial.py
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 50


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)

    # create model and wrap it in DDP
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    for _ in range(STEPS):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    world_size = n_gpus if n_gpus >= 2 else 2
    run_demo(demo_basic, world_size)
