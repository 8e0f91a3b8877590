"""A network that changes, on real packets: `gradwire bench` sweeps (gloo) per stretch of a schedule vs the model.

One run, as root, on 2 nodes x 1 rank::

    gradwire emulate --net bandwidth=1gbit,drop=100mbit:for=40s:at=40s,outage=2s:at=100s --nodes 2 -- \\
        python benchmarks/emulate_schedule.py --worker OUT

The links run at 1 Gbit/s, fall to 100 Mbit/s from t = 40 s to 80 s (the
shapers changed in place while the job's connections carry on), come back,
and go down for 2 s at t = 100 s (every switch port down); the job ends at 110 s. ``t = 0`` is the
first node's start; the job's default group comes up a few seconds later
(the simulated backend's ``t = 0``), and the worker records when.

Each rank runs the driver of ``gradwire bench`` (:func:`gradwire.bench.driver.run_in_group`:
all_reduce, one size per sweep, out-of-place and in-place, nccl-tests'
timing; ``-c 0``: the check's reference and comparison are CPU work that
a busy 2-core host stretched a sweep by seconds with, and every call of the
probes below checks its whole result one size after the other: of 4, 16 and 64
MiB, those the model prices at 0.1-1.5 s per call on the stretch (16 and 64
MiB at 1 Gbit/s, 4 and 16 MiB at 100 Mbit/s). Rank 0 starts a sweep only when
it ends before the next change (the model's time of its calls times 1.5,
plus the most the host's part of a sweep took so far), else all ranks wait
for the change; a sweep counts for a stretch when it began at
least ``SETTLE`` seconds after the change (the old rate's queue drains, TCP
finds the new rate) and ended before the next one. Sweeps that crossed a
change anyway are left out and counted. Per stretch and row the figure is
the median of its sweeps' times, against the simulated backend's price of
the op on that stretch's condition (``NetworkModel.at(condition)``, gloo's
ring; an op inside a stretch meets nothing else). Around the outage both
ranks call a 1 MiB all_reduce back to back (each after the broadcast of
rank 0's next step, which is timed with it): the calls that meet it wait,
and the worker records how long after the ports came back up they ended.

A row is link-dominated as in emulate_bench.py: unshaped sweeps over the
same namespaces (``--net custom``, run first, 3 times, the median per row)
cost at most a quarter of the modelled link time. Check: every link-dominated in-place row of every
stretch within 10 % of the model, every probe right, every change applied.
Writes benchmarks/results/emulate_schedule.json in the shared shape of
``_results.write_results``: one row per stretch, size and placement (``stretch``
is its index in ``stretches``, which holds each stretch's bounds and rate), the
emulated job's command as ``emulate_command``, and the raw files under
benchmarks/results/emulate_schedule/; exits 1 if the check fails.

    sudo python benchmarks/emulate_schedule.py [--fast 1gbit] [--out FILE] [--rescore]   # ~5 min

``--fast`` sets the rate of the outer stretches; ``--rescore`` analyses the
raw files of the last run (beside ``--out``) again.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import write_results

RESULTS = Path(__file__).parent / "results"
SCRIPT = str(Path(__file__).resolve())
GRADWIRE = [sys.executable, "-m", "gradwire.cli.main"]
#: the schedule; {fast} is the rate of the outer stretches (--fast, default 1gbit)
SPEC = "bandwidth={fast},drop=100mbit:for=40s:at=40s,outage=2s:at=100s"
#: the job ends this long after t = 0
END = 110.0
#: candidate sizes; a stretch sweeps those the model prices at CALL_SECONDS per call
SIZES = (4 << 20, 16 << 20, 32 << 20)
CALL_SECONDS = (0.1, 1.5)
#: a sweep counts for a stretch when it began this long after the stretch's change
SETTLE = 1.0
#: a sweep is started only if the model's time of it, times this, ends before the next change
MARGIN = 1.5
#: the host's part of a sweep (buffers, gathers) assumed before one was measured, seconds
FIRST_OVERHEAD = 3.0
#: wanted seconds per sweep (iterations are chosen from the model's price)
SWEEP_SECONDS = 4.0
#: the all_reduce called back to back around an outage
PROBE_BYTES = 1 << 20
#: unshaped sweeps; a row's unshaped time is their median (a busy host makes one of them slow now and then)
UNSHAPED_REPEATS = 3
#: a row is link-dominated when the unshaped time is at most this share of the modelled time
DOMINANCE = 0.25
TOLERANCE_PCT = 10.0


def worker(out: Path) -> None:
    """One rank: the sweeps of each stretch and the calls across the outage; rank 0 writes OUT."""
    import torch
    import torch.distributed as dist

    from gradwire.bench.config import BenchConfig
    from gradwire.bench.driver import run_in_group
    from gradwire.net import NetworkModel, parse_spec

    t0 = float(os.environ["GRADWIRE_EMULATE_T0"])

    def now() -> float:
        return time.monotonic() - t0

    dist.init_process_group("gloo")
    group_at = now()
    rank = dist.get_rank()
    model = NetworkModel(parse_spec(os.environ["GRADWIRE_EMULATED_NET"] + ",algorithm=ring"), dist.get_world_size())
    assert model.schedule is not None
    stretches = []
    t = 0.0
    for end, cond in model.schedule.segments(0.0, model.spec.bandwidth):
        stretches.append((t, end, cond))
        if end > END:
            break
        t = end
    sweeps: list[dict] = []
    probes: list[list[float]] = []
    crossed = 0
    turn, turn_of = 0, -1
    overhead: list[float] = []

    def decide() -> list[float]:
        """Rank 0's next step, the same for every rank: [kind, size index, iterations, seconds to wait]."""
        nonlocal turn, turn_of
        t = now()
        if t > END:
            return [0, 0, 0, 0]
        i = next(k for k, (a, b, _) in enumerate(stretches) if a <= t < b)
        a, b, cond = stretches[i]
        down_next = i + 1 < len(stretches) and stretches[i + 1][2].down
        if cond.down or (down_next and b - t < 3.0) or (i > 0 and stretches[i - 1][2].down and t < a + 3.0):
            return [2, 0, 0, 0]  # across the outage: back-to-back calls
        if t < a + SETTLE:
            return [3, 0, 0, a + SETTLE - t]
        here = model.at(cond)
        sizes = [n for n in SIZES if CALL_SECONDS[0] <= here.cost("all_reduce", n).seconds <= CALL_SECONDS[1]]
        if turn_of != i:  # a new stretch starts with the smallest size
            turn, turn_of = 0, i
        size = sizes[turn % len(sizes)]
        call = here.cost("all_reduce", size).seconds
        iters = max(2, min(20, round(SWEEP_SECONDS / 2 / call)))
        calls = 1 + 2 * iters  # warm-up, out-of-place, in-place (unchecked: the probes check every result)
        # the sweep's wall time: its calls as the model prices them, plus the most the host's part of a sweep took
        need = MARGIN * calls * call + max(overhead, default=FIRST_OVERHEAD)
        limit = b - 3.0 if down_next else min(b, END)
        if t + need >= limit:  # wait for the probes before an outage, or for the next stretch
            return [3, 0, 0, max(limit - t, 0.0) + (0.0 if down_next else SETTLE)]
        turn += 1
        return [1, SIZES.index(size), iters, 0]

    while True:
        began = now()  # a probe is this broadcast and its all_reduce: during an outage either one waits
        step = torch.tensor(decide() if rank == 0 else [0.0] * 4, dtype=torch.float64)
        dist.broadcast(step, 0)
        kind, size_i, iters, wait = step.tolist()
        if kind == 0:
            break
        if kind == 3:
            time.sleep(wait)
            dist.barrier()
            continue
        if kind == 2:
            x = torch.full((PROBE_BYTES // 4,), float(rank + 1))
            dist.all_reduce(x)
            probes.append([began, now(), bool(torch.all(x == 3.0))])
            continue
        size = SIZES[int(size_i)]
        config = BenchConfig(min_bytes=size, max_bytes=size, iters=int(iters), warmup=1, check=False)
        dist.barrier()
        began = now()
        result = run_in_group(config)
        ended = now()
        timed = sum(row.time_us or 0.0 for row in result.rows) * 1e-6 * (int(iters) + 1)  # + the warm-up call
        overhead.append(max(ended - began - timed, 0.0))
        where = [k for k, (a, b, _) in enumerate(stretches) if a + SETTLE <= began and ended <= b]
        crossed += not where
        for row in result.rows:
            sweeps.append({"size": row.size, "placement": row.placement, "time_us": row.time_us, "wrong": row.wrong,
                           "iters": int(iters), "began": began, "ended": ended,
                           "stretch": where[0] if where else None})
    if rank == 0:
        out.write_text(json.dumps({
            "group_at": group_at, "model_spec": model.spec.to_string(), "sweeps": sweeps, "crossed": crossed,
            "probes": probes, "stretches": [{"start": a, "end": b, "down": c.down,
                                             "bandwidth": model.spec.bandwidth if c.bandwidth is None else c.bandwidth}
                                            for a, b, c in stretches],
        }, indent=1) + "\n")
    sys.stdout.flush()
    os._exit(0)  # results are written; gloo's teardown may abort (DESIGN.md)


def load() -> dict:
    """The machine's load averages and the uptime line, to judge how quiet the timings were."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"loadavg": list(os.getloadavg()), "uptime": uptime, "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def emulate(net: str, cmd: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    full = [*GRADWIRE, "emulate", "--net", net, "--nodes", "2", "--timeout", "600", "--", *cmd]
    proc = subprocess.run(full, capture_output=True, text=True)
    shown = " ".join(full).replace(" ".join(GRADWIRE), "gradwire").replace(sys.executable, "python")
    return proc, shown.replace(SCRIPT, "benchmarks/emulate_schedule.py")


#: "t=30.000s: 100 Mbit/s on every link (applied at 30.001s, in 35.2 ms)"
APPLIED = re.compile(r"t=([0-9.]+)s: (.*) \(applied at ([0-9.]+)s, in ([0-9.]+) ms\)")


def analyse(data: dict, unshaped: dict) -> dict:
    """Per stretch and row: the median of its sweeps against the model of its condition."""
    from gradwire.net import NetworkModel, parse_spec
    from gradwire.net.schedule import Condition

    model = NetworkModel(parse_spec(data["model_spec"]), 2)
    base = {(r["size"], r["placement"]): r["time_us"] for r in unshaped["rows"]}
    stretches = []
    for k, s in enumerate(data["stretches"]):
        if s["down"]:
            continue
        cond = Condition(bandwidth=s["bandwidth"])
        rows = []
        for size in sorted({w["size"] for w in data["sweeps"] if w["stretch"] == k}):
            model_us = model.at(cond).cost("all_reduce", size).seconds * 1e6
            for placement in ("out-of-place", "in-place"):
                got = [w for w in data["sweeps"] if w["stretch"] == k and w["size"] == size
                       and w["placement"] == placement]
                if not got:
                    continue
                measured = statistics.median(w["time_us"] for w in got)
                unshaped_us = base[(size, placement)]
                rows.append({"size": size, "placement": placement, "sweeps": len(got), "measured_us": measured,
                             "sweeps_us": [w["time_us"] for w in got], "model_us": model_us,
                             "error_pct": 100 * (model_us / measured - 1), "unshaped_us": unshaped_us,
                             "link_dominated": unshaped_us <= DOMINANCE * model_us,
                             "wrong": sum(w["wrong"] or 0 for w in got)})
        stretches.append({"start_s": s["start"], "end_s": min(s["end"], END), "bandwidth": s["bandwidth"], "rows": rows})
    return {"stretches": stretches}


def outage_figures(data: dict) -> dict:
    """The calls that met the outage: when they ended against the ports' return."""
    down = next(s for s in data["stretches"] if s["down"])
    calls = data["probes"]
    met = [c for c in calls if c[0] < down["end"] and c[1] > down["start"]]
    return {"start_s": down["start"], "end_s": down["end"], "calls": len(calls), "calls_that_met_it": len(met),
            "resumed_after_s": max(c[1] for c in met) - down["end"] if met else None,
            "longest_call_s": max(c[1] - c[0] for c in met) if met else None,
            "all_right": all(c[2] for c in calls), "calls_after_it": sum(1 for c in calls if c[0] > down["end"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS / "emulate_schedule.json", help="results file")
    ap.add_argument("--fast", default="1gbit", help="rate of the outer stretches (default: %(default)s)")
    ap.add_argument("--rescore", action="store_true", help="analyse the raw files of the last run again")
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0
    raw = args.out.with_suffix("")
    raw.mkdir(parents=True, exist_ok=True)
    unshaped_files = [raw / f"unshaped_2x1_r{i}.json" for i in range(UNSHAPED_REPEATS)]
    sched_file, run_file = raw / "schedule_2x1.json", raw / "run.json"
    if args.rescore:
        kept = json.loads(run_file.read_text())
        started, base_cmd, cmd, seconds = kept["load_at_start"], kept["unshaped_command"], kept["command"], kept["seconds"]
        proc = subprocess.CompletedProcess(cmd, kept["exit_code"], "", kept["stderr"])
    else:
        started = load()
        print(f"load at start: {started['uptime']}", flush=True)
        for file in unshaped_files:
            file.unlink(missing_ok=True)
            base_proc, base_cmd = emulate("custom", [*GRADWIRE, "bench", "-b", "4M", "-e", "32M", "-f", "2", "-n",
                                                     "5", "-w", "1", "--json", str(file), "--no-progress"])
            if not file.exists():
                print(base_proc.stderr[-3000:])
                return 1
        sched_file.unlink(missing_ok=True)
        t = time.monotonic()
        proc, cmd = emulate(SPEC.format(fast=args.fast), [sys.executable, SCRIPT, "--worker", str(sched_file)])
        seconds = time.monotonic() - t
        run_file.write_text(json.dumps({"load_at_start": started, "unshaped_command": base_cmd, "command": cmd,
                                        "seconds": seconds, "exit_code": proc.returncode, "stderr": proc.stderr,
                                        "load_at_end": load()}, indent=1) + "\n")
        if not sched_file.exists():
            print(proc.stderr[-3000:])
            return 1
    runs = [json.loads(f.read_text()) for f in unshaped_files]
    unshaped = {"rows": [dict(row, time_us=statistics.median(r["rows"][i]["time_us"] for r in runs))
                         for i, row in enumerate(runs[0]["rows"])]}
    data = json.loads(sched_file.read_text())
    result = analyse(data, unshaped)
    applied = [{"at_s": float(m[1]), "what": m[2], "applied_at_s": float(m[3]), "apply_ms": float(m[4])}
               for m in APPLIED.finditer(proc.stderr)]
    outage = outage_figures(data)
    judged = [r for s in result["stretches"] for r in s["rows"] if r["link_dominated"] and r["placement"] == "in-place"]
    worst = max((abs(r["error_pct"]) for r in judged), default=math.nan)
    # the three long stretches (1 Gbit/s, 100 Mbit/s, 1 Gbit/s) must each be judged; the end is the probes'
    every_stretch = all(any(r["link_dominated"] and r["placement"] == "in-place" for r in s["rows"])
                        for s in result["stretches"] if s["end_s"] - s["start_s"] >= 15)
    wrong = sum(r["wrong"] for s in result["stretches"] for r in s["rows"])
    ok = bool(judged) and every_stretch and worst <= TOLERANCE_PCT and wrong == 0 and proc.returncode == 0 \
        and len(applied) == 4 and outage["all_right"] and outage["calls_after_it"] > 0
    print(f"\n{cmd}\n  exit {proc.returncode}, {seconds:.0f} s; the group came up {data['group_at']:.2f} s after t=0; "
          f"{data['crossed']} sweep(s) crossed a change (left out)")
    for a in applied:
        print(f"  change due t={a['at_s']:.3f}s ({a['what']}): applied at {a['applied_at_s']:.3f}s in "
              f"{a['apply_ms']:.1f} ms")
    for s in result["stretches"]:
        print(f"\n  t={s['start_s']:.0f}-{s['end_s']:.0f}s at {s['bandwidth'] / 1e6:.0f} Mbit/s")
        print(f"    {'size':>6} {'placement':>12} {'sweeps':>6} {'measured ms':>12} {'model ms':>9} {'err':>7} "
              f"{'unshaped ms':>12}")
        for r in s["rows"]:
            print(f"    {r['size'] >> 20:>4}MB {r['placement']:>12} {r['sweeps']:>6} {r['measured_us'] / 1e3:>12.1f} "
                  f"{r['model_us'] / 1e3:>9.1f} {r['error_pct']:>+6.1f}% {r['unshaped_us'] / 1e3:>12.1f}"
                  f"{'' if r['link_dominated'] else '  (host-bound)'}")
    print(f"\n  outage t={outage['start_s']:.0f}-{outage['end_s']:.0f}s: {outage['calls_that_met_it']} call(s) met it, "
          f"the last ended {outage['resumed_after_s']:.2f} s after the ports came back; "
          f"{outage['calls_after_it']} calls after it, results right: {outage['all_right']}")
    traffic = [ln for ln in proc.stderr.splitlines() if "real packets" in ln]
    print(f"  {traffic[0] if traffic else ''}")
    print(f"\n{'PASS' if ok else 'FAIL'}: link-dominated in-place rows of every stretch within {worst:.1f}% of the "
          f"model (<= {TOLERANCE_PCT:.0f}); every stretch judged: {every_stretch}; probes right: {outage['all_right']}")
    rows = [{"stretch": k, "start_s": s["start_s"], "end_s": s["end_s"], "bandwidth": s["bandwidth"], **r}
            for k, s in enumerate(result["stretches"]) for r in s["rows"]]
    # a rescore's own command, commit and date are the rescore's: those of the run that measured go beside them
    previous = json.loads(args.out.read_text()) if args.rescore and args.out.exists() else {}
    measured = {f"measured_{k}": previous.get(f"measured_{k}", previous.get(k))
                for k in ("command", "commit", "date")} if args.rescore else {}
    write_results(args.out, rows, indent=2, **measured,
                  description=__doc__.splitlines()[0], emulate_command=cmd, unshaped_command=base_cmd,
                  spec=data["model_spec"], exit_code=proc.returncode, seconds=seconds, group_at_s=data["group_at"],
                  sweeps_crossed_a_change=data["crossed"], settle_s=SETTLE, dominance_threshold=DOMINANCE,
                  tolerance_pct=TOLERANCE_PCT, max_error_pct_dominated_in_place=worst, changes=applied,
                  stretches=[{k: v for k, v in s.items() if k != "rows"} for s in result["stretches"]],
                  outage=outage, emulate_lines=traffic, load_at_start=started,
                  load_at_end=json.loads(run_file.read_text())["load_at_end"], rescored=args.rescore,
                  all_checks_pass=ok)
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
