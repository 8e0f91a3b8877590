"""A peer that dies or stalls mid-training: do the survivors raise, and how soon?

For every strategy, 2 and 4 ranks, and three faults of the last rank at step 3
(``exit``: ``os._exit(1)``; ``kill``: SIGKILL; ``stall``: alive, never
answering), on plain gloo and on gradwire (``loopback``), with a 4 s group
timeout: every survivor must raise a Python exception within the timeout
plus 5 s. Outcomes: ``raised`` (with the seconds from the fault), ``hang``,
``crash`` (a signal), ``continued`` (trained on as if nothing happened).

    python benchmarks/dead_peer_matrix.py [--backends gloo gradwire] [--worlds 2 4]

Writes ``benchmarks/results/dead_peer_matrix.json`` (about 20 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import write_results  # noqa: E402

from tests.faults import GROUP_TIMEOUT, run_fault  # noqa: E402
from tests.strategies.test_faults import STRATEGIES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["gloo", "gradwire"], choices=["gloo", "gradwire"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--faults", nargs="+", default=["exit", "kill", "stall"], choices=["exit", "kill", "stall"])
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES)
    parser.add_argument("--out", default="benchmarks/results/dead_peer_matrix.json")
    args = parser.parse_args()
    cases = []
    for backend in args.backends:
        for world in args.worlds:
            for fault in args.faults:
                for strategy in args.strategies:
                    t0 = time.monotonic()
                    outcomes = run_fault(strategy, world, fault, backend)
                    ok = all(o.kind == "raised" and o.seconds is not None and o.seconds <= GROUP_TIMEOUT + 5
                             for o in outcomes)
                    cases.append({"backend": backend, "world": world, "fault": fault, "strategy": strategy,
                                  "ok": ok, "survivors": [asdict(o) for o in outcomes],
                                  "wall_seconds": round(time.monotonic() - t0, 1)})
                    worst = max((o.seconds or 0.0 for o in outcomes), default=0.0)
                    print(f"{backend:8s} n={world} {fault:5s} {strategy:18s} "
                          f"{'ok' if ok else 'FAIL'}  raised {sum(o.kind == 'raised' for o in outcomes)}/"
                          f"{len(outcomes)}  worst {worst:.2f} s", flush=True)
    summary: dict[str, dict[str, str]] = {}
    for c in cases:
        row = summary.setdefault(f"{c['backend']} n={c['world']} {c['fault']}", {})
        raised = sum(s["kind"] == "raised" for s in c["survivors"])
        row[c["strategy"]] = f"{raised}/{len(c['survivors'])}"
    out = Path(args.out)
    write_results(out, cases, group_timeout_s=GROUP_TIMEOUT, summary=summary)
    failed = [c for c in cases if not c["ok"]]
    print(f"{len(cases) - len(failed)}/{len(cases)} cases: every survivor raised in time; wrote {out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
