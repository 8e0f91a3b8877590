"""``device=profile:DIR``: the GPT example recorded op by op, replayed on the simulated clock, against its own step.

    python benchmarks/profile_device.py                      # seeds 0 1 2, 40 steps, 1gbe, 2 ranks
    python benchmarks/profile_device.py --seeds 0 --steps 30 --net 10gbe

Per seed, three runs of ``examples/gpt_adamw.py`` (DDP + AdamW, 2 ranks under torchrun, evaluation off):

1. ``gradwire profile --ops --net NET,clock=sim,device=host`` (``--record-clock sim``, the default: each
   rank's compute is its thread CPU time, which the others' work on this host does not inflate, and the
   network the model's) or ``--net NET`` (``--record-clock realtime``: this host's wall clock, the modelled
   network waited out for real); every op of steps 3, 5, 7, 9 and 11 timed on that clock's meter, the
   untimed steps between them the recorded step and its compute (the step less the communication the rank
   waited for), in ``rec/ops/cpu.json``;
2. ``gradwire profile --net NET,clock=sim,device=profile:rec``: the same run on the simulated clock, its
   ops priced from the recording, its communication from the network model: the replayed step, against the
   recorded step (compute and communication);
3. ``gradwire profile --net clock=sim,device=profile:rec``: no network: the replayed compute alone (each
   rank's step less its wait for the other), against the recorded compute;
4. step 2 again on the same recording without its per-rank step factors (``step_factors``): every rank's
   every step priced alike, the replay before it followed each recorded rank step by step.

A replayed step is each rank's median of its steps from the fourth on, averaged over ranks (on the
simulated clock each rank's step after DDP's bucket rebuild prices the same ops, times its recorded rank's
factor of that step: the factors cycle through the recording's clean steps). The acceptance: the replayed step within 5% of
the recorded one on every seed. What it covers: the compute is the recording's (the same ops, priced as
they ran here); the communication is the network model's on the simulated clock, the recorded one this
host's wall clock with the same model waited out, so the step's error holds the model's error on this host
too (its ranks share 2 cores with the others' work). Writes benchmarks/results/profile_device/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, write_results  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "profile_device"
#: the replay's steps from the fourth optimizer step on (steps() starts at the second): past DDP's bucket rebuild
CLEAN_FROM = 2


def _profile(net: str, out: Path, seed: int, steps: int, *extra: str) -> None:
    cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", net, "--out", str(out), *extra, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(29500 + seed),
           str(ROOT / "examples" / "gpt_adamw.py"), "--steps", str(steps), "--eval-every", str(10 * steps),
           "--seed", str(seed)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if not list(out.glob("rank*.json")):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def _step(folder: Path) -> tuple[float, float]:
    """(step, waited) seconds: each rank's median over the steps after the window, averaged over ranks."""
    ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    steps = [r["steps"][CLEAN_FROM:] for r in ranks]
    step = statistics.fmean(statistics.median(s["step"] for s in st) for st in steps)
    waited = statistics.fmean(statistics.median(s["backward_wait"] + s["waited"] for s in st) for st in steps)
    return step, waited


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--net", default="1gbe")
    p.add_argument("--record-clock", choices=("sim", "realtime"), default="sim",
                   help="sim: record on clock=sim,device=host (thread CPU time, the network model); realtime: "
                        "this host's wall clock with the model's time waited out")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--work", type=Path, default=None, help="folder for the runs' profiles (default: a temp folder)")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="profile-device-"))
    rows = []
    for seed in args.seeds:
        base = work / f"seed{seed}"
        rec, rep, comp = base / "rec", base / "replay", base / "compute"
        record_net = f"{args.net},clock=sim,device=host" if args.record_clock == "sim" else args.net
        _profile(record_net, rec, seed, args.steps, "--ops")
        _profile(f"{args.net},clock=sim,device=profile:{rec}", rep, seed, args.steps)
        _profile(f"clock=sim,device=profile:{rec}", comp, seed, args.steps)
        recording = json.loads((rec / "ops" / "cpu.json").read_text())
        # the same recording without its per-rank step factors: every rank's every step priced alike
        alike = base / "alike-rec"
        (alike / "ops").mkdir(parents=True, exist_ok=True)
        (alike / "ops" / "cpu.json").write_text(json.dumps({k: v for k, v in recording.items() if k != "step_factors"}))
        _profile(f"{args.net},clock=sim,device=profile:{alike}", base / "alike", seed, args.steps)
        alike_step, alike_waited = _step(base / "alike")
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(rec / "ops" / "cpu.json", args.out / f"recording_{args.record_clock}_seed{seed}.json")  # the recording itself
        replay, replay_waited = _step(rep)
        comp_step, comp_waited = _step(comp)
        compute = comp_step - comp_waited  # the ranks' own compute: the step less their wait for each other
        row = {"seed": seed, "net": args.net, "recorded_on": record_net, "meter": recording["meter"],
               "steps": args.steps,
               "recorded_step_ms": recording["step_seconds"] * 1e3,
               "recorded_compute_ms": recording["compute_seconds"] * 1e3,
               "recorded_waited_ms": recording["waited_seconds"] * 1e3,
               "replayed_step_ms": replay * 1e3, "replayed_waited_ms": replay_waited * 1e3,
               "replayed_compute_ms": compute * 1e3, "replayed_compute_step_ms": comp_step * 1e3,
               "recorded_spread_ms": recording.get("compute_spread_seconds", 0.0) * 1e3,
               "step_factors": recording.get("step_factors", {}),
               "step_error": replay / recording["step_seconds"] - 1,
               "alike_step_ms": alike_step * 1e3, "alike_waited_ms": alike_waited * 1e3,
               "alike_step_error": alike_step / recording["step_seconds"] - 1,
               "compute_error": compute / recording["compute_seconds"] - 1,
               "ops": len(recording["ops"]), "ops_per_step": recording["ops_per_step"],
               "overhead_us_per_op": recording["overhead"] * 1e6, "scale": recording["scale"],
               "clean_steps": recording["clean_steps"], "model": recording["model"]}
        rows.append(row)
        print(f"seed {seed}: recorded step {row['recorded_step_ms']:.2f} ms (compute {row['recorded_compute_ms']:.2f}),"
              f" waited {row['recorded_waited_ms']:.2f}, ranks' spread {row['recorded_spread_ms']:.2f}; replayed "
              f"{row['replayed_step_ms']:.2f} ms ({row['step_error']:+.1%}, waited {row['replayed_waited_ms']:.2f});"
              f" ranks alike {row['alike_step_ms']:.2f} ({row['alike_step_error']:+.1%}); compute alone "
              f"{row['replayed_compute_ms']:.2f} ms ({row['compute_error']:+.1%})", flush=True)
    worst = max(abs(r["step_error"]) for r in rows)
    recorded = ("the simulated clock with device=host (this host's thread CPU time, the network model)"
                if args.record_clock == "sim" else "this host's wall clock (realtime, the model's time waited out)")
    write_results(args.out / f"results_{args.record_clock}.json", rows,
                  clock=f"recorded: {recorded}; replayed: the simulated cluster clock (device=profile:DIR, "
                        "the recording's own device: this host's CPU)",
                  worst_step_error=worst, worst_compute_error=max(abs(r["compute_error"]) for r in rows),
                  worst_alike_step_error=max(abs(r["alike_step_error"]) for r in rows),
                  accepted=worst <= 0.05)
    print(f"worst step error {worst:.1%}: {'within' if worst <= 0.05 else 'beyond'} 5%")


if __name__ == "__main__":
    main()
