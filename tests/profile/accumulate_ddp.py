"""DDP with gradient accumulation: ``ACCUM_MICRO`` micro-steps (backward passes) per optimizer step.

The gradients are exchanged once per optimizer step, after the last micro-step;
the earlier ones skip the exchange as users write it (``ACCUM_MODE``):
``no_sync`` (``with ddp.no_sync():``) or ``flag`` (``ddp.require_backward_grad_sync
= False``, as many GPT training scripts do). Knows nothing of gradwire (run with torchrun).

``ACCUM_STEPS`` optimizer steps of an MLP of width ``ACCUM_WIDTH`` on batches
of ``ACCUM_BATCH``. ``ACCUM_SLEEP_MS=F,B``: each forward also waits F ms and its
backward B ms at the model's input (after every gradient is ready), as a host
thread waits for a GPU's kernels: compute whose time other work on the machine
does not move; with ``ACCUM_OUT`` (a path with ``{rank}``) each rank writes the
wall seconds of each optimizer step as the script saw them (after a barrier, so
every rank starts together).
"""
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class _Wait(torch.autograd.Function):
    """Identity that sleeps ``f`` seconds in forward and ``b`` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, f: float, b: float) -> torch.Tensor:  # type: ignore[override]
        ctx.b = b
        time.sleep(f)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        time.sleep(ctx.b)
        return grad, None, None


def main() -> None:
    micro, mode = int(os.environ.get("ACCUM_MICRO", "2")), os.environ.get("ACCUM_MODE", "no_sync")
    steps, width = int(os.environ.get("ACCUM_STEPS", "6")), int(os.environ.get("ACCUM_WIDTH", "128"))
    batch = int(os.environ.get("ACCUM_BATCH", "32"))
    wait_f, wait_b = (float(v) / 1e3 for v in os.environ.get("ACCUM_SLEEP_MS", "0,0").split(","))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    dist.barrier()
    ends = [time.perf_counter()]
    for _ in range(steps):
        for m in range(micro):
            last = m == micro - 1
            if mode == "flag":
                ddp.require_backward_grad_sync = last
                context: contextlib.AbstractContextManager = contextlib.nullcontext()
            else:
                context = contextlib.nullcontext() if last else ddp.no_sync()
            with context:
                inputs = _Wait.apply(x.requires_grad_(wait_b > 0), wait_f, wait_b) if wait_f or wait_b else x
                loss = torch.nn.functional.cross_entropy(ddp(inputs), y) / micro
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    if os.environ.get("ACCUM_OUT"):
        with open(os.environ["ACCUM_OUT"].format(rank=dist.get_rank()), "w") as f:
            json.dump({"micro": micro, "mode": mode, "batch": batch,
                       "step_seconds": [b - a for a, b in zip(ends, ends[1:])]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
