"""Train a small GPT with DDP and AdamW on generated English-like text, as a torchrun script does.

The corpus (about 300 KB) is generated at start from a fixed seed: sentences
from a small grammar (people, animals, places, times, and sums such as
"seven plus five makes twelve"), so the model has structure to learn and
nothing is downloaded. Character level (bytes), a warm-up then cosine
learning rate, weight decay on the matrices only (two parameter groups),
the validation loss every ``--eval-every`` steps on rank 0. ``--accumulate N``
accumulates N micro-batches per step by toggling DDP's
``require_backward_grad_sync`` (as nanoGPT does) and ``--clip 1.0`` clips the
gradient norm before each step.

    torchrun --nproc-per-node 2 examples/gpt_adamw.py
    gradwire compare --net bandwidth=500mbit -- torchrun --nproc-per-node 2 examples/gpt_adamw.py --seed {seed}

Under ``gradwire compare`` the validation loss goes into the table through
``gradwire.report`` (a no-op anywhere else).
"""
from __future__ import annotations

import argparse
import math
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt import GPT, GPTConfig, loss_fn

try:
    from gradwire import report
except ImportError:  # gradwire not installed: nothing to report to
    def report(step=None, **metrics):  # type: ignore[no-untyped-def]
        pass

PEOPLE = ["the farmer", "my sister", "the old teacher", "a young painter", "our neighbour", "the baker",
          "a tired soldier", "the little boy", "her uncle", "the quiet student", "a famous singer", "the doctor"]
ANIMALS = ["the black cat", "a small bird", "the brown dog", "an old horse", "the white goat", "a clever fox"]
VERBS = [("sees", "see"), ("likes", "like"), ("finds", "find"), ("carries", "carry"), ("paints", "paint"),
         ("follows", "follow"), ("builds", "build"), ("watches", "watch"), ("sells", "sell"), ("cleans", "clean")]
THINGS = ["the red ball", "a wooden box", "the long letter", "an apple", "the green door", "a heavy stone",
          "the blue boat", "a silver key", "the broken chair", "a basket of bread", "the new lamp"]
PLACES = ["in the garden", "near the station", "at the market", "under the bridge", "by the river",
          "on the hill", "behind the church", "in the kitchen"]
TIMES = ["every morning", "on sunday", "at night", "after lunch", "in the winter", "before dawn"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
           "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]


def sentence(rng: random.Random) -> str:
    """One sentence of the grammar."""
    kind = rng.randrange(5)
    who = rng.choice(PEOPLE + ANIMALS)
    singular, plural = rng.choice(VERBS)
    if kind == 0:
        return f"{who} {singular} {rng.choice(THINGS)} {rng.choice(PLACES)}."
    if kind == 1:
        return f"{rng.choice(TIMES)}, {who} {singular} {rng.choice(THINGS)}."
    if kind == 2:
        return f"{who} and {rng.choice(PEOPLE)} {plural} {rng.choice(THINGS)}."
    if kind == 3:
        a, b = rng.randrange(10), rng.randrange(9)
        return f"{NUMBERS[a]} plus {NUMBERS[b]} makes {NUMBERS[a + b]}."
    return f"{who} {singular} {rng.choice(PEOPLE + ANIMALS)} {rng.choice(PLACES)} {rng.choice(TIMES)}."


def corpus(n_bytes: int = 300_000, seed: int = 1234) -> torch.Tensor:
    """The text as a byte tensor (the same on every rank and every run)."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        line = " ".join(sentence(rng) for _ in range(rng.randint(2, 5))).capitalize() + "\n"
        parts.append(line)
        size += len(line)
    return torch.tensor(list("".join(parts).encode()[:n_bytes]), dtype=torch.long)


def windows(data: torch.Tensor, starts: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(seq + 1)
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, 1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup", type=int, default=40, help="learning-rate warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the batches")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--accumulate", type=int, default=1,
                   help="micro-batches per optimizer step (DDP's require_backward_grad_sync off for all but the last)")
    p.add_argument("--clip", type=float, default=0.0, help="clip_grad_norm_ threshold before each step (0: none)")
    args = p.parse_args()

    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    data = corpus()
    split = int(len(data) * 0.9)
    train, val = data[:split], data[split:]
    cfg = GPTConfig(vocab=256, seq=args.seq, dim=args.dim, heads=args.heads, layers=args.layers)
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(device)
    ddp = DDP(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "tokens" not in n and "positions" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "tokens" not in n and "positions" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))

    def schedule(step: int) -> float:  # linear warm-up, then cosine down to a tenth
        if step < args.warmup:
            return (step + 1) / args.warmup
        done = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    batches = torch.Generator().manual_seed(1000 * args.seed + rank)
    val_x, val_y = windows(val, torch.arange(0, len(val) - args.seq - 1, (len(val) - args.seq - 1) // 32)[:32],
                           args.seq)

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            loss = loss_fn(model(val_x.to(device)), val_y.to(device)).item()
        model.train()
        return loss

    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        for micro in range(args.accumulate):  # accumulation as nanoGPT writes it: the reducer off but for the last
            ddp.require_backward_grad_sync = micro == args.accumulate - 1
            x, y = windows(train, torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=batches),
                           args.seq)
            loss = loss_fn(ddp(x.to(device)), y.to(device))
            (loss / args.accumulate).backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        if rank == 0 and (step % args.eval_every == 0 or step == args.steps):
            v = val_loss()
            report(step=step, val_loss=v)
            print(f"step {step}: train loss {loss.item():.4f}, val loss {v:.4f}, "
                  f"{(time.perf_counter() - t0) / step * 1e3:.1f} ms/step", flush=True)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"{n} parameters on {world} ranks, {args.steps} steps in {time.perf_counter() - t0:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
