"""The tensor work of one onebit+delayed step on one rank, allocating per step or reusing buffers.

What a rank of ``onebit+delayed`` does with its bucket each step (the digits
CNN-wide, 601,610 parameters, one bucket; 4 ranks' rows stood in by copies of
this rank's, one thread): momentum, the copy that is sent, error feedback,
two-phase encode, the server's combine and re-encode, the gathered decode and
the step's ``u = m_t + avg_{t-1} - m_{t-1}``. Two ways, in one process,
taking turns in blocks of ``--block`` steps (so that a drifting machine hits
both alike; step by step, the two working sets would evict each other from
the caches):

- ``fresh``: every bucket-sized tensor allocated anew each step (clones, the
  approximation, decode outputs), as the code did before it reused buffers;
- ``reuse``: what :class:`gradwire.strategies.DelayedStrategy` and
  :class:`gradwire.exchange.CompressionState` do (spent buffers, the residual
  buffers lent for the approximations, decode into the caller's buffer).

glibc serves a multi-MB allocation from fresh pages whose first touch faults;
``fresh`` pays that each step. Median ms per step of the tensor work (the
backward that makes the gradient is not timed). Example::

    python benchmarks/onebit_delayed_step.py --blocks 8 --block 100
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from _results import write_results

from gradwire.compress import ErrorFeedback, StateKey, get_compressor, twophase
from gradwire.train import build_model, num_parameters

OUT = Path(__file__).parent / "results" / "onebit_delayed_step.json"
WORLD = 4


class Rank:
    """One rank's state across steps; ``reuse`` picks the allocation policy."""

    def __init__(self, n: int, reuse: bool) -> None:
        self.reuse = reuse
        self.comp = get_compressor("onebit")
        self.ef = ErrorFeedback()
        self.key = StateKey.of("bucket", n)
        self.m = torch.zeros(n)
        self.previous: tuple[torch.Tensor, torch.Tensor] | None = None
        self.spare: tuple[torch.Tensor, torch.Tensor] | None = None
        self.u = torch.empty(n)

    def step(self, grad: torch.Tensor) -> None:
        torch.add(grad, self.m, alpha=0.9, out=self.m)
        if self.reuse:
            local, sent = self.spare or (torch.empty_like(grad), torch.empty_like(grad))
            local.copy_(self.m)
            sent.copy_(local)
        else:
            local = self.m.clone()
            sent = local.clone()
        key = self.key
        self.ef.compensate(sent, key)
        lent = self.ef.workspace(key, sent) if self.reuse else None
        send, approx, plan = twophase.split_encode(sent, WORLD, self.comp, key, approx=lent)
        self.ef.update(key, sent, approx)
        chunk = twophase.server_combine(send, plan, 1, self.comp)  # this rank serves chunk 1
        served = key.serving(*plan.bounds[1])
        self.ef.compensate(chunk, served)
        lent = self.ef.workspace(served, chunk) if self.reuse else None
        row, chunk_approx = twophase.encode_row(chunk, plan, 1, self.comp, key, approx=lent)
        self.ef.update(served, chunk, chunk_approx)
        if self.reuse:
            twophase.gather_decode(torch.stack([row] * WORLD), plan, self.comp, out=sent)
        else:
            sent.copy_(twophase.gather_decode(torch.stack([row] * WORLD), plan, self.comp))
        if self.previous is not None:
            torch.add(local, self.previous[1], out=self.u).sub_(self.previous[0])
            self.spare = self.previous
        self.previous = (local, sent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=8, help="turns of each way")
    ap.add_argument("--block", type=int, default=100, help="steps per turn")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps at the start of each turn")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.blocks < 1 or args.block <= args.warmup:
        ap.error(f"need --blocks >= 1 and --block > --warmup, got {args.blocks}, {args.block}, {args.warmup}")
    torch.set_num_threads(1)
    n = num_parameters(build_model("cnn-wide"))
    grad = torch.randn(n, generator=torch.Generator().manual_seed(0))
    ranks = {"fresh": Rank(n, reuse=False), "reuse": Rank(n, reuse=True)}
    times: dict[str, list[float]] = {k: [] for k in ranks}
    for _ in range(args.blocks):
        for name, rank in ranks.items():
            for i in range(args.block):
                t0 = time.perf_counter()
                rank.step(grad)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    same = torch.equal(ranks["fresh"].u, ranks["reuse"].u)
    write_results(args.out, [], numel=n, blocks=args.blocks, block=args.block, warmup=args.warmup, median_ms=med,
                  saved_ms=med["fresh"] - med["reuse"], identical_updates=same)
    print(f"{n:,} values, median of {len(times['reuse'])} steps each: fresh {med['fresh']:.2f} ms, "
          f"reuse {med['reuse']:.2f} ms per rank-step; identical updates: {same}")


if __name__ == "__main__":
    main()
