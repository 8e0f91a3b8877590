"""`gradwire profile` of the FSDP2 example on several networks: bytes against the parameter count, step time against the model.

For each network, runs::

    gradwire profile --net NET -- python -m torch.distributed.run --standalone --nproc-per-node 2 \
        examples/fsdp2_gpt.py --steps S --json steps.json

and checks two things.

1. Bytes. FSDP2 with one unit per transformer block and the root (embeddings,
   final norm, head): per step each block's parameters are all-gathered for
   forward and again for backward, the root's once (it stays gathered until
   backward), and every gradient is reduce-scattered. So the profile's
   all_gather payload must be ``steps * (2 * block_bytes + root_bytes)`` and its
   reduce_scatter payload ``steps * param_bytes``, exactly.
2. Step time. The network model prices every op of a step independently of
   the run (:class:`gradwire.net.NetworkModel` on each unit's bytes); the ops
   of one group queue on one link, so a step's communication is their sum.
   Predicted step = compute step (the loopback run) + that sum: communication
   that FSDP's prefetching hides behind compute makes the real step shorter,
   by at most the compute step. On a network slow enough to dominate, the two
   bounds are close and the measured step must lie within 10% of the prediction;
   so must its growth from the next faster network, in which the compute step
   (measured on a machine that other work may share) cancels out.

Writes benchmarks/results/fsdp2_profile.json.

    python benchmarks/fsdp2_profile.py                # 2 ranks, 6 steps, four networks
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import write_results

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fsdp2_gpt.py"
NETWORKS = ("loopback", "1gbe", "bandwidth=100mbit,latency=1ms", "bandwidth=10mbit,latency=1ms")
#: the network the 10% claim is made on: slow enough that communication dominates the step
DOMINANT = NETWORKS[-1]
TOLERANCE = 0.10


def _profile(net: str, steps: int, world: int, out: Path) -> tuple[dict, dict]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", net, "--out", str(out), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           str(EXAMPLE), "--steps", str(steps), "--json", str(out / "steps.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, COLUMNS="160"), timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"gradwire profile failed on {net}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    print(proc.stdout[proc.stdout.find("communication of"):proc.stdout.find("trace:")], flush=True)
    return json.loads((out / "profile.json").read_text()), json.loads((out / "steps.json").read_text())


def predicted_comm_per_step(net: str, world: int, root_bytes: int, block_bytes: int, layers: int) -> float:
    """Seconds the network model gives the ops of one FSDP2 step, queued on one link."""
    from gradwire.net import NetworkModel

    model = NetworkModel(net, world)
    gather = model.cost("all_gather", root_bytes).seconds + 2 * layers * model.cost("all_gather", block_bytes).seconds
    scatter = model.cost("reduce_scatter", root_bytes).seconds + layers * model.cost("reduce_scatter", block_bytes).seconds
    return gather + scatter


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fsdp2_profile.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gradwire-fsdp2-"))
    rows = []
    compute_step = None
    for i, net in enumerate(NETWORKS):
        profile, steps = _profile(net, args.steps, args.world, work / f"net{i}")
        ops = min(profile["ranks"], key=lambda r: r["rank"])["ops"]
        n, root, block, layers = steps["n_params"], steps["root_params"], steps["block_params"], steps["layers"]
        want_gather = args.steps * 4 * (2 * layers * block + root)
        want_scatter = args.steps * 4 * n
        comm = predicted_comm_per_step(net, args.world, 4 * root, 4 * block, layers)
        measured = steps["median_step_seconds"]
        if compute_step is None:
            compute_step = measured  # loopback: the step without a network
        predicted = compute_step + comm
        rows.append({
            "net": net,
            "all_gather_bytes": ops["all_gather"]["payload_bytes"], "all_gather_bytes_expected": want_gather,
            "reduce_scatter_bytes": ops["reduce_scatter"]["payload_bytes"], "reduce_scatter_bytes_expected": want_scatter,
            "all_gather_calls": ops["all_gather"]["calls"], "reduce_scatter_calls": ops["reduce_scatter"]["calls"],
            "all_gather_exposed_s": ops["all_gather"].get("exposed_seconds"),
            "reduce_scatter_exposed_s": ops["reduce_scatter"].get("exposed_seconds"),
            "model_comm_per_step_s": comm,
            "profiled_model_seconds_per_step": ops["total"]["model_seconds"] / args.steps,
            "step_s_measured": measured, "step_s_predicted": predicted,
            "step_s_lower_bound": max(compute_step, comm),
            "error": measured / predicted - 1,
            "step_times_s": steps["step_seconds"],
        })
        r = rows[-1]
        print(f"{net}: all_gather {r['all_gather_bytes']} B (expected {want_gather}), reduce_scatter "
              f"{r['reduce_scatter_bytes']} B (expected {want_scatter}); step {measured * 1e3:.1f} ms measured, "
              f"{predicted * 1e3:.1f} ms predicted ({r['error']:+.1%})", flush=True)
    ok_bytes = all(r["all_gather_bytes"] == r["all_gather_bytes_expected"]
                   and r["reduce_scatter_bytes"] == r["reduce_scatter_bytes_expected"] for r in rows)
    dominant = next(r for r in rows if r["net"] == DOMINANT)
    # growth from the next faster network: the compute step cancels out, only the network's share is left
    before = rows[[r["net"] for r in rows].index(DOMINANT) - 1]
    growth = {"from": before["net"], "to": DOMINANT,
              "measured_s": dominant["step_s_measured"] - before["step_s_measured"],
              "model_s": dominant["model_comm_per_step_s"] - before["model_comm_per_step_s"]}
    growth["error"] = growth["measured_s"] / growth["model_s"] - 1
    report = write_results(
        args.out, rows,
        world=args.world, steps=args.steps, n_params=steps["n_params"],
        root_params=steps["root_params"], block_params=steps["block_params"], layers=steps["layers"],
        compute_step_s=compute_step, bytes_match=ok_bytes,
        dominant_net=DOMINANT, dominant_error=dominant["error"],
        growth=growth,
        within_tolerance=abs(dominant["error"]) <= TOLERANCE and abs(growth["error"]) <= TOLERANCE,
        tolerance=TOLERANCE,
    )
    print(f"bytes match the parameter count: {ok_bytes}; on {DOMINANT} the step is "
          f"{dominant['error']:+.1%} off the model's prediction; from {before['net']} it grew by "
          f"{growth['measured_s']:.3f} s, the model says {growth['model_s']:.3f} s ({growth['error']:+.1%}) -> {args.out}")
    return 0 if ok_bytes and report["within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
