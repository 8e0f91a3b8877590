"""Train a small GPT with FSDP2 (``fully_shard``) and AdamW, on CPU (gloo) or GPU (nccl).

Every transformer block is one FSDP unit, and the root module holds the
embeddings, the final norm and the head. Per step FSDP all-gathers each
block's parameters for forward and again for backward (the root's once: it
stays gathered between them) and reduce-scatters every gradient.

    torchrun --nproc-per-node 2 examples/fsdp2_gpt.py
    gradwire profile --net bandwidth=100mbit -- torchrun --nproc-per-node 2 examples/fsdp2_gpt.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from gpt import GPT, GPTConfig, batch, loss_fn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes its step times and sizes here")
    args = p.parse_args()
    if args.steps < 2:
        p.error(f"--steps must be at least 2 (the first step is warm-up), got {args.steps}")

    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = GPTConfig(layers=args.layers, dim=args.dim)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    root_params = n_params - sum(p.numel() for b in model.blocks for p in b.parameters())

    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    times, losses = [], []
    for step in range(args.steps):
        x, y = batch(cfg, args.batch, seed=1000 * rank + step, device=device)
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.4f}, {times[-1] * 1e3:.1f} ms", flush=True)
    steady = statistics.median(times[1:])
    if rank == 0:
        print(f"{n_params} parameters on {world} ranks; median step (after the first) {steady * 1e3:.1f} ms")
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "world": world, "n_params": n_params, "root_params": root_params, "layers": cfg.layers,
                "block_params": (n_params - root_params) // cfg.layers, "steps": args.steps,
                "step_seconds": times, "median_step_seconds": steady, "losses": losses}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
