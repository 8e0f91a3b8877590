"""Why ``onebit+diloco`` diverges: DiLoCo's outer gradient through a compressor, in one process.

Four replicas of examples/gpt_adamw.py (the same model, AdamW, schedule and
per-rank batches as under ``torchrun --nproc-per-node 4``) take H inner steps
each; then the outer gradient goes through the compressor as the two-phase
exchange computes it (each rank's ``delta_i + e_i`` compressed with its worker
residual, the mean of the decoded payloads re-compressed with the server
residual; the first round uncompressed, as the exchange's warm-up), and the
outer SGD with Nesterov momentum moves the anchor. No process group and no
network: only the arithmetic. Each round prints the validation loss, the
relative error of the applied outer gradient ``|g - mean delta| / |mean delta|``,
its cosine with the true mean, and the worker and server residual norms.

    python benchmarks/diloco_outer_compression.py --comp onebit          # the exchange as it is
    python benchmarks/diloco_outer_compression.py --comp onebit --ef 0   # no error feedback
    python benchmarks/diloco_outer_compression.py --comp int8

``--seed 100`` (default) is the held-out seed of ``benchmarks/wan_diloco.sh``.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import gpt_adamw as ga  # noqa: E402
from gpt import GPT, GPTConfig, loss_fn  # noqa: E402

from gradwire.compress import StateKey, get_compressor  # noqa: E402

WORLD = 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comp", default="onebit", help="compressor name, or none")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--H", type=int, default=100)
    p.add_argument("--lr", type=float, default=1.0, help="outer lr")
    p.add_argument("--mu", type=float, default=0.5, help="outer Nesterov momentum")
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--ef", type=int, default=1, help="error feedback across rounds (1) or none (0)")
    p.add_argument("--server", type=int, default=1, help="re-compress the mean as the two-phase server does")
    a = p.parse_args()
    torch.set_num_threads(1)

    data = ga.corpus()
    split = int(len(data) * 0.9)
    train, val = data[:split], data[split:]
    torch.manual_seed(a.seed)
    base = GPT(GPTConfig(vocab=256, seq=64, dim=64, heads=4, layers=2))
    models = [copy.deepcopy(base) for _ in range(WORLD)]

    def optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
        mat = [q for n, q in m.named_parameters() if q.dim() >= 2 and "tokens" not in n and "positions" not in n]
        rest = [q for n, q in m.named_parameters() if not (q.dim() >= 2 and "tokens" not in n and "positions" not in n)]
        return torch.optim.AdamW([{"params": mat, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                 lr=1e-2, betas=(0.9, 0.95))

    def schedule(step: int) -> float:
        if step < 40:
            return (step + 1) / 40
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 40) / max(1, a.steps - 40)))

    opts = [optimizer(m) for m in models]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in opts]
    gens = [torch.Generator().manual_seed(1000 * a.seed + r) for r in range(WORLD)]
    val_x, val_y = ga.windows(val, torch.arange(0, len(val) - 65, (len(val) - 65) // 32)[:32], 64)

    def flat(m: torch.nn.Module) -> torch.Tensor:
        return torch.cat([q.detach().reshape(-1) for q in m.parameters()])

    def load(m: torch.nn.Module, v: torch.Tensor) -> None:
        i = 0
        with torch.no_grad():
            for q in m.parameters():
                q.copy_(v[i:i + q.numel()].view_as(q))
                i += q.numel()

    anchor = flat(base)
    momentum = torch.zeros_like(anchor)
    comp = None if a.comp == "none" else get_compressor(a.comp)
    key = StateKey.of("params", anchor.numel())
    worker = [torch.zeros_like(anchor) for _ in range(WORLD)]
    server = torch.zeros_like(anchor)

    def roundtrip(x: torch.Tensor) -> torch.Tensor:
        assert comp is not None
        payload, ctx = comp.compress(x.clone(), key)
        return comp.decompress(payload, ctx).reshape(-1)

    print(f"{a.comp} ef={a.ef} server={a.server} H={a.H} lr={a.lr} mu={a.mu} seed={a.seed}")
    for step in range(1, a.steps + 1):
        for r in range(WORLD):
            x, y = ga.windows(train, torch.randint(0, len(train) - 65, (8,), generator=gens[r]), 64)
            loss = loss_fn(models[r](x), y)
            opts[r].zero_grad()
            loss.backward()
            opts[r].step()
            scheds[r].step()
        if step % a.H:
            continue
        deltas = [anchor - flat(m) for m in models]
        true = sum(deltas) / WORLD
        if comp is None or step == a.H:
            g = true.clone()
        else:
            decoded = []
            for r in range(WORLD):
                c = deltas[r] + worker[r] if a.ef else deltas[r]
                decoded.append(roundtrip(c))
                if a.ef:
                    worker[r] = c - decoded[-1]
            g = sum(decoded) / WORLD
            if a.server:
                c = g + server if a.ef else g
                g = roundtrip(c)
                if a.ef:
                    server = c - g
        momentum.mul_(a.mu).add_(g)
        anchor -= a.lr * (g + a.mu * momentum)
        for m in models:
            load(m, anchor)
        with torch.no_grad():
            models[0].eval()
            v = loss_fn(models[0](val_x), val_y).item()
            models[0].train()
        err = ((g - true).norm() / true.norm()).item()
        cos = torch.nn.functional.cosine_similarity(g, true, 0).item()
        print(f"step {step}: val loss {v:.4f}  |mean delta| {true.norm():.2f}  |g - mean|/|mean| {err:.2f}  "
              f"cos {cos:.2f}  |worker e| {sum(e.norm() for e in worker).item() / WORLD:.2f}  "
              f"|server e| {server.norm():.2f}", flush=True)


if __name__ == "__main__":
    main()
