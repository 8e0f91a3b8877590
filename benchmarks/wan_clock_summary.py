"""Summary of ``benchmarks/wan_clock.sh``: every part's rows in one table, and the WAN acceptance checked.

    python benchmarks/wan_clock_summary.py [benchmarks/results/wan_clock]

Reads each part's ``results.json`` (``wan_seed0/``, ``wan_seed1/``, ...); writes ``summary.json`` (through
``_results.write_results``) and ``table.md``: per part and strategy the time to target on the simulated
clock, how much sooner than sync, the bytes to the target and how many fewer, the final val loss against
sync's. The acceptance: on every 100 Mbit/s part, a ``diloco`` row reaches sync's target at least
``SOONER`` times sooner with at least ``FEWER`` times fewer bytes to it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

SOONER, FEWER = 5.0, 100.0
KEEP = ("strategy", "status", "step_ms", "metric_mean", "vs_baseline", "target", "time_to_target", "reached",
        "sooner", "bytes_to_target", "fewer_bytes_to_target", "peak_kib_per_step", "exposed_share")


def rows_of(out: Path) -> list[dict]:
    """Every part's rows (compute-only left out), each with its part, network and clock."""
    rows = []
    for path in sorted(out.glob("*/results.json")):
        raw = json.loads(path.read_text())
        clock = raw.get("clock", {})
        for row in raw.get("rows", []):
            if row["strategy"] == "compute-only":
                continue
            rows.append({"part": path.parent.name, "net": row["net"], "clock": clock.get("clock"),
                         "device": clock.get("device"), **{k: row.get(k) for k in KEEP}})
    return rows


def accepted(rows: list[dict]) -> dict[str, bool]:
    """Per 100 Mbit/s part: whether a plain diloco row met both bounds."""
    out: dict[str, bool] = {}
    for row in rows:
        if not row["part"].startswith("wan_"):
            continue
        ok = (row["strategy"].startswith("diloco:") and (row["sooner"] or 0) >= SOONER
              and (row["fewer_bytes_to_target"] or 0) >= FEWER)
        out[row["part"]] = out.get(row["part"], False) or ok
    return out


def _markdown(rows: list[dict]) -> str:
    lines = ["| part | strategy | final val loss (vs sync) | time to target (s, simulated) | sooner | "
             "MiB to target | fewer bytes | peak KiB/step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reached = r["time_to_target"] is not None
        lines.append(f"| {r['part']} | {r['strategy']} | {r['metric_mean']:.4f} ({r['vs_baseline']:+.1%}) | "
                     + (f"{r['time_to_target']:.2f} | {r['sooner']:.1f}x | {r['bytes_to_target'] / 2**20:.1f} | "
                        f"{r['fewer_bytes_to_target']:.0f}x" if reached else "not reached | | |")
                     + f" | {r['peak_kib_per_step']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/wan_clock")
    rows = rows_of(out)
    (out / "table.md").write_text(_markdown(rows))
    loads = {p.parent.name: p.read_text() for p in sorted(out.glob("*/load.txt"))}
    write_results(out / "summary.json", rows, command=f"bash benchmarks/wan_clock.sh (summary: python "
                  f"benchmarks/wan_clock_summary.py {out})", accepted=accepted(rows),
                  acceptance=f"diloco >= {SOONER:g}x sooner and >= {FEWER:g}x fewer bytes to sync's target",
                  load=loads)
    print((out / "table.md").read_text())
    print("accepted:", accepted(rows))


if __name__ == "__main__":
    main()
