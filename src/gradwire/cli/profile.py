"""`gradwire profile --net SPEC -- CMD ...`: run a job under the simulated network.

The job runs unchanged: every ``init_process_group`` in it uses the
``gradwire`` backend with ``SPEC`` (see gradwire.profile.bootstrap). Each rank
writes its counters on exit; this command prints the breakdown and writes a
merged Chrome trace of all ranks. With ``--ops`` every op of a window of
optimizer steps is timed on the device the ranks ran on, and the folder's
``ops/<DEVICE>.json`` is what ``device=profile:DIR`` replays on the simulated
clock (gradwire.profile.ops, gradwire.device.recorded).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradwire.cli._args import command_after_dashes, net_spec, output_dir, positive_int

if TYPE_CHECKING:
    from gradwire.net import NetSpec


def add_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="run a training command under a simulated network and break down its communication",
                       description=__doc__.splitlines()[0])
    p.add_argument("--net", type=net_spec, default="loopback", help="network spec or preset (default: loopback)")
    p.add_argument("--out", type=output_dir, default=None,
                   help="folder for per-rank results and trace.json, created if missing (default: a temp folder)")
    p.add_argument("--torch-profiler", action="store_true", help="also record torch.profiler events into the trace")
    p.add_argument("--ops", action="store_true",
                   help="time every op of --ops-steps optimizer steps on this device: device=profile:DIR replays them")
    p.add_argument("--ops-steps", type=positive_int(1), default=5, metavar="N",
                   help="optimizer steps timed op by op with --ops (default 5): every other step after the first two; "
                        "the untimed steps between them give the recorded step")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gradwire._files import keep_previous
    from gradwire.profile.bootstrap import child_env

    cmd = command_after_dashes(args.cmd, "gradwire profile --net SPEC -- python train.py ...")
    spec = args.net
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gradwire-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    keep_previous(out, ("rank*.json", "trace*.json", "profile.json"))  # an earlier profile is kept, not lost
    code = subprocess.call(cmd, env=child_env(spec.to_string(), out, args.torch_profiler,
                                              ops=args.ops_steps if args.ops else 0))
    results = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if not results:
        print(f"gradwire profile: the command wrote no results (exit code {code}); "
              "did it call torch.distributed.init_process_group?", file=sys.stderr)
        return code or 1
    report(results, spec)
    traces = sorted(out.glob("trace.rank*.json"))
    if traces:
        events: list = []
        for t in traces:
            events += json.loads(t.read_text()).get("traceEvents", [])
        (out / "trace.json").write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        print(f"trace: {out / 'trace.json'} (open in https://ui.perfetto.dev or chrome://tracing)")
    (out / "profile.json").write_text(json.dumps({"net": spec.to_string(), "ranks": results}, indent=2))
    print(f"results: {out / 'profile.json'}")
    if args.ops:
        code = _write_ops(results, spec, out) or code
    steps = min(len(r.get("steps", [])) for r in results)
    if steps:  # per-step records of a DDP job (gradwire.profile.steps): a step is an optimizer step
        print(f"{steps} training steps recorded per rank (optimizer steps{_micro_steps(results)}); "
              f"larger clusters: gradwire predict --profile {out}")
    return code


def _write_ops(results: list[dict], spec: NetSpec, out: Path) -> int:
    """Merge the ranks' op records into ``out/ops/<DEVICE>.json``; 1 (and one line) if there is nothing to merge."""
    from gradwire.device.recorded import write_recording
    from gradwire.profile.ops import merge

    try:
        record = merge(results, spec.to_string())
    except ValueError as exc:
        print(f"gradwire profile --ops: {exc}", file=sys.stderr)
        return 1
    path = write_recording(out, record["device"]["name"], record)
    note = "" if record["clean_steps"] else " (no untimed step between timed ones: the step includes the timing's cost)"
    print(f"ops: {len(record['ops'])} ops over {record['steps_recorded']} steps on {record['device']['description']}, "
          f"step {record['step_seconds'] * 1e3:.2f} ms, its compute {record['compute_seconds'] * 1e3:.2f} ms{note}: "
          f"{path}; replay with --net ...,clock=sim,device=profile:{out}")
    return 0


def _micro_steps(results: list[dict]) -> str:
    """`, N micro-steps each` when the steps accumulated gradients over N backward passes."""
    from collections import Counter

    counts = Counter(s.get("micro_steps", 1) for r in results for s in r.get("steps", []))
    if not counts or set(counts) == {1}:
        return ""
    (common, _), = counts.most_common(1)
    return f", {common} micro-steps each" + ("" if len(counts) == 1 else " (most; some " + ", ".join(
        str(c) for c in sorted(counts) if c != common) + ")")


def report(results: list[dict], spec: NetSpec) -> None:
    """Print the per-op table (rank 0) and compute/exposed shares of every rank."""
    from rich.console import Console
    from rich.table import Table

    from gradwire.net.units import human_size

    console = Console(width=max(Console().width, 120), emoji=False)  # a pipe's 80 columns cut op names short
    r0 = min(results, key=lambda r: r["rank"])
    table = Table(title=f"communication of rank {r0['rank']} on {spec.to_string()}")
    for col in ("op", "calls", "payload", "on the wire", "modelled (s)", "inner (s)", "exposed (s)"):
        table.add_column(col, justify="right")
    for op, s in r0["ops"].items():
        table.add_row(op, f"{s['calls']:.0f}", human_size(s["payload_bytes"], 2), human_size(s["wire_bytes"], 2),
                      f"{s['model_seconds']:.3f}", f"{s['inner_seconds']:.3f}", f"{s.get('exposed_seconds', 0.0):.3f}")
    console.print(table)
    shares = Table(title="communication in flight, and the part the training thread waited for (exposed)")
    for col in ("rank", "wall (s)", "communication (s)", "exposed (s)", "hidden (s)", "exposed share of wall"):
        shares.add_column(col, justify="right")
    for r in sorted(results, key=lambda r: r["rank"]):
        share = r["exposed_seconds"] / r["wall_seconds"] if r["wall_seconds"] else 0.0
        shares.add_row(str(r["rank"]), f"{r['wall_seconds']:.3f}", f"{r['comm_seconds']:.3f}",
                       f"{r['exposed_seconds']:.3f}", f"{r['hidden_seconds']:.3f}", f"{share:.0%}")
    console.print(shares)
    if spec.events:  # a network that changes: how the steps spread, beside their mean
        for r in sorted(results, key=lambda r: r["rank"]):
            times = sorted(step["step"] for step in r.get("steps", []))
            if times:
                def at(q: float) -> float:
                    return times[min(len(times) - 1, int(q * (len(times) - 1) + 0.5))] * 1e3

                console.print(f"rank {r['rank']}: {len(times)} steps, mean {sum(times) / len(times) * 1e3:.1f} ms, "
                              f"p50 {at(0.5):.1f} / p95 {at(0.95):.1f} / max {at(1.0):.1f} ms", highlight=False)

