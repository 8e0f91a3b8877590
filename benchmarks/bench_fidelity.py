"""`gradwire bench` on a simulated 1 GbE: measured busbw vs the link's payload rate, model(us) vs measured.

Runs the all_reduce sweep 16-64 MB on 2 ranks with the gradwire backend in
realtime mode (``--net 1gbe``: 1 Gbit/s, TCP framing, 50 us) and checks:

- busbw within +-5 % of the payload rate 1e9/8 * 1448/1514 B/s (about 0.1195 GB/s);
- the model(us) column within +-5 % of the measured time.

Writes benchmarks/results/bench_fidelity.json and exits 1 if a check fails.

    python benchmarks/bench_fidelity.py [--iters 5] [--world-size 2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _results import write_results

PAYLOAD_GBS = 1e9 / 8 * 1448 / 1514 / 1e9


def main() -> int:
    from gradwire.bench import BenchConfig, format_table, run
    from gradwire.bench.report import to_dict as to_dict_result

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()
    config = BenchConfig(ops=("all_reduce",), backend="gradwire", net="1gbe", world_size=args.world_size,
                         min_bytes=16 << 20, max_bytes=64 << 20, factor=2, iters=args.iters, warmup=1)
    result = run(config)
    sys.stdout.write(format_table(result))
    checks = []
    for r in result.rows:
        busbw_err = r.busbw / PAYLOAD_GBS - 1
        model_err = r.model_us / r.time_us - 1
        checks.append({"size": r.size, "placement": r.placement, "time_us": r.time_us, "model_us": r.model_us,
                       "busbw_gbs": r.busbw, "busbw_error_pct": 100 * busbw_err, "model_error_pct": 100 * model_err,
                       "ok": abs(busbw_err) <= 0.05 and abs(model_err) <= 0.05 and r.wrong == 0})
        print(f"{r.size:>10} B {r.placement:>12}: busbw {r.busbw:.4f} GB/s ({100 * busbw_err:+.2f}% of "
              f"{PAYLOAD_GBS:.4f}), model {r.model_us / 1e3:.1f} ms vs measured {r.time_us / 1e3:.1f} ms "
              f"({100 * model_err:+.2f}%)")
    ok = all(c["ok"] for c in checks)
    out = Path(__file__).parent / "results" / "bench_fidelity.json"
    write_results(out, checks, indent=2,
                  bench_command="gradwire bench --backend gradwire --net 1gbe -b 16M -e 64M -f 2 "
                                f"-n {args.iters} -w 1 --world-size {args.world_size}",
                  payload_gbs=PAYLOAD_GBS, all_within_5pct=ok, bench=to_dict_result(result))
    print(f"{'PASS' if ok else 'FAIL'}: busbw and model within 5 %; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
