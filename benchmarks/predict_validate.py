"""`gradwire predict` against measured realtime runs at N = 2 and 4.

For each world size and strategy: a short run on ``loopback`` gives the step
profile; the model predicts the step time on the network; a realtime run on
that network measures it. Four ranks share two cores here, so one short run
moves by 10-20% from one try to the next as the machine's speed drifts: every
pair (profile run, measured run) is repeated ``--repeats`` times, the pairs of
one world size run back to back in one set of processes (a fresh process group
per run, :func:`gradwire.train.loop.run_in_turns`). A pair's error is its
prediction over its own measurement; the figure is the median of the pairs'
errors (pairing is what cancels the drift: the median prediction and the median
measurement can come from different tries, also reported, as
``error_of_medians_pct``).
Writes benchmarks/results/predict_validate.json.

    python benchmarks/predict_validate.py [--net SPEC] [--steps 120] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from gradwire.compare.config import DEFAULT_NET


def main() -> None:
    from gradwire.predict import pooled_median, predict, profile_from_result
    from gradwire.train.loop import TrainConfig, run_in_turns

    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default=DEFAULT_NET)
    ap.add_argument("--model", default="cnn-wide")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--strategies", default="sync,onebit,delayed,onebit+delayed")
    args = ap.parse_args()
    strategies = args.strategies.split(",")
    tries: dict[tuple[int, str], dict[str, list]] = {}
    for world in (2, 4):
        configs = []
        for _ in range(args.repeats):
            for s in strategies:  # the profile run, then at once the run it predicts
                configs += [TrainConfig(strategy=s, net=net, model=args.model, epochs=1000, max_steps=args.steps)
                            for net in ("loopback", args.net)]
        results = run_in_turns(configs, world)
        for i in range(0, len(configs), 2):
            strategy, attempt = configs[i].strategy, i // (2 * len(strategies))
            prof = profile_from_result(strategy, results[i], world)
            pred = predict(prof, args.net, world)
            measured = pooled_median(results[i + 1], "step_seconds")
            t = tries.setdefault((world, strategy), {"predicted": [], "measured": [], "profiles": []})
            t["predicted"].append(pred.step_seconds)
            t["measured"].append(measured)
            t["profiles"].append(prof.as_dict())
            print(f"try {attempt + 1}: n={world} {strategy:16s} predicted {pred.step_seconds * 1e3:7.1f} ms"
                  f"  measured {measured * 1e3:7.1f} ms", flush=True)
    rows = []
    for (world, strategy), t in tries.items():
        predicted, measured = statistics.median(t["predicted"]), statistics.median(t["measured"])
        pairs = [p / m - 1 for p, m in zip(t["predicted"], t["measured"])]
        err = statistics.median(pairs)
        rows.append({"world": world, "strategy": strategy, "predicted_ms": predicted * 1e3,
                     "measured_ms": measured * 1e3, "error_pct": err * 100, "within_10pct": abs(err) <= 0.10,
                     "tries_error_pct": [e * 100 for e in pairs], "error_of_medians_pct": (predicted / measured - 1) * 100,
                     "tries_predicted_ms": [v * 1e3 for v in t["predicted"]],
                     "tries_measured_ms": [v * 1e3 for v in t["measured"]], "profiles": t["profiles"]})
        print(f"n={world} {strategy:16s} predicted {predicted * 1e3:7.1f} ms  measured {measured * 1e3:7.1f} ms"
              f"  error {err * 100:+6.1f}%  (median of {len(pairs)} pairs' errors)")
    out = Path(__file__).parent / "results" / "predict_validate.json"
    out.write_text(json.dumps({"net": args.net, "model": args.model, "steps": args.steps, "repeats": args.repeats,
                               "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
