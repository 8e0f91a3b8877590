"""`gradwire bench --fit` recovers the alpha and beta of simulated networks whose values are known.

Each case sweeps all_reduce on 2 ranks over a virtual-clock network (nothing
waits, the simulated clock carries the time), fits alpha and beta, and compares
them with the spec. Writes benchmarks/results/bench_fit.json; exits 1 if a
fitted value is more than 5 % off.

    python benchmarks/bench_fit.py [--iters 5]

Pick latencies above gloo's own per-call time on this machine (~1-2 ms on a
busy 2-core loopback): the backend completes an op at max(model, real), so a
smaller modelled latency would measure the host, not the model.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _results import write_results

CASES = [
    # (spec, true alpha s, true line rate bit/s, -b, -e, extra ops)
    ("bandwidth=1gbit,latency=2ms,protocol=none,algorithm=ring", 2e-3, 1e9, 4 << 10, 16 << 20, ()),
    ("bandwidth=100mbit,latency=10ms,protocol=none", 10e-3, 100e6, 4 << 10, 4 << 20, ()),
    ("bandwidth=1gbit,latency=5ms,protocol=tcp", 5e-3, 1e9, 4 << 10, 16 << 20, ("all_gather", "broadcast")),
]


def main() -> int:
    from gradwire.bench import BenchConfig, fit_result, format_table, run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    out_rows, ok = [], True
    for spec, alpha, rate, lo, hi, extra in CASES:
        config = BenchConfig(ops=("all_reduce", *extra), backend="gradwire", net=f"{spec},clock=virtual",
                             min_bytes=lo, max_bytes=hi, factor=4, iters=args.iters, warmup=1, check=False)
        result = run(config)
        fit = fit_result(result)
        sys.stdout.write(format_table(result) + fit.format())
        a_err = fit.overall.alpha / alpha - 1
        b_err = fit.bandwidth / rate - 1
        good = abs(a_err) <= 0.05 and abs(b_err) <= 0.05
        ok &= good
        print(f"{spec}: alpha {fit.overall.alpha * 1e3:.3f} ms ({100 * a_err:+.2f}%), "
              f"bandwidth {fit.bandwidth / 1e9:.4f} Gbit/s ({100 * b_err:+.2f}%) -> {'OK' if good else 'OFF'}\n")
        out_rows.append({"spec": spec, "ops": list(config.ops), "true_alpha_s": alpha, "true_bandwidth_bits": rate,
                         "fit": fit.to_dict(), "alpha_error_pct": 100 * a_err, "bandwidth_error_pct": 100 * b_err,
                         "within_5pct": good,
                         "command": f"gradwire bench --backend gradwire --net {spec},clock=virtual "
                                    f"{' '.join('--op ' + o for o in config.ops)} -b {lo} -e {hi} -f 4 "
                                    f"-n {args.iters} -w 1 -c 0 --fit"})
    out = Path(__file__).parent / "results" / "bench_fit.json"
    write_results(out, out_rows, indent=2)
    print(f"{'PASS' if ok else 'FAIL'}: wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
