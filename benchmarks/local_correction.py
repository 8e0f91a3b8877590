"""The local correction on and off: test accuracy over seeds, and how far the replicas drift apart.

Per seed, 4 ranks train the bundled digits CNN (``gradwire.train.models``,
the held-out 20% scored) from the same initial weights and data order with
``torch.optim.SGD(momentum=0.9)``:

- ``sgd``: DDP's own all_reduce, the optimizer as written;
- ``onebit`` (any compressor name): ``scheme_for(SGD)`` under ``scheme_hook``,
  the momentum moved into the exchange, every rank applying the same decoded
  average (the default: identical replicas);
- ``onebit:correct=1``: the same with the local correction (rank ``i``
  applies ``avg + e'_i - e_i``), whose replicas differ;
- ``topk:0.01`` and ``topk:0.01:correct=1``: a compressor that drops far
  more (99% of the elements each step), where the correction has more to do.

Recorded per run: rank 0's test accuracy (what a script that evaluates and
saves on rank 0 gets), the accuracy of the ranks' mean model, and the
replicas' spread (the largest relative distance of a rank's parameters from
rank 0's; 0.0 is bit-identical). The ranks run on gloo over loopback: the
figures are accuracies, no time is measured. Writes
``benchmarks/results/local_correction/local_correction.json`` (``_results.write_results``):
one row per strategy with the mean, min and max over seeds and the gap to ``sgd`` in points.

    python benchmarks/local_correction.py --seeds 0 1 2 3 4 --epochs 20
    python benchmarks/local_correction.py --seeds 0 1 2 3 4 --epochs 60 \
        --out benchmarks/results/local_correction/local_correction_60ep.json
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from _results import write_results

OUT = Path(__file__).parent / "results" / "local_correction" / "local_correction.json"
STRATEGIES = ["sgd", "onebit", "onebit:correct=1", "topk:0.01", "topk:0.01:correct=1"]


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_one(rank: int, world: int, strategy: str, seed: int, args: dict[str, Any]) -> dict:
    from gradwire.exchange import CompressionState, scheme_for
    from gradwire.hooks import scheme_hook
    from gradwire.train.data import load_digits, shard_batches
    from gradwire.train.loop import evaluate
    from gradwire.train.models import build_model

    data = load_digits()
    model = build_model(args["model"], seed=seed)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args["lr"], momentum=0.9, weight_decay=args["weight_decay"])
    runner: Any = opt
    if strategy != "sgd":
        runner = scheme_for(opt, CompressionState(strategy))
        ddp.register_comm_hook(runner, scheme_hook)
    loss_fn = nn.CrossEntropyLoss()
    steps, spread, t0 = 0, 0.0, time.perf_counter()
    for epoch in range(args["epochs"]):
        for x, y in shard_batches(data, rank, world, args["batch_size"], seed, epoch):
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp(x), y).backward()
            runner.step()
            steps += 1
    flat = _flat(model)
    rows = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(rows, flat)
    spread = max(float((r - rows[0]).norm() / rows[0].norm()) for r in rows)
    own = evaluate(model, data.x_test, data.y_test)
    with torch.no_grad():  # the ranks' mean model
        mean = torch.stack(rows).mean(0)
        offset = 0
        for p in model.parameters():
            p.copy_(mean[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    averaged = evaluate(model, data.x_test, data.y_test)
    return {"strategy": strategy, "seed": seed, "steps": steps, "rank0_accuracy": own, "averaged_accuracy": averaged,
            "replica_spread": spread, "identical": spread == 0.0, "seconds": time.perf_counter() - t0}


def worker(rank: int, world: int, runs: list[tuple[str, int]], args: dict[str, Any]) -> list[dict]:
    from gradwire.launch import report

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    out = []
    for strategy, seed in runs:
        result = train_one(rank, world, strategy, seed, args)
        if rank == 0:
            report(result)
        out.append(result)
    return out


def summarise(runs: list[dict]) -> list[dict]:
    base = statistics.mean(r["rank0_accuracy"] for r in runs if r["strategy"] == "sgd") if any(
        r["strategy"] == "sgd" for r in runs) else float("nan")
    rows = []
    for strategy in dict.fromkeys(r["strategy"] for r in runs):
        mine = [r for r in runs if r["strategy"] == strategy]
        acc = [r["rank0_accuracy"] for r in mine]
        avg = [r["averaged_accuracy"] for r in mine]
        rows.append({"strategy": strategy, "seeds": len(acc), "mean": statistics.mean(acc), "min": min(acc),
                     "max": max(acc), "stdev": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                     "gap_points": 100 * (statistics.mean(acc) - base),
                     "averaged_mean": statistics.mean(avg),
                     "max_replica_spread": max(r["replica_spread"] for r in mine)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES,
                        help="sgd (DDP's all_reduce) or compressor names under the SGD scheme (add :correct=1)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    settings = {"model": args.model, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "weight_decay": args.weight_decay}
    runs = [(s, seed) for seed in args.seeds for s in args.strategies]
    from gradwire.launch import spawn
    from gradwire.train.loop import CPU_ONLY

    done: list[dict] = []

    def progress(rank: int, result: dict) -> None:
        done.append(result)
        print(f"{result['strategy']:>18} seed {result['seed']}: rank 0 {100 * result['rank0_accuracy']:.2f}%, "
              f"mean model {100 * result['averaged_accuracy']:.2f}%, spread {result['replica_spread']:.2g}  "
              f"{result['seconds']:.0f} s", flush=True)

    t0 = time.perf_counter()
    spawn(worker, args.world, (runs, settings), timeout=7200, env=CPU_ONLY, on_report=progress)
    rows = summarise(done)
    for r in rows:
        print(f"{r['strategy']:>18}: rank 0 {100 * r['mean']:.2f} [{100 * r['min']:.2f}, {100 * r['max']:.2f}] "
              f"gap {r['gap_points']:+.2f} points; mean model {100 * r['averaged_mean']:.2f}; "
              f"spread <= {r['max_replica_spread']:.2g}")
    write_results(args.out, rows,
                  command="python benchmarks/local_correction.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  settings={**settings, "world": args.world, "seeds": args.seeds, "backend": "gloo"},
                  seconds=time.perf_counter() - t0, runs=done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
