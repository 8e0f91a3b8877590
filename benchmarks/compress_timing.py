"""Encode + decode time of every compressor on one large fp32 gradient, in one process, one run.

1. A 25 M-element fp32 tensor (100 MB, a ResNet-50-sized gradient), fixed seed.
2. Per compressor: one warm-up round trip, then the median of ``--repeats``
   (:func:`gradwire.compress.roundtrip`: compress + every round + decompress,
   no network). Compressors are measured interleaved, round by
   round, so that the machine's changing load hits all of them alike.
3. Ratio to ``fp16`` (the cheapest real compressor) from the same run.

Writes benchmarks/results/compress_timing.json and .md (``--device cuda``:
compress_timing_cuda.*; every round trip ends in ``torch.cuda.synchronize``,
so a time is the kernels' time, not their launch). Examples::

    python benchmarks/compress_timing.py --repeats 5 --threads 1
    python benchmarks/compress_timing.py --device cuda --repeats 20
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from _results import write_results

from gradwire.compress import get_compressor, roundtrip

OUT = Path(__file__).parent / "results" / "compress_timing.json"
NAMES = ["none", "fp16", "bf16", "int8", "qsgd", "terngrad", "onebit", "signum", "topk:0.01", "randomk:0.01",
         "powersgd:4"]
#: acceptance on CPU (a training rank's thread): largest ratio to fp16
TARGETS = {"onebit": 1.0, "topk:0.01": 2.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--numel", type=int, default=25_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: what a training rank uses)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--out", type=Path, default=None, help="default: results/compress_timing[_cuda].json")
    args = ap.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this machine has no CUDA device; use --device cpu")
    out = args.out or (OUT if args.device == "cpu" else OUT.with_name("compress_timing_cuda.json"))

    torch.set_num_threads(args.threads)
    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(0)).to(args.device)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    comps = {name: get_compressor(name) for name in args.names}
    times: dict[str, list[float]] = {name: [] for name in args.names}
    for name, comp in comps.items():
        roundtrip(comp, x)  # warm-up
    sync()
    for _ in range(args.repeats):
        for name, comp in comps.items():
            t0 = time.perf_counter()
            roundtrip(comp, x)
            sync()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    rows = []
    for name in args.names:
        ratio = med[name] / med["fp16"] if "fp16" in med else float("nan")
        target = None if x.is_cuda else TARGETS.get(name)
        rows.append({"name": name, "median_ms": 1e3 * med[name], "min_ms": 1e3 * min(times[name]),
                     "ratio_to_fp16": ratio, "target": target,
                     "meets_target": None if target is None else ratio <= target})
    where = f"{args.threads} thread(s)" if not x.is_cuda else torch.cuda.get_device_name(x.device)
    meta = {"numel": args.numel, "repeats": args.repeats, "threads": args.threads, "device": args.device,
            "device_name": where}
    lines = [f"# Encode + decode of {args.numel:,} fp32 elements ({where}, median of "
             f"{args.repeats}, interleaved)", "", "| compressor | median ms | min ms | / fp16 | target |",
             "|---|---|---|---|---|"]
    for r in rows:
        t = r["target"]
        target = "" if t is None else f"<= {t} ({'met' if r['meets_target'] else 'NOT met'})"
        lines.append(f"| {r['name']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {r['ratio_to_fp16']:.2f}x | {target} |")
    md = "\n".join(lines) + "\n"
    write_results(out, rows, meta=meta)
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
