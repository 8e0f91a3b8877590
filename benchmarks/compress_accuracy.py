"""Test accuracy of every compressor on real training, PyTorch's own hooks as peers.

Digits CNN, 4 ranks, SGD momentum 0.9, the same seeds, data order and epochs
for every entry (``gradwire.train.run_training`` on the loopback network:
accuracy does not depend on the network, only the bytes do):

1. Every gradwire compressor as a DDP comm hook (``sync`` strategy; the hook
   owns the momentum and the optimizer runs without it, see
   :mod:`gradwire.exchange.state`), plus ``none`` (plain DDP all_reduce).
2. PyTorch's ``fp16_compress_hook`` and ``powerSGD_hook`` (rank 4) through the
   ``torch-fp16`` / ``torch-powersgd:4`` strategies: DDP with the hook
   registered as PyTorch documents it, the optimizer keeping its momentum.
3. Per entry: mean, std, min and max of the test accuracy over the seeds, the
   gap to ``none`` in percentage points, and the wire bytes per training step
   (rank 0's ``gradwire.stats()`` total over the steps; warm-up steps included).

Writes benchmarks/results/compress_accuracy.json and .md; a rerun with the same
arguments reuses the runs already in the JSON (``--fresh`` to redo them).
Example::

    python benchmarks/compress_accuracy.py --epochs 8 --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _results import write_results

from gradwire.train import TrainConfig, run_training

OUT = Path(__file__).parent / "results" / "compress_accuracy.json"
NAMES = ["none", "fp16", "bf16", "int8", "qsgd", "terngrad", "onebit", "onebit:warmup=24", "signum", "topk:0.01",
         "randomk:0.01", "powersgd:4", "torch-fp16", "torch-powersgd:4"]
#: acceptance: largest gap to ``none`` in points
TARGETS = {"onebit": 1.0, "int8": 1.0, "topk:0.01": 1.5}


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict:
    cfg = TrainConfig(strategy=name, net="loopback", model=args.model, seed=seed, epochs=args.epochs,
                      batch_size=args.batch_size, lr=args.lr, momentum=args.momentum)
    t0 = time.perf_counter()
    results = run_training(cfg, args.world)
    r0 = results[0]
    steps = len(r0.step_seconds)
    return {
        "name": name, "seed": seed, "test_accuracy": r0.test_accuracy, "epoch_accuracy": r0.epoch_accuracy,
        "ranks_agree": len({round(r.param_checksum, 6) for r in results}) == 1,
        "steps": steps, "wire_bytes_per_step": r0.stats["total"]["wire_bytes"] / max(1, steps),
        "seconds": time.perf_counter() - t0,
    }


def summarise(runs: list[dict], names: list[str]) -> list[dict]:
    rows = []
    base = [r["test_accuracy"] for r in runs if r["name"] == "none"]
    base_mean = statistics.mean(base) if base else float("nan")
    for name in names:
        acc = [r["test_accuracy"] for r in runs if r["name"] == name]
        if not acc:
            continue
        wire = statistics.mean(r["wire_bytes_per_step"] for r in runs if r["name"] == name)
        mean = statistics.mean(acc)
        gap = 100 * (base_mean - mean)
        rows.append({
            "name": name, "seeds": len(acc), "mean": mean, "std": statistics.pstdev(acc), "min": min(acc),
            "max": max(acc), "gap_points": gap, "wire_bytes_per_step": wire,
            "target_points": TARGETS.get(name), "meets_target": None if name not in TARGETS else gap <= TARGETS[name],
        })
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Compressor accuracy: digits {meta['model']}, {meta['world']} ranks, {meta['epochs']} epochs, "
        f"seeds {meta['seeds']}",
        "",
        f"SGD lr {meta['lr']} momentum {meta['momentum']}, batch {meta['batch_size']} per rank. "
        "Gap: points below `none` (mean over seeds). Wire bytes: rank 0, per step, warm-up included.",
        "",
        "| compressor | mean acc | std | min | max | gap (pts) | target | wire bytes/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = "" if r["target_points"] is None else f"<= {r['target_points']} ({'met' if r['meets_target'] else 'NOT met'})"
        lines.append(f"| {r['name']} | {r['mean']:.4f} | {r['std']:.4f} | {r['min']:.4f} | {r['max']:.4f} | "
                     f"{r['gap_points']:+.2f} | {target} | {r['wire_bytes_per_step']:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--fresh", action="store_true", help="ignore runs already in the output file")
    args = ap.parse_args()

    meta = {k: getattr(args, k) for k in ("seeds", "epochs", "world", "model", "batch_size", "lr", "momentum")}
    runs: list[dict] = []
    if args.out.exists() and not args.fresh:
        old = json.loads(args.out.read_text())
        if old.get("meta") == meta:
            runs = old["runs"]
    done = {(r["name"], r["seed"]) for r in runs}
    for seed in args.seeds:  # seed-major: an interrupted run still has every name for the first seeds
        for name in args.names:
            if (name, seed) in done:
                continue
            run = run_one(name, seed, args)
            runs.append(run)
            print(f"{name:>18} seed {seed}: acc {run['test_accuracy']:.4f}  "
                  f"wire/step {run['wire_bytes_per_step']:,.0f} B  {run['seconds']:.0f} s", flush=True)
            rows = summarise(runs, args.names)
            write_results(args.out, rows, meta=meta, runs=runs)
            args.out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(summarise(runs, args.names), meta))


if __name__ == "__main__":
    main()
