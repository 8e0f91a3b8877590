"""Train a small GPT on a 2-D mesh: FSDP2 across data-parallel groups x tensor parallelism inside them.

With 4 ranks the mesh is (dp=2, tp=2): ranks [0, 1] and [2, 3] each split
every block's attention heads and MLP between them (q/k/v and the MLP's up
projection column-wise, the output projections row-wise: one all_reduce of
activations per sublayer in forward, one in backward); across the pairs, FSDP2
shards the parameters (all_gather before use, reduce_scatter of gradients).
On a cluster the TP group sits inside a node; with ``gradwire profile --net
...,topology=2x2`` the simulated network prices it on the intra-node link.

    torchrun --nproc-per-node 4 examples/fsdp_tp_gpt.py
    gradwire profile --net "1gbe,topology=2x2,intra=nvlink" -- torchrun --nproc-per-node 4 examples/fsdp_tp_gpt.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from gpt import GPT, GPTConfig, batch, loss_fn

#: how each transformer block is split inside a tensor-parallel group
BLOCK_PLAN = {
    "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
    "attn.o": RowwiseParallel(),
    "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel group size (ranks per data-parallel replica)")
    p.add_argument("--batch", type=int, default=8, help="sequences per data-parallel replica and step")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args()

    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.tp < 1 or world % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the number of ranks ({world})")
    cfg = GPTConfig(layers=args.layers, dim=args.dim)
    if cfg.heads % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the number of attention heads ({cfg.heads})")
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))

    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], BLOCK_PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    dp_rank = mesh["dp"].get_local_rank()  # the ranks of one TP group see the same batch
    times = []
    for step in range(args.steps):
        x, y = batch(cfg, args.batch, seed=1000 * dp_rank + step, device=device)
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}, {times[-1] * 1e3:.1f} ms", flush=True)
    if rank == 0:
        print(f"mesh dp={world // args.tp} x tp={args.tp}; median step (after the first) "
              f"{statistics.median(times[1:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
