"""The verdict of benchmarks/clip_acceptance.sh: each script's comparison against issue 43's acceptance.

Reads ``OUT/<script>/results.json`` (``gradwire compare``'s) for each script named, writes
``benchmarks/results/<OUT's name>.json`` and ``.md``: per strategy its status (or the reason it was
refused), the final loss of each seed against sync's of the same seed, the bytes reduction, and the checks.
``ONE_BIT=NAME`` names the 1-bit-class exchange the checks judge (default ``onebit``; ``NAME+delayed`` too);
a strategy the run did not include is listed as not run, not failed.

    python benchmarks/clip_acceptance.py benchmarks/results/clip_acceptance hf_trainer gpt
    ONE_BIT=onebit:allgather:block=64 python benchmarks/clip_acceptance.py \
        benchmarks/results/clip_acceptance_onebit64 hf_trainer gpt
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gradwire.compare.config import DEFAULT_STRATEGIES
from gradwire.compare.script import DEFAULT_SCRIPT_STRATEGIES

#: what must run ok within LOSS_SHARE of sync on every seed; the 1-bit-class one must move MIN_REDUCTION x fewer bytes
ONE_BIT = os.environ.get("ONE_BIT", "onebit")
MUST_RUN = ("int8", ONE_BIT, "delayed", f"{ONE_BIT}+delayed", "auto")
LOSS_SHARE = 0.02
MIN_REDUCTION = 16.0


def final_losses(results: dict[str, Any], metric: str) -> dict[str, dict[int, float]]:
    """strategy -> seed -> the script's last reported ``metric``."""
    out: dict[str, dict[int, float]] = {}
    for run in results["runs"]:
        for seed in run.get("seeds") or []:
            value = (seed.get("metrics") or {}).get(metric)
            if value is not None:
                out.setdefault(run["strategy"], {})[int(seed["seed"])] = float(value)
    return out


def wire_bytes(results: dict[str, Any]) -> dict[str, float]:
    """strategy -> bytes on the wire over its seeds (also for a run compare calls unsound)."""
    out: dict[str, float] = {}
    for run in results["runs"]:
        for seed in run.get("seeds") or []:
            if seed.get("wire_bytes"):
                out[run["strategy"]] = out.get(run["strategy"], 0.0) + float(seed["wire_bytes"])
    return out


def verdict(name: str, results: dict[str, Any]) -> dict[str, Any]:
    metric = results["config"]["metric"]
    rows = {r["strategy"]: r for r in results["rows"]}
    losses = final_losses(results, metric)
    sync = losses.get("sync", {})
    wire = wire_bytes(results)
    strategies = []
    for strategy, row in rows.items():
        if strategy == "compute-only":
            continue
        mine = losses.get(strategy, {})
        share = {s: mine[s] / sync[s] - 1.0 for s in mine if s in sync}
        strategies.append({"strategy": strategy, "status": row["status"], "reason": " ".join(row["error"].split()),
                           "applied": row.get("applied"),
                           "reduction": wire["sync"] / wire[strategy] if strategy in wire and "sync" in wire else None,
                           "final": mine, "vs_sync": share})
    by = {s["strategy"]: s for s in strategies}
    checks: dict[str, bool | None] = {}  # None: the run did not include that strategy
    for strategy in MUST_RUN:
        s = by.get(strategy)
        checks[f"{strategy} ok within {LOSS_SHARE:.0%} of sync on every seed"] = None if s is None else bool(
            s["status"] == "ok" and len(s["vs_sync"]) == len(sync) > 0
            and all(abs(v) <= LOSS_SHARE for v in s["vs_sync"].values()))
    one = by.get(ONE_BIT)
    checks[f"{ONE_BIT} at least {MIN_REDUCTION:g}x fewer bytes than sync"] = None if one is None else bool(
        (one["reduction"] or 0) >= MIN_REDUCTION)
    defaults = set(DEFAULT_STRATEGIES) | set(DEFAULT_SCRIPT_STRATEGIES)
    refused = [s["strategy"] for s in strategies if s["strategy"] in defaults and s["status"] == "refused"]
    checks["at most one default strategy refused"] = len(refused) <= 1
    return {"script": name, "metric": metric, "cmd": results["config"]["cmd"], "nets": results["config"]["nets"],
            "seeds": results["config"]["seeds"], "strategies": strategies, "refused_defaults": refused,
            "checks": checks, "passed": all(v is not False for v in checks.values())}


def markdown(verdicts: list[dict[str, Any]]) -> str:
    lines = ["| script | strategy | status | final loss per seed | vs sync per seed | bytes reduction | note |",
             "|---|---|---|---|---|---|---|"]
    for v in verdicts:
        for s in v["strategies"]:
            finals = ", ".join(f"{x:.4f}" for _, x in sorted(s["final"].items()))
            vs = ", ".join(f"{x:+.2%}" for _, x in sorted(s["vs_sync"].items()))
            red = f"{s['reduction']:.1f}x" if s["reduction"] else ""
            note = s["reason"][:200] if s["status"] != "ok" else (s["applied"] or "")[:200]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in
                                           [v["script"], s["strategy"], s["status"], finals, vs, red, note]) + " |")
    lines.append("")
    for v in verdicts:
        for check, ok in v["checks"].items():
            lines.append(f"- {v['script']}: {check}: {'not run' if ok is None else 'yes' if ok else 'NO'}")
    return "\n".join(lines) + "\n"


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    verdicts = [verdict(n, json.loads((out / n / "results.json").read_text()))
                for n in names if (out / n / "results.json").exists()]
    results = Path(__file__).parent / "results"
    (results / f"{out.name}.json").write_text(json.dumps({"host": "2-core AMD EPYC, torch 2.13.0 CPU",
                                                              "clock": "sim (cpu-core)", "verdicts": verdicts},
                                                             indent=1) + "\n")
    text = markdown(verdicts)
    (results / f"{out.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
