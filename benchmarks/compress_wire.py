"""Bytes on the wire per training step for every compressor, from the gradwire backend's counters.

The digits MLP (4.3 M parameters, 17 MB of fp32 gradient per step: buckets
large enough that per-message overheads do not dominate), 4 ranks, DDP with
the compression hook (``sync`` strategy):

1. Train ``1 + --steps`` steps and, separately, 1 step; the difference of
   rank 0's ``gradwire.stats()`` totals over ``--steps`` is the steady state
   (the first step is the hook's uncompressed warm-up, and DDP's bucket
   rebuild).
2. ``wire_bytes`` counts what a NIC would see (payload under the modelled
   algorithm plus framing), ``sent_bytes`` the payload bytes sent.
3. Ratio: ``none`` (fp32 ring all_reduce) over the compressor, per step.

Writes benchmarks/results/compress_wire.json and .md. Example::

    python benchmarks/compress_wire.py --steps 4
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _results import write_results

from gradwire.train import TrainConfig, build_model, num_parameters, run_training

OUT = Path(__file__).parent / "results" / "compress_wire.json"
NAMES = ["none", "fp16", "bf16", "int8", "int8:allgather", "qsgd", "terngrad", "onebit", "onebit:allgather",
         "signum", "topk:0.01", "randomk:0.01", "powersgd:4"]
#: acceptance: smallest ratio to ``none``
TARGETS = {"onebit": 28.0, "topk:0.01": 20.0, "int8": 3.9, "fp16": 2.0}


def totals(name: str, steps: int, args: argparse.Namespace) -> dict[str, float]:
    cfg = TrainConfig(strategy=name, net="loopback", model=args.model, seed=0, epochs=1, max_steps=steps)
    stats = run_training(cfg, args.world)[0].stats
    per_op = {op: s["wire_bytes"] for op, s in stats.items() if op != "total"}
    return {"wire_bytes": stats["total"]["wire_bytes"], "sent_bytes": stats["total"]["sent_bytes"],
            "calls": stats["total"]["calls"], "per_op": per_op}


def measure(name: str, args: argparse.Namespace) -> dict:
    first, more = totals(name, 1, args), totals(name, 1 + args.steps, args)
    per_op = {op: (more["per_op"][op] - first["per_op"].get(op, 0)) / args.steps for op in more["per_op"]}
    return {
        "name": name,
        "wire_bytes_per_step": (more["wire_bytes"] - first["wire_bytes"]) / args.steps,
        "sent_bytes_per_step": (more["sent_bytes"] - first["sent_bytes"]) / args.steps,
        "calls_per_step": (more["calls"] - first["calls"]) / args.steps,
        "wire_bytes_per_step_by_op": {op: b for op, b in per_op.items() if b},
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Wire bytes per step: digits {meta['model']} ({meta['parameters']:,} parameters), {meta['world']} ranks",
        "",
        f"Steady state over {meta['steps']} steps (rank 0, `gradwire.stats()`); ratio = `none` / compressor.",
        "",
        "| compressor | wire bytes/step | sent bytes/step | collectives/step | ratio | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["target"]
        target = "" if t is None else f">= {t} ({'met' if r['meets_target'] else 'NOT met'})"
        lines.append(f"| {r['name']} | {r['wire_bytes_per_step']:,.0f} | {r['sent_bytes_per_step']:,.0f} | "
                     f"{r['calls_per_step']:.0f} | {r['ratio']:.2f}x | {target} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    names = ["none"] + [n for n in args.names if n != "none"]
    rows = []
    for name in names:
        row = measure(name, args)
        base = rows[0]["wire_bytes_per_step"] if rows else row["wire_bytes_per_step"]
        row["ratio"] = base / row["wire_bytes_per_step"]
        row["target"] = TARGETS.get(name)
        # 2 decimals: fp16 is 2x up to DDP's few bytes of integer buffers
        row["meets_target"] = None if name not in TARGETS else round(row["ratio"], 2) >= TARGETS[name]
        rows.append(row)
        print(f"{name:>18}: {row['wire_bytes_per_step']:>14,.0f} B/step  {row['ratio']:7.2f}x", flush=True)
    meta = {"model": args.model, "parameters": num_parameters(build_model(args.model)), "world": args.world,
            "steps": args.steps}
    write_results(args.out, rows, meta=meta)
    args.out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
