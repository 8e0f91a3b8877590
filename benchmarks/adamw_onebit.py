"""AdamW under onebit and int8 (gradwire's 1-bit Adam scheme) against uncompressed AdamW: test accuracy and bytes.

Per model (digits, the held-out 20%), strategy and seed, 4 ranks train the
same epochs from the same initial weights and data order:

- ``adamw``: DDP's own all_reduce, ``torch.optim.AdamW`` as written;
- ``onebit``, ``int8`` (any compressor name; ``none`` isolates what the
  scheme's frozen variance costs): ``CompressionState(name)`` under
  ``scheme_for(AdamW)`` and ``scheme_hook`` (full-precision warm-up, then the
  preconditioned momentum compressed in the exchange;
  :mod:`gradwire.exchange.schemes`); ``--adam KEY=VALUE`` passes options to the scheme.

Every rank trains on the ``gradwire`` backend over the loopback network, so
``gradwire.stats()`` counts the bytes each rank put on the wire (warm-up and
variance refreshes included). With the local correction the ranks' models
differ a little; rank 0's is scored (``--average``: their mean; both are
recorded, with rank 0's distance from the mean).
All runs share one set of processes (``gradwire.launch.spawn``); rank 0
reports each as it ends. Writes ``benchmarks/results/adamw_onebit.json`` in the
shared shape of ``_results.write_results``: one row per model and strategy (the
test accuracy's mean, min and max over the seeds, the gap to ``adamw`` in points,
and the wire bytes per step), each run under ``runs``.

    python benchmarks/adamw_onebit.py --models mlp cnn --seeds 0 1 2 --epochs 20
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

OUT = Path(__file__).parent / "results" / "adamw_onebit.json"
STRATEGIES = ["adamw", "onebit", "int8"]


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def train_one(rank: int, world: int, model_name: str, strategy: str, seed: int, args: dict[str, Any]) -> dict:
    import gradwire
    from gradwire.exchange import CompressionState, scheme_for
    from gradwire.hooks import scheme_hook
    from gradwire.train.data import load_digits, shard_batches
    from gradwire.train.loop import evaluate
    from gradwire.train.models import build_model

    data = load_digits()
    model = build_model(model_name, seed=seed)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args["lr"], weight_decay=args["weight_decay"])
    scheme = None
    if strategy != "adamw":
        state = CompressionState(strategy, **args["state"])
        scheme = scheme_for(opt, state, **args["adam"])
        ddp.register_comm_hook(scheme, scheme_hook)
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    gradwire.reset_stats()
    steps, t0 = 0, time.perf_counter()
    for epoch in range(args["epochs"]):
        for x, y in shard_batches(data, rank, world, args["batch_size"], seed, epoch):
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp(x), y).backward()
            (scheme or opt).step()
            steps += 1
    wire = gradwire.stats().as_dict()["total"]["wire_bytes"]
    own = evaluate(model, data.x_test, data.y_test)
    with torch.no_grad():  # the ranks' mean model, and how far this rank's is from it
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        mean = flat.clone()
        dist.all_reduce(mean)
        mean.div_(world)
        spread = float((flat - mean).norm() / mean.norm())
        offset = 0
        for p in model.parameters():
            p.copy_(mean[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    averaged = evaluate(model, data.x_test, data.y_test)
    return {"model": model_name, "strategy": strategy, "seed": seed, "steps": steps,
            "test_accuracy": averaged if args["average"] else own, "rank0_accuracy": own,
            "averaged_accuracy": averaged, "rank_spread": spread, "wire_bytes_per_step": wire / steps,
            "scheme": None if scheme is None else scheme.describe(), "seconds": time.perf_counter() - t0}


def worker(rank: int, world: int, runs: list[tuple[str, str, int]], args: dict[str, Any]) -> list[dict]:
    import gradwire
    from gradwire.launch import report

    torch.set_num_threads(1)
    gradwire.configure("loopback")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    out = []
    for model_name, strategy, seed in runs:
        result = train_one(rank, world, model_name, strategy, seed, args)
        if rank == 0:
            report(result)
        out.append(result)
    return out


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for model in dict.fromkeys(r["model"] for r in runs):
        base = [r["test_accuracy"] for r in runs if r["model"] == model and r["strategy"] == "adamw"]
        base_mean = statistics.mean(base) if base else float("nan")
        for strategy in dict.fromkeys(r["strategy"] for r in runs if r["model"] == model):
            mine = [r for r in runs if r["model"] == model and r["strategy"] == strategy]
            acc = [r["test_accuracy"] for r in mine]
            wire = statistics.mean(r["wire_bytes_per_step"] for r in mine)
            rows.append({"model": model, "strategy": strategy, "seeds": len(acc), "mean": statistics.mean(acc),
                         "min": min(acc), "max": max(acc), "gap_points": 100 * (statistics.mean(acc) - base_mean),
                         "wire_bytes_per_step": wire})
    for row in rows:
        ref = next((r for r in rows if r["model"] == row["model"] and r["strategy"] == "adamw"), None)
        row["byte_reduction"] = ref["wire_bytes_per_step"] / row["wire_bytes_per_step"] if ref else None
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES,
                        help="adamw (DDP's all_reduce) or compressor names under the scheme (none: the scheme "
                             "without compression, which isolates the frozen variance)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--adam", nargs="*", default=[], metavar="KEY=VALUE",
                        help="options of scheme_for (adam_warmup=16, refresh=false, ...)")
    parser.add_argument("--state", nargs="*", default=[], metavar="KEY=VALUE",
                        help="options of CompressionState (local_correction=false, ...)")
    parser.add_argument("--average", action="store_true",
                        help="score the ranks' mean model (rank 0's by default; both are recorded)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    adam = {k: _value(v) for k, v in (item.split("=", 1) for item in args.adam)}
    state = {k: _value(v) for k, v in (item.split("=", 1) for item in args.state)}
    settings = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "weight_decay": args.weight_decay, "adam": adam, "state": state, "average": args.average}
    runs = [(m, s, seed) for m in args.models for seed in args.seeds for s in args.strategies]
    from gradwire.launch import spawn
    from gradwire.train.loop import CPU_ONLY

    done: list[dict] = []

    def progress(rank: int, result: dict) -> None:
        done.append(result)
        print(f"{result['model']:>8} {result['strategy']:>7} seed {result['seed']}: "
              f"{100 * result['rank0_accuracy']:.2f}% (mean model {100 * result['averaged_accuracy']:.2f}%, "
              f"spread {result['rank_spread']:.2g})  {result['wire_bytes_per_step'] / 1e3:.1f} KB/step  "
              f"{result['seconds']:.0f} s", flush=True)

    t0 = time.perf_counter()
    spawn(worker, args.world, (runs, settings), timeout=7200, env=CPU_ONLY, on_report=progress)
    rows = summarise(done)
    for r in rows:
        print(f"{r['model']:>8} {r['strategy']:>7}: mean {100 * r['mean']:.2f} [{100 * r['min']:.2f}, "
              f"{100 * r['max']:.2f}] gap {r['gap_points']:+.2f} points, {r['wire_bytes_per_step'] / 1e3:.1f} KB/step"
              + (f" ({r['byte_reduction']:.1f}x fewer)" if r["byte_reduction"] else ""))
    write_results(args.out, rows,
                  command="python benchmarks/adamw_onebit.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  settings={**settings, "world": args.world, "models": args.models, "seeds": args.seeds},
                  seconds=time.perf_counter() - t0, runs=done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
