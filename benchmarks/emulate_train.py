"""Digits training on 2 nodes x 2 ranks: step time over emulated links (gloo, real packets) vs the simulated network.

Each round runs the same DDP training (``sync``, the wide digits CNN, 2.4 MB
of gradient per step) on 2 nodes of ``--per-node`` ranks (default 2) twice per
link rate, in alternating order:

- emulated, as root: ``gradwire emulate --net bandwidth=RATE --nodes 2
  --nproc-per-node 2 -- python emulate_train.py --worker ... --backend gloo``;
- simulated: two torchrun agents on this host (``--nnodes 2 --node-rank i``,
  static rendezvous on 127.0.0.1) with the gradwire backend and
  ``GRADWIRE_NET=bandwidth=RATE,topology=auto,intra=loopback,algorithm=ring``:
  the model spec ``gradwire emulate`` prints for that network, with gloo's ring;
  ``topology=auto`` takes the 2 x 2 layout from torchrun's environment.

The step time of a run is the mean over ranks of each rank's median step
(after ``--skip`` warm-up steps). The figure per rate is the median over
rounds of each round's error (simulated / emulated - 1, the two runs back to
back), as predict_validate.py does: the medians of the two sides alone can
come from different moments of a busy machine. The check is that figure
within 10 %.

A rate is judged when every rank has a core of its own, or when the network
dominates the step. With more ranks than cores the kernel's work for the
emulated path (veth, bridge, a shaper at each end) runs on the cores the
ranks compute on, and the simulated run, whose real traffic takes loopback,
does not pay it: on 2 cores it has made the rest of the step 20-60 % slower.
That is a property of the host, not of the network model, so a rate is
judged there only when the simulated run spends at least 80 % of its step
waiting on communication (a rest 50 % slower then moves the step by at
most 10 %); otherwise its figures are reported with the reason. Writes
benchmarks/results/emulate_train.json; exits 1 if a judged check fails or
nothing could be judged. ``--rescore FILE`` judges a results file again.
The file has the shared shape of ``_results.write_results``: one row per run
(round, rate, mode, its step time and load), the verdict per rate under
``summary``.

    sudo python benchmarks/emulate_train.py [--rates 100mbit 1gbit] [--steps 40] [--rounds 4] [--per-node 2]   # ~8 min
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SCRIPT = str(Path(__file__).resolve())


def worker(args: argparse.Namespace) -> None:
    """One rank: join the group of ``--backend``, train, write rank<R>.json, leave without teardown."""
    import torch
    import torch.distributed as dist

    import gradwire  # noqa: F401 - registers the gradwire backend
    from gradwire.train.loop import TrainConfig, train_rank

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    config = TrainConfig(strategy="sync", net=os.environ.get("GRADWIRE_NET", "loopback"), model=args.model,
                         epochs=1000, max_steps=args.steps, seed=0)
    result = train_rank(config)
    rank = dist.get_rank()
    net = gradwire.network()
    (Path(args.worker) / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "step_seconds": result.step_seconds, "step_exposed": result.step_exposed,
        "test_accuracy": result.test_accuracy, "model_spec": net.spec.to_string() if net else None,
        "emulated_net": os.environ.get("GRADWIRE_EMULATED_NET"),
    }))
    sys.stdout.flush()
    os._exit(0)  # the result is written; gloo's teardown may abort (see gradwire.launch)


def _worker_argv(out: Path, backend: str, args: argparse.Namespace) -> list[str]:
    return [SCRIPT, "--worker", str(out), "--backend", backend, "--steps", str(args.steps), "--model", args.model]


def emulated(rate: str, out: Path, args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "gradwire.cli.main", "emulate", "--net", f"bandwidth={rate}", "--nodes", "2",
           "--nproc-per-node", str(args.per_node), "--timeout", "900", "--", *_worker_argv(out, "gloo", args)]
    return subprocess.run(cmd, capture_output=True, text=True).returncode


def simulated(rate: str, out: Path, args: argparse.Namespace) -> int:
    from gradwire.launch import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1",
               GRADWIRE_NET=f"bandwidth={rate},topology=auto,intra=loopback,algorithm=ring")
    port = free_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
         f"--nproc-per-node={args.per_node}",
         "--rdzv-backend=static", f"--rdzv-endpoint=127.0.0.1:{port}", "--no-python", sys.executable,
         *_worker_argv(out, "gradwire", args)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node in (0, 1)]
    return max(a.wait(timeout=900) for a in agents)


def step_time(out: Path, skip: int, world: int) -> dict:
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if len(ranks) != world:
        raise RuntimeError(f"{out}: {len(ranks)} of {world} ranks wrote a result")
    medians = [statistics.median(r["step_seconds"][skip:]) for r in ranks]
    return {"step_seconds": statistics.mean(medians), "per_rank_median": medians,
            "exposed_median": statistics.mean(statistics.median(r["step_exposed"][skip:]) for r in ranks),
            "model_spec": ranks[0]["model_spec"], "emulated_net": ranks[0]["emulated_net"],
            "test_accuracy": ranks[0]["test_accuracy"]}


COMM_DOMINATES = 0.8  # share of the simulated step spent waiting on communication (see the module docstring)


def summarize(runs: list[dict], rates: list[str], cores: int) -> dict:
    """Per rate: each side's median step, each round's error and their median (the figure checked), and whether it is judged."""
    summary = {}
    for rate in rates:
        mine = [r for r in runs if r["rate"] == rate]
        step = {(r["round"], r["mode"]): r["step_seconds"] for r in mine}
        rounds = sorted({rnd for rnd, _ in step})
        errors = [100 * (step[(rnd, "simulated")] / step[(rnd, "emulated")] - 1) for rnd in rounds]
        err = statistics.median(errors)
        emu = statistics.median(step[(rnd, "emulated")] for rnd in rounds)
        sim = statistics.median(step[(rnd, "simulated")] for rnd in rounds)
        world = len(mine[0]["per_rank_median"])
        share = statistics.median(r["exposed_median"] / r["step_seconds"] for r in mine if r["mode"] == "simulated")
        judged = world <= cores or share >= COMM_DOMINATES
        reason = (f"a core per rank ({world} ranks, {cores} cores)" if world <= cores else
                  f"{world} ranks on {cores} cores, communication {100 * share:.0f}% of the simulated step "
                  f"({'>=' if judged else '<'} {100 * COMM_DOMINATES:.0f}%)")
        summary[rate] = {
            "emulated_step_ms": 1e3 * emu, "simulated_step_ms": 1e3 * sim,
            "error_of_medians_pct": 100 * (sim / emu - 1),
            "round_errors_pct": errors, "error_pct": err, "within_10pct": abs(err) <= 10,
            "ranks": world, "cores": cores, "comm_share_simulated": share, "judged": judged, "why": reason,
        }
    return summary


def report(summary: dict) -> bool:
    """Print each rate's figures and verdict; True when something was judged and every judged rate is within 10 %."""
    for rate, s in summary.items():
        verdict = ("within 10%" if s["within_10pct"] else "OUTSIDE 10%") if s["judged"] else "not judged"
        print(f"{rate}: emulated {s['emulated_step_ms']:.1f} ms/step, simulated {s['simulated_step_ms']:.1f} ms/step "
              f"(medians); per-round errors {', '.join(f'{e:+.1f}%' for e in s['round_errors_pct'])}, "
              f"median {s['error_pct']:+.1f}%: {verdict} ({s['why']})")
    judged = [s for s in summary.values() if s["judged"]]
    return bool(judged) and all(s["within_10pct"] for s in judged)


