"""Exposed communication and accuracy of the overlap strategies on the digits CNN.

1. Calibrate: train one epoch with ``sync`` on loopback and take the median
   compute time of a step; pick the bandwidth (latency fixed) at which the
   model prices the gradient all_reduce at ``--ratio`` times that compute, so
   communication takes about as long as compute. Repeat once on that network
   (compute there includes the backend's threads). Compute time on a shared
   machine drifts, so every run also records the ratio it actually had
   (``comm_to_compute``: modelled communication / compute).
2. Train every strategy for every seed on that network; record per run the
   totals of compute, modelled communication and exposed communication, the
   collectives issued, and the test accuracy. Exposed communication is split
   (:func:`gradwire.strategies.split_exposed`): ``exposed_network`` is the time the
   training thread waited while the modelled network still carried an awaited
   collective; ``exposed_other`` the rest of its waiting (the other rank late
   to the collective under CPU contention, compression callbacks).
   ``exposed_network_fraction`` = exposed_network / modelled communication is
   the figure of merit: the share of the communication that was not hidden.

Writes benchmarks/results/overlap_strategies.json. Example::

    python benchmarks/overlap_strategies.py --seeds 0 1 2 --epochs 10
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _results import write_results

from gradwire.net import NetworkModel
from gradwire.train import TrainConfig, build_model, num_parameters, run_training

OUT = Path(__file__).parent / "results" / "overlap_strategies.json"


def calibrate(args: argparse.Namespace) -> tuple[str, float, float]:
    """(network spec, median compute per step, modelled all_reduce seconds on it)."""
    spec = "loopback"
    for _ in range(2):
        probe = run_training(TrainConfig(strategy="sync", net=spec, model=args.model, epochs=1, seed=99, lr=args.lr,
                                         batch_size=args.batch_size), args.world)
        compute = statistics.median(c for r in probe for c in r.step_compute)
        spec, comm = _network_for(args, args.ratio * compute)
    return spec, compute, comm


def _network_for(args: argparse.Namespace, target: float) -> tuple[str, float]:
    """The spec whose modelled gradient all_reduce takes ``target`` seconds, and that time."""
    nbytes = 4 * num_parameters(build_model(args.model))
    lo, hi = 1e6, 1e11  # bits/s
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        spec = f"bandwidth={mid:.0f}bit,latency={args.latency}"
        if NetworkModel(spec, args.world).cost("all_reduce", nbytes).seconds > target:
            lo = mid
        else:
            hi = mid
    spec = f"bandwidth={hi / 1e6:.1f}mbit,latency={args.latency}"
    return spec, NetworkModel(spec, args.world).cost("all_reduce", nbytes).seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategies", nargs="+",
                    default=["sync", "delayed", "localsgd:4", "async-average:4", "onebit", "onebit+delayed"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--latency", default="100us")
    ap.add_argument("--ratio", type=float, default=1.0, help="modelled all_reduce / compute per step")
    ap.add_argument("--net", default=None, help="skip calibration and use this network spec")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    if args.net:
        spec, compute, comm = args.net, float("nan"), float("nan")
    else:
        spec, compute, comm = calibrate(args)
    print(f"network: {spec}  (probe compute/step {compute * 1e3:.2f} ms, modelled all_reduce {comm * 1e3:.2f} ms)")
    runs = []
    for name in args.strategies:
        for seed in args.seeds:
            t0 = time.perf_counter()
            cfg = TrainConfig(strategy=name, net=spec, model=args.model, seed=seed, epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr)
            results = run_training(cfg, args.world)
            sums = [r.summary() for r in results]
            row = {
                "strategy": name, "seed": seed,
                "test_accuracy": results[0].test_accuracy,
                "ranks_agree": len({r.param_checksum for r in results}) == 1,
                "steps": sums[0]["steps"],
                "compute_s": statistics.mean(s["compute"] for s in sums),
                "comm_model_s": statistics.mean(s["comm_model"] for s in sums),
                "exposed_s": statistics.mean(s["exposed"] for s in sums),
                "exposed_fraction": statistics.mean(s["exposed_fraction"] for s in sums),
                "comm_to_compute": statistics.mean(s["comm_model"] / s["compute"] for s in sums),
                "exposed_network_s": statistics.mean(s["exposed_network"] for s in sums),
                "exposed_other_s": statistics.mean(s["exposed_other"] for s in sums),
                "exposed_network_fraction": statistics.mean(s["exposed_network_fraction"] for s in sums),
                "collectives_in_steps": sums[0]["collectives"],
                "all_reduce_calls": results[0].stats.get("all_reduce", {}).get("calls", 0),
                "wire_bytes": results[0].stats["total"]["wire_bytes"],
                "epoch_seconds": statistics.mean(statistics.mean(r.epoch_seconds) for r in results),
                "finish_s": results[0].finish_seconds,
            }
            runs.append(row)
            print(f"{name:>16} seed {seed}: acc {row['test_accuracy']:.4f}  compute {row['compute_s']:.3f} s  "
                  f"comm(model) {row['comm_model_s']:.3f} s (x{row['comm_to_compute']:.2f})  exposed {row['exposed_s']:.3f} s: network "
                  f"{row['exposed_network_s']:.3f} s ({100 * row['exposed_network_fraction']:.1f}%), "
                  f"other {row['exposed_other_s']:.3f} s  collectives {row['collectives_in_steps']}  "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
    summary = {}
    for name in args.strategies:
        rows = [r for r in runs if r["strategy"] == name]
        summary[name] = {
            "mean_accuracy": statistics.mean(r["test_accuracy"] for r in rows),
            "mean_exposed_network_fraction": statistics.mean(r["exposed_network_fraction"] for r in rows),
            "max_exposed_network_fraction": max(r["exposed_network_fraction"] for r in rows),
            "mean_exposed_fraction": statistics.mean(r["exposed_fraction"] for r in rows),
            "mean_comm_to_compute": statistics.mean(r["comm_to_compute"] for r in rows),
            "min_accuracy": min(r["test_accuracy"] for r in rows),
            "mean_collectives_in_steps": statistics.mean(r["collectives_in_steps"] for r in rows),
            "mean_epoch_seconds": statistics.mean(r["epoch_seconds"] for r in rows),
        }
    base = summary.get("sync")
    for name, s in summary.items():
        if base:
            s["accuracy_minus_sync_points"] = 100 * (s["mean_accuracy"] - base["mean_accuracy"])
            s["collective_reduction_vs_sync"] = base["mean_collectives_in_steps"] / s["mean_collectives_in_steps"]
        print(f"{name:>16}: " + "  ".join(f"{k} {v:.4g}" for k, v in s.items()))
    write_results(args.out, runs, indent=2,
                  config={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                  network=spec, probe_compute_per_step_s=compute, modelled_all_reduce_s=comm, summary=summary)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
