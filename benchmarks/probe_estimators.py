"""Which figure of a probe's back-to-back all_reduces is the link: on real packets, 2 ranks, tc-shaped.

``auto`` (exchange/chooser.py) fits its link from all_reduces of 1 element and of a large
tensor, issued back to back. Each rank times each op from issue to completion, and
the ranks average what they read. This measures, per probe, the estimate of the bus
bandwidth that each way of reading the large ops gives, against the shaped rate:

- ``first``: the first large op alone (it leaves partly from the shaper's token bucket);
- ``fastest_of_two``: the faster of the first two (``auto`` before this benchmark);
- ``mean_after_first``: the mean of ops 2-4; ``median_after_first``: their median (``auto`` now);
  ``fastest_after_first``: the fastest of them (a busy host only adds time to an op).

Each probe follows 50 ms of idle (the gap between training steps, which refills the
bucket). Alpha is the faster of two timed 1-element all_reduces, as in ``auto``. The
ranks run under ``gradwire emulate`` (network namespaces, veth, tbf), 2 nodes of one rank.
Needs root. A row per rate and size: the estimators' 10th, 50th and 90th percentile of
the relative error over the probes (the shaped rate counts Ethernet/IP/TCP headers: the
payload a link of R carries is about 0.956 R).

    sudo python benchmarks/probe_estimators.py                       # 100mbit,1gbit x 16384,131072 elements, 30 probes
    sudo python benchmarks/probe_estimators.py --rates 1gbit --sizes 262144 --busy 2   # two cores kept busy
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

from _results import ROOT, write_results

ESTIMATORS = ("first", "fastest_of_two", "mean_after_first", "median_after_first", "fastest_after_first")


def _job(numel: int, probes: int, out: str) -> None:
    """One rank of the emulated job: ``probes`` probes, every rank's times gathered to rank 0."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    small, large = torch.zeros(1), torch.zeros(numel)
    dist.all_reduce(large)  # a backend's first op of a size sets up its buffers
    rows = []
    for _ in range(probes):
        time.sleep(0.05)
        times = []
        for x in [small] * 3 + [large] * 4:
            start = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - start)
        rows.append(times)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, rows)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(every))
    dist.destroy_process_group()


def _large(times: list[float], how: str) -> float:
    ops = times[3:]
    return {"first": ops[0], "fastest_of_two": min(ops[:2]), "mean_after_first": statistics.fmean(ops[1:]),
            "median_after_first": statistics.median(ops[1:]), "fastest_after_first": min(ops[1:])}[how]


def errors(ranks: list[list[list[float]]], numel: int, rate_bit_s: float) -> dict[str, list[float]]:
    """Per estimator, each probe's relative error of the bus bandwidth (ranks' times averaged, as auto agrees)."""
    busbytes = numel * 4 * 2 * (len(ranks) - 1) / len(ranks)
    out: dict[str, list[float]] = {how: [] for how in ESTIMATORS}
    for probe in range(len(ranks[0])):
        alpha = statistics.fmean(min(r[probe][1], r[probe][2]) for r in ranks)
        for how in ESTIMATORS:
            large = statistics.fmean(_large(r[probe], how) for r in ranks)
            out[how].append(busbytes * 8 / (large - alpha) / rate_bit_s - 1 if large > alpha else float("inf"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--sizes", default="16384,131072", help="elements of the large all_reduce (fp32)")
    p.add_argument("--probes", type=int, default=30)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/probe_estimators.json"))
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="N processes spinning on the cores meanwhile (the host a training shares the probe with)")
    p.add_argument("--job", nargs=3, metavar=("NUMEL", "PROBES", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.busy < 0:
        p.error(f"--busy takes 0 or more processes, got {args.busy}")
    if args.job:
        _job(int(args.job[0]), int(args.job[1]), args.job[2])
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.perf_counter()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        rows = _measure(args, env)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    write_results(args.out, rows, busy=args.busy, wall_s=round(time.perf_counter() - started, 1))


def _measure(args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    from auto_link import _bits

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for rate in args.rates.split(","):
            for numel in (int(n) for n in args.sizes.split(",")):
                out = Path(work) / f"{rate}_{numel}.json"
                subprocess.run([sys.executable, "-m", "gradwire", "emulate", "--net", f"bandwidth={rate}",
                                "--nodes", "2", "--nproc-per-node", "1", "--timeout", "300", "--",
                                str(Path(__file__).resolve()), "--job", str(numel), str(args.probes), str(out)],
                               check=True, env=env, cwd=work, timeout=600, stdout=subprocess.DEVNULL)
                found = errors(json.loads(out.read_text()), numel, _bits(rate))
                row = {"net": f"bandwidth={rate}", "numel": numel, "probes": args.probes}
                for how, errs in found.items():
                    q = statistics.quantiles(errs, n=10)
                    row[how] = {"p10": round(q[0], 3), "p50": round(statistics.median(errs), 3), "p90": round(q[-1], 3)}
                rows.append(row)
                print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()
