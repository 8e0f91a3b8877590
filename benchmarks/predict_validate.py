"""`gradwire predict` against measured realtime runs at N = 2 and 4, bucket by bucket.

Two suites, one command:

- ``buckets``: ``mlp-deep`` (ten 1 MB layers) with ``bucket_cap_mb=1`` (9
  DDP buckets that backward produces one after another), batch 64, on two
  networks, strategies sync / fp16 / onebit / delayed;
- ``digits``: the figures the README quoted before the bucket model
  (``cnn-wide``, the strategies' own bucket sizes, the compare default
  network, sync / onebit / delayed / onebit+delayed), which must still hold.

For each world size and each of ``--repeats`` tries, one set of ranks runs,
strategy after strategy, a short loopback run recorded step by step as
``gradwire profile`` records a job (its profile), then at once the realtime
runs on the networks it predicts (:func:`gradwire.predict.measure.measure_runs`:
a fresh process group per run). A try whose ranks fail is run again whole. A pair's error is the prediction from its own
profile over its own measurement (the median step over every rank's steps
after the first three); the figure is the median of the pairs' errors:
pairing is what cancels the drift of a shared machine (see the README).
Also reported: the prediction from the profile as recorded, before
:func:`gradwire.predict.calibrated` fits it to its own run (a stretch of
backward when each rank had a core; at 4 ranks on 2 cores, its CPU times
halved, the run itself staying the floor of its strategy at its world size:
``predict`` applies that floor in both columns), and the step with every
bucket sent after backward (the old model's upper bound), to show what each
part changes.

Writes benchmarks/results/predict_validate.json, with the load average
before and after (``os.getloadavg``); the measured runs themselves are kept
in ``--raw`` (a pickle in the temp folder), which ``--rescore`` scores again
without running anything.

    python benchmarks/predict_validate.py [--steps 60] [--repeats 3] [--suites buckets,digits]
"""
from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from _results import write_results

#: the network the committed validation ran on
DEFAULT_NET = "bandwidth=1.5gbit,latency=100us"

SUITES = {
    "buckets": {"model": "mlp-deep", "bucket_cap_mb": 1.0, "batch_size": 64,
                "nets": [DEFAULT_NET, "bandwidth=500mbit,latency=200us"],
                "strategies": ["sync", "fp16", "onebit", "delayed"]},
    "digits": {"model": "cnn-wide", "bucket_cap_mb": None, "batch_size": 32, "nets": [DEFAULT_NET],
               "strategies": ["sync", "onebit", "delayed", "onebit+delayed"]},
}


def _upper_bound(prof, strategy, net, world, cost):
    """The step with every bucket ready at the end of backward (what the model assumed before buckets)."""
    from gradwire.predict import Bucket, predict

    late = replace(prof, buckets=tuple(Bucket(b.nbytes, prof.backward, b.element_size) for b in prof.buckets))
    return predict(late, strategy, net, world, cost).step_seconds


def _runs(configs: list, world: int, attempts: int = 3) -> list:
    """``measure_runs``, again when a rank fails (a whole try is repeated: its pairs stay back to back)."""
    from gradwire.launch import RankError
    from gradwire.predict.measure import measure_runs

    for attempt in range(attempts):
        try:
            return measure_runs(configs, world)
        except RankError as exc:
            last = str(exc).strip().splitlines()[-1]
            print(f"  a rank failed ({last}); running the try again ({attempt + 1} of {attempts})", flush=True)
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def measure_suite(name: str, suite: dict, worlds: list[int], steps: int, repeats: int) -> list[dict]:
    """Every try's runs: ``[{"world", "configs", "results"}]`` (results[i][rank] of configs[i])."""
    from gradwire.predict.measure import MeasureConfig

    raw = []
    for world in worlds:
        configs: list[MeasureConfig] = []
        results: list = []
        for attempt in range(repeats):
            tried: list[MeasureConfig] = []
            for s in suite["strategies"]:  # the profile run, then at once the runs it predicts
                base = MeasureConfig(s, "loopback", suite["model"], steps, suite["batch_size"], suite["bucket_cap_mb"])
                tried += [base] + [replace(base, net=net) for net in suite["nets"]]
            start = time.time()
            results += _runs(tried, world)
            configs += tried
            print(f"{name}: try {attempt + 1}, {len(tried)} runs at n={world} in {time.time() - start:.0f} s",
                  flush=True)
        raw.append({"world": world, "configs": configs, "results": results})
    return raw


