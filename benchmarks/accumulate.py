"""Gradient accumulation under `gradwire profile` and `predict`: a step is an optimizer step (issue 44).

For each way of writing accumulation (``no_sync``: ``with ddp.no_sync():``;
``flag``: ``ddp.require_backward_grad_sync = False``) and each count of
micro-steps per optimizer step (1, 2, 8), runs the script of the tests::

    gradwire profile --net NET --out DIR -- python -m torch.distributed.run --nproc-per-node 2 \\
        tests/profile/accumulate_ddp.py            (ACCUM_MODE, ACCUM_MICRO, ACCUM_STEPS, ACCUM_WIDTH, ACCUM_BATCH)
    gradwire predict --profile DIR --net NET --worlds 2,8,64 --strategies sync --batch-size B --json ...

and checks:

1. the profile records one step per optimizer step (``steps - 1``: the
   first starts the series) with its ``micro`` micro-steps each;
2. predict's step at 2 ranks on the recorded network against the measured
   optimizer step (the median of the script's own wall seconds per optimizer
   step on both ranks, over the steps predict takes): within 5%;
3. ``predict --accumulate 8`` of the profile recorded with 1 micro-step
   against predict of the profile recorded with 8, at 2, 8 and 64 ranks,
   and against the measured step with 8: within 10%.

Each figure is the median over ``--repeats`` tries of each try's error; a try
runs every count of micro-steps back to back, so that a shared machine's
drift between tries cancels (a run with 1 and one with 8 that minutes of
other work separate differ by up to 40% here).

The model: an MLP of width ``--width`` (1.2 MB of gradients at 512, two DDP
buckets) on batches of ``--batch``, 2 ranks with one thread each; the network
is slow enough that the exchange is a large share of a step without
accumulation. ``--sleep-ms F,B`` (default 10,20) adds to each micro-step's
forward and backward a wait of F and B ms (at the model's input: the
gradients' exchange runs beside the backward one), as a host thread waits for
its GPU: compute that other work on a shared host does not stretch, so that
the figures test the step model and not the host's load. ``--sleep-ms 0,0``
measures CPU compute alone (``results/accumulate_cpu.json``, a host at load
6-9: the what-if's runs, minutes apart, computed up to 1.6x faster or slower).

``--clock sim`` runs the profiles on the simulated cluster clock (``clock=sim,device=cpu-core``:
compute priced by the device model, the script's own timer reading the
cluster's time through ``GRADWIRE_SIM_TIME=1``): the same figures on any
host, so one try is enough (``results/accumulate_sim.json``).

Writes benchmarks/results/accumulate.json.

    python benchmarks/accumulate.py [--net bandwidth=500mbit] [--steps 20] [--micro 1,2,8] [--modes no_sync,flag]
                                    [--repeats 3] [--sleep-ms 10,20]
    python benchmarks/accumulate.py --sleep-ms 0,0 --batch 256 --out benchmarks/results/accumulate_cpu.json
    python benchmarks/accumulate.py --clock sim --repeats 1 --out benchmarks/results/accumulate_sim.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import write_results

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "profile" / "accumulate_ddp.py"
WORLDS = (2, 8, 64)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _gradwire(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradwire.cli.main", *args], env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


def profile(out: Path, net: str, mode: str, micro: int, steps: int, width: int, batch: int, port: int,
            sleep_ms: str, clock: str) -> dict:
    """Run the script under ``gradwire profile``; its records and its own step times."""
    measured = [out / f"measured{r}.json" for r in range(2)]
    env = _env(ACCUM_MODE=mode, ACCUM_MICRO=str(micro), ACCUM_STEPS=str(steps), ACCUM_WIDTH=str(width),
               ACCUM_BATCH=str(batch), ACCUM_OUT=str(out / "measured{rank}.json"), ACCUM_SLEEP_MS=sleep_ms,
               **({"GRADWIRE_SIM_TIME": "1"} if clock == "sim" else {}))  # the script's own timer: the cluster's
    if clock == "sim":
        net = f"{net},clock=sim,device=cpu-core"
    proc = _gradwire("profile", "--net", net, "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run",
                     "--nproc-per-node", "2", f"--master-port={port}", str(SCRIPT), env=env)
    if not all(m.exists() for m in measured):
        raise RuntimeError(f"{mode} x{micro}: the run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    # both ranks' steps, those predict takes from the profile (its records start at the script's second step
    # and it skips 3 and the last)
    times = [t for m in measured for t in json.loads(m.read_text())["step_seconds"][4:-1]]
    return {"recorded_steps": [len(r["steps"]) for r in ranks],
            "micro_steps": sorted({s["micro_steps"] for r in ranks for s in r["steps"]}),
            "measured_step": statistics.median(times), "measured_steps": len(times)}


def predict(out: Path, net: str, batch: int, *extra: str) -> dict[int, float]:
    js = out / f"predict{''.join(extra)}.json"
    proc = _gradwire("predict", "--profile", str(out), "--net", net, "--worlds", ",".join(map(str, WORLDS)),
                     "--strategies", "sync", "--batch-size", str(batch), "--json", str(js), *extra)
    if proc.returncode:
        raise RuntimeError(f"predict failed: {proc.stderr[-2000:]}")
    return {p["world"]: p["step_seconds"] for p in json.loads(js.read_text())["predictions"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="bandwidth=500mbit")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    ap.add_argument("--micro", default="1,2,8", help="micro-steps per optimizer step (1 and 8 for check 3)")
    ap.add_argument("--modes", default="no_sync,flag")
    ap.add_argument("--repeats", type=int, default=3, help="tries, each running every count back to back")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sleep-ms", default="10,20", help="F,B: ms each micro-step's forward and backward wait")
    ap.add_argument("--clock", choices=("realtime", "sim"), default="realtime",
                    help="sim: the simulated cluster clock (device cpu-core; no waits), host-independent")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "accumulate.json"))
    args = ap.parse_args()
    from gradwire.launch import free_port

    micros = [int(m) for m in args.micro.split(",")]
    rows, whatif = [], []
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="gradwire-accumulate-") as tmp_dir:
        tmp = os.environ.get("ACCUM_KEEP") or tmp_dir
        for repeat in range(args.repeats):
            for mode in args.modes.split(","):
                dirs: dict[int, Path] = {}
                for micro in micros:
                    out = dirs[micro] = Path(tmp) / f"{mode}{micro}_{repeat}"
                    row = {"repeat": repeat, "mode": mode, "micro": micro,
                           **profile(out, args.net, mode, micro, args.steps, args.width, args.batch, free_port(),
                                      args.sleep_ms if args.clock == "realtime" else "0,0", args.clock)}
                    step = predict(out, args.net, args.batch)
                    row["predicted"] = step
                    row["error_2"] = step[2] / row["measured_step"] - 1
                    row["counts_ok"] = row["recorded_steps"] == [args.steps - 1] * 2 and row["micro_steps"] == [micro]
                    rows.append(row)
                    print(f"{repeat}: {mode} x{micro}: {row['recorded_steps']} steps recorded, micro-steps "
                          f"{row['micro_steps']}; measured {row['measured_step'] * 1e3:.1f} ms, predicted "
                          f"{step[2] * 1e3:.1f} ms at 2 ranks ({row['error_2']:+.1%})", flush=True)
                if 1 in dirs and 8 in dirs:  # the pair of this try: run back to back, so that drift cancels
                    asked = predict(dirs[1], args.net, args.batch, "--accumulate", "8")
                    recorded = rows[-len(micros) + micros.index(8)]
                    w = {"repeat": repeat, "mode": mode, "whatif_from_1": asked, "recorded_8": recorded["predicted"],
                         "measured_8": recorded["measured_step"],
                         "error_vs_recorded": {n: asked[n] / recorded["predicted"][n] - 1 for n in WORLDS},
                         "error_vs_measured_2": asked[2] / recorded["measured_step"] - 1}
                    whatif.append(w)
                    print(f"{repeat}: {mode}: --accumulate 8 of the profile with 1 vs the profile with 8: " + ", ".join(
                        f"{n} ranks {asked[n] * 1e3:.1f} vs {recorded['predicted'][n] * 1e3:.1f} ms "
                        f"({w['error_vs_recorded'][n]:+.1%})" for n in WORLDS)
                        + f"; vs measured {recorded['measured_step'] * 1e3:.1f} ms ({w['error_vs_measured_2']:+.1%})",
                        flush=True)
    # the figures: per mode and count, the median over the tries of the error (pairing cancels the drift of a
    # shared machine: each try's prediction is scored against its own run)
    median_error_2 = {f"{m}{k}": statistics.median(r["error_2"] for r in rows if r["mode"] == m and r["micro"] == k)
                      for m in args.modes.split(",") for k in micros}
    median_whatif = {m: {str(n): statistics.median(w["error_vs_recorded"][n] for w in whatif if w["mode"] == m)
                         for n in WORLDS} | {"measured_2": statistics.median(
                             w["error_vs_measured_2"] for w in whatif if w["mode"] == m)}
                     for m in {w["mode"] for w in whatif}}
    # the profile of 1 is the same job whichever way the script accumulates: every try's what-if pooled
    median_whatif["pooled"] = {str(n): statistics.median(w["error_vs_recorded"][n] for w in whatif) for n in WORLDS} \
        | {"measured_2": statistics.median(w["error_vs_measured_2"] for w in whatif)} if whatif else {}
    print("median error of predict's 2-rank step vs the measured step: "
          + ", ".join(f"{k} {v:+.1%}" for k, v in median_error_2.items()))
    for m, errs in median_whatif.items():
        print(f"median error of --accumulate 8 (from 1) vs the profile with 8, {m}: "
              + ", ".join(f"{k} {v:+.1%}" for k, v in errs.items()))
    within_5 = all(abs(e) <= 0.05 for e in median_error_2.values())
    within_10 = all(abs(e) <= 0.10 for errs in median_whatif.values() for e in errs.values())
    counts = all(r["counts_ok"] for r in rows)
    print(f"counts {'ok' if counts else 'WRONG'}; predict within 5% of the measured step: {within_5}; "
          f"--accumulate 8 within 10%: {within_10}")
    write_results(args.out, rows, net=args.net, steps=args.steps, width=args.width, batch=args.batch,
                  sleep_ms=args.sleep_ms, clock=args.clock,
                  repeats=args.repeats, load_before=load_before, counts_ok=counts, within_5=within_5,
                  within_10=within_10, median_error_2=median_error_2, median_whatif=median_whatif, whatif=whatif)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
