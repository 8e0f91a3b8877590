"""A DDP script whose ranks hang inside a training step, each with a child in a session of its own.

``hang_ddp.py PIDS [MARKER]``: every process it starts is written to the
folder PIDS as a file named ``<pid>-<start time>`` (the launcher that
started the rank too), first thing, so a test can check each by pid
whatever happens later. The child stands for a DataLoader worker: it
sleeps in a session of its own. With MARKER, only the first start hangs
(it creates MARKER); a later one fails at once.
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
    folder = sys.argv[1]
    marker = sys.argv[2] if len(sys.argv) > 2 else None
    launcher = str(os.getppid())  # the ranks of one start share their launcher (torchrun)
    if marker and os.path.exists(marker):
        with open(marker) as f:
            if f.read() != launcher:
                raise SystemExit("not the first start: failing at once")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    for pid in (os.getpid(), os.getppid(), child.pid):
        note(folder, pid)
    if marker:
        with open(marker, "w") as f:
            f.write(launcher)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 8)).sum()
    time.sleep(600)  # hung between forward and backward, as a rank waiting on a dead peer would be
    loss.backward()
    opt.step()


if __name__ == "__main__":
    main()