def rescore(path: Path) -> int:
    """Judge the runs kept in ``path`` again (on this host's core count unless the file records its own)."""
    data = json.loads(path.read_text())
    runs = data["rows"] if "rows" in data else data["runs"]  # the shared shape, or the one written before it
    rates = list(data["summary"])
    cores = data.get("cores") or os.cpu_count() or 1
    summary = summarize(runs, rates, cores)
    ok = report(summary)
    # the rescore's own command, commit and date are the rescore's: those of the run that measured go beside them
    measured = {f"measured_{k}": data.get(f"measured_{k}", data.get(k)) for k in ("command", "commit", "date")}
    kept = {k: v for k, v in data.items() if k not in ("command", "commit", "dirty", "host", "date", "rows", "runs")}
    write_results(path, runs, indent=2, **{**kept, **measured, "cores": cores, "all_within_10pct": ok,
                                          "summary": summary, "rescored": True})
    print(f"{'PASS' if ok else 'FAIL'}; rewrote {path}")
    return 0 if ok else 1


def load() -> dict:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"loadavg": list(os.getloadavg()), "uptime": uptime, "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the median (default 5)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default="cnn-wide")
    ap.add_argument("--per-node", type=int, default=2, help="ranks per node, 2 nodes (default 2: 2 x 2)")
    ap.add_argument("--out", type=Path, default=RESULTS / "emulate_train.json", help="results file")
    ap.add_argument("--rescore", type=Path, metavar="FILE", help="judge the runs kept in a results file again")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.rescore:
        if not args.rescore.is_file():
            ap.error(f"--rescore {args.rescore}: no such file; give a results file this script wrote "
                     f"(e.g. {RESULTS / 'emulate_train.json'})")
        return rescore(args.rescore)
    runs: list[dict] = []
    started = load()
    print(f"load at start: {started['uptime']}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for rate in args.rates:
                order = ("emulated", "simulated") if rnd % 2 == 0 else ("simulated", "emulated")
                for mode in order:
                    out = Path(tmp) / f"{rnd}-{rate}-{mode}"
                    out.mkdir()
                    before, t0 = load(), time.monotonic()
                    code = (emulated if mode == "emulated" else simulated)(rate, out, args)
                    run = {"round": rnd, "rate": rate, "mode": mode, "exit_code": code,
                           "seconds": time.monotonic() - t0, "load_before": before, "load_after": load(),
                           **step_time(out, args.skip, 2 * args.per_node)}
                    runs.append(run)
                    print(f"  round {rnd} {rate:>7} {mode:>9}: {run['step_seconds'] * 1e3:7.1f} ms/step "
                          f"(exit {code}, {run['seconds']:.0f} s, load {before['loadavg'][0]:.1f})", flush=True)
    summary = summarize(runs, args.rates, os.cpu_count() or 1)
    ok = report(summary)
    out = args.out
    write_results(out, runs, indent=2,
                  command=f"python benchmarks/emulate_train.py --rates {' '.join(args.rates)} --steps {args.steps} "
                          f"--skip {args.skip} --rounds {args.rounds} --model {args.model} --per-node {args.per_node}",
                  description=__doc__.splitlines()[0], cores=os.cpu_count(), load_at_start=started,
                  load_at_end=load(), all_within_10pct=ok, summary=summary, rescored=False)
    print(f"{'PASS' if ok else 'FAIL'}; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
