"""A small DDP training script for the compare tests (RANK, WORLD_SIZE, MASTER_* from the environment).

``--optimizer sgd|nesterov|adamw`` picks what gradwire has to work with,
``--no-ddp`` trains without DDP, ``--report`` calls ``gradwire.report``.
``--val`` reports a held-out ``val_loss`` (before ``score``), and
``--diverge-under NAME`` climbs the loss instead of descending it under the
strategy NAME (a training that goes wrong, as a broken exchange would make
it). ``--snapshot`` resumes from ``snapshot.pt`` in the working directory when it
is there and saves it every 2 steps, as PyTorch's DDP tutorial does.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", choices=("sgd", "nesterov", "adamw"), default="sgd")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--report", action="store_true")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--snapshot", action="store_true")
    p.add_argument("--val", action="store_true")
    p.add_argument("--diverge-under", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))  # 2372 parameters: compressed
    module = model if args.no_ddp else DDP(model)
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9, nesterov=args.optimizer == "nesterov")
    data = torch.Generator().manual_seed(100 * args.seed + rank)
    held_out = torch.randn(64, 32, generator=torch.Generator().manual_seed(12345))
    sign = -1.0 if args.diverge_under and os.environ.get("GRADWIRE_STRATEGY") == args.diverge_under else 1.0
    first = 1
    if args.snapshot and os.path.exists("snapshot.pt"):
        saved = torch.load("snapshot.pt")
        model.load_state_dict(saved["model"])
        first = saved["step"] + 1
    for step in range(first, args.steps + 1):
        x = torch.randn(16, 32, generator=data)
        loss = nn.functional.mse_loss(module(x), x[:, :4])
        opt.zero_grad()
        (sign * loss).backward()
        opt.step()
        if args.report and rank == 0 and step % 2 == 0:
            import gradwire

            with torch.no_grad():
                val = {"val_loss": nn.functional.mse_loss(model(held_out), held_out[:, :4]).item()} if args.val else {}
            gradwire.report(step=step, **val, score=float(step) + args.seed)
        if args.snapshot and rank == 0 and step % 2 == 0:
            torch.save({"model": model.state_dict(), "step": step}, "snapshot.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