def score_suite(name: str, suite: dict, raw: list[dict]) -> list[dict]:
    """Predict every measured run from the profile run before it; the rows of the results file."""
    from gradwire.predict import calibrated, predict
    from gradwire.predict.measure import profile_of
    from gradwire.predict.plans import exchange_cost

    rows = []
    for batch in raw:
        world, configs, results = batch["world"], batch["configs"], batch["results"]
        tries: dict[tuple[str, str], dict[str, list]] = {}
        per_pair = 1 + len(suite["nets"])
        for i in range(0, len(configs), per_pair):
            prof_config = configs[i]
            s = prof_config.strategy
            cost = exchange_cost(s)
            raw_prof = profile_of(prof_config, results[i])
            prof = calibrated(raw_prof, cost)
            for j, net in enumerate(suite["nets"], 1):
                measured = statistics.median(v for r in results[i + j] for v in r["step_seconds"][3:])
                pred = predict(prof, s, net, world, cost)
                t = tries.setdefault((net, s), {"predicted": [], "measured": [], "upper": [], "profiles": [],
                                                "uncalibrated": []})
                t["predicted"].append(pred.step_seconds)
                t["uncalibrated"].append(predict(raw_prof, s, net, world, cost).step_seconds)
                t["measured"].append(measured)
                t["upper"].append(_upper_bound(prof, s, net, world, cost))
                t["profiles"].append(prof.as_dict())
                print(f"  n={world} {s:16s} {net:32s} predicted {pred.step_seconds * 1e3:7.1f} ms  measured "
                      f"{measured * 1e3:7.1f} ms  ({pred.step_seconds / measured - 1:+.1%})", flush=True)
        for (net, s), t in tries.items():
            errors = [p / m - 1 for p, m in zip(t["predicted"], t["measured"])]
            upper = [u / m - 1 for u, m in zip(t["upper"], t["measured"])]
            plain = [u / m - 1 for u, m in zip(t["uncalibrated"], t["measured"])]
            err = statistics.median(errors)
            row = {"suite": name, "world": world, "net": net, "strategy": s, "model": suite["model"],
                   "bucket_cap_mb": suite["bucket_cap_mb"], "batch_size": suite["batch_size"],
                   "buckets": len(t["profiles"][0]["buckets"]),
                   "measured_exchanges": t["profiles"][0]["exchanges"] is not None,
                   "shared": t["profiles"][0]["shared"],
                   "predicted_ms": statistics.median(t["predicted"]) * 1e3,
                   "measured_ms": statistics.median(t["measured"]) * 1e3,
                   "error_pct": err * 100, "within_10pct": abs(err) <= 0.10,
                   "tries_error_pct": [e * 100 for e in errors],
                   "upper_bound_error_pct": statistics.median(upper) * 100,
                   "uncalibrated_error_pct": statistics.median(plain) * 100,
                   "tries_predicted_ms": [v * 1e3 for v in t["predicted"]],
                   "tries_measured_ms": [v * 1e3 for v in t["measured"]], "profiles": t["profiles"]}
            rows.append(row)
            print(f"{name} n={world} {s:16s} {net:32s} predicted {row['predicted_ms']:7.1f} measured "
                  f"{row['measured_ms']:7.1f}  error {row['error_pct']:+6.1f}% (uncalibrated "
                  f"{row['uncalibrated_error_pct']:+6.1f}%, all after backward: {row['upper_bound_error_pct']:+6.1f}%)",
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--suites", default="buckets,digits")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "predict_validate.json"))
    ap.add_argument("--raw", default=str(Path(tempfile.gettempdir()) / "gradwire_predict_validate_raw.pkl"),
                    help="where the measured runs are kept (pickle), to score them again with --rescore")
    ap.add_argument("--rescore", action="store_true",
                    help="score the runs kept in --raw again (the model changed) instead of measuring")
    args = ap.parse_args()
    names = args.suites.split(",")
    if args.rescore:
        kept = pickle.loads(Path(args.raw).read_bytes())
        meta, raws = kept["meta"], kept["raw"]
    else:
        meta = {"load_before": os.getloadavg(), "started": time.time(), "steps": args.steps, "repeats": args.repeats,
                "command": "python benchmarks/predict_validate.py " + " ".join(
                    f"--{k} {getattr(args, k)}" for k in ("steps", "repeats", "suites", "worlds"))}
        raws = {}
        for name in names:
            raws[name] = measure_suite(name, SUITES[name], [int(w) for w in args.worlds.split(",")], args.steps,
                                       args.repeats)
            Path(args.raw).write_bytes(pickle.dumps({"meta": meta, "raw": raws}))  # a crash keeps what ran
        meta.update(load_after=os.getloadavg(), minutes=(time.time() - meta["started"]) / 60)
        Path(args.raw).write_bytes(pickle.dumps({"meta": meta, "raw": raws}))
    rows = []
    for name in raws:
        rows += score_suite(name, SUITES[name], raws[name])
    out = Path(args.out)
    # a rescore's own command is --rescore: the one that measured the runs goes beside it
    measured = {"measured_command": meta["command"]} if args.rescore else {}
    write_results(out, rows, **measured, steps=meta["steps"], repeats=meta["repeats"],
                  suites={n: SUITES[n] for n in raws}, load_before=meta["load_before"],
                  load_after=meta.get("load_after"), minutes=meta.get("minutes"), rescored=args.rescore)
    bad = [r for r in rows if not r["within_10pct"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} within 10%; load {meta['load_before'][0]:.1f} before, "
          f"{(meta.get('load_after') or (0,))[0]:.1f} after; wrote {out}")


if __name__ == "__main__":
    main()
