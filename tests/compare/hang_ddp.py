"""A DDP script whose ranks hang inside a training step under one strategy, each with a child in a session of its own.

``hang_ddp.py PIDS STRATEGY``: every process it starts is written to the
folder PIDS as a file named ``<pid>-<start time>`` (the launcher that
started the rank too), first thing, so a test can check each by pid
whatever happens later. The child stands for a DataLoader worker: it
sleeps in a session of its own. Under STRATEGY (``GRADWIRE_STRATEGY``, which
is ``sync`` for compute-only too) a rank hangs between forward and backward;
under any other it trains a few steps and ends.
"""
import os
import subprocess
import sys
import time

import psutil


def note(folder: str, pid: int) -> None:
    with open(os.path.join(folder, f"{pid}-{psutil.Process(pid).create_time()!r}"), "w"):
        pass


def main() -> None:
    folder, hang_under = sys.argv[1], sys.argv[2]
    hang = os.environ.get("GRADWIRE_STRATEGY") == hang_under
    if hang:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        for pid in (os.getpid(), os.getppid(), child.pid):
            note(folder, pid)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        loss = model(torch.randn(4, 8)).square().mean()
        if hang:
            time.sleep(600)  # hung between forward and backward, as a rank waiting on a dead peer would be
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
