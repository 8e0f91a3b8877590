"""`gradwire predict` against measured realtime runs at N = 2 and 4.

For each world size and strategy: a short run on ``loopback`` gives the step
profile; the model predicts the step time on the network; a realtime run on
that network measures it. Writes benchmarks/results/predict_validate.json.

    python benchmarks/predict_validate.py [--net SPEC] [--steps 40]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from gradwire.compare.config import DEFAULT_NET


def main() -> None:
    from gradwire.predict import measure_profiles, predict
    from gradwire.train.loop import TrainConfig, run_training

    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default=DEFAULT_NET)
    ap.add_argument("--model", default="cnn-wide")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--strategies", default="sync,onebit,delayed,onebit+delayed")
    args = ap.parse_args()
    strategies = args.strategies.split(",")
    rows = []
    for world in (2, 4):
        profiles = measure_profiles(strategies, args.model, world, args.steps)
        for prof in profiles:
            pred = predict(prof, args.net, world)
            cfg = TrainConfig(strategy=prof.strategy, net=args.net, model=args.model, epochs=1000, max_steps=args.steps)
            measured = statistics.median(run_training(cfg, world)[0].step_seconds[3:])
            err = pred.step_seconds / measured - 1
            rows.append({"world": world, "strategy": prof.strategy, "predicted_ms": pred.step_seconds * 1e3,
                         "measured_ms": measured * 1e3, "error_pct": err * 100, "within_10pct": abs(err) <= 0.10,
                         "profile": prof.as_dict()})
            print(f"n={world} {prof.strategy:16s} predicted {pred.step_seconds * 1e3:7.1f} ms  "
                  f"measured {measured * 1e3:7.1f} ms  error {err * 100:+6.1f}%")
    out = Path(__file__).parent / "results" / "predict_validate.json"
    out.write_text(json.dumps({"net": args.net, "model": args.model, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
