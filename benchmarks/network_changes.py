"""Networks that change, on the realtime backend: each op against the model of the conditions it met.

Three measurements (2 ranks each, the gradwire backend on this host):

1. ``schedule``: blocking all_reduces of ``--bytes`` back to back on
   ``1 Gbit/s -> 100 Mbit/s -> 1 Gbit/s`` (a drop from 3 s to 6 s after the
   group's creation). Each op's measured seconds against
   ``NetworkModel.cost(start=...)`` at the instant it started: the model of
   its condition, and for an op across a change the piecewise price.
   Judged: every op within 5% (plus 2 ms for the host's own start of the op).
2. ``outage``: a small DDP training, 30 s timeout, on 1 Gbit/s with a 5 s
   outage at 3 s; the same training without it. Judged: the step that meets
   the outage takes about 5 s longer (within 10% of the outage's remainder),
   training goes on, and the parameters equal the run without the outage,
   bit for bit. Then the same outage with a 3 s timeout: every rank raises
   within 1 s of its op's timeout, the error naming the outage.
3. ``shared``: two jobs on one named link (``link=NAME``) at 100 Mbit/s:
   each op's seconds alone and while both send. Judged: alone within 10% of
   the whole link's price, together within 10% of twice it.

Writes benchmarks/results/network_changes.json. Example::

    python benchmarks/network_changes.py
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _results import write_results

OUT = Path(__file__).parent / "results" / "network_changes.json"
SCHEDULE = "bandwidth=1gbit,latency=100us,drop=100mbit:for=3s:at=3s"
OUTAGE = "bandwidth=1gbit,latency=100us,outage=5s:at=3s"


def _init(rank: int, world: int, net: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    import gradwire

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))


def ops(rank: int, world: int, net: str, nbytes: int, count: int) -> list[tuple[float, float]]:
    """``count`` blocking all_reduces: (start since the group's creation, seconds) of each."""
    import torch
    import torch.distributed as dist

    import gradwire.backend as backend

    _init(rank, world, net, 60)
    buf = torch.ones(nbytes // 4)
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        out.append((t0 - backend._origin, time.perf_counter() - t0))
    return out


def training(rank: int, world: int, net: str, steps: int, timeout_s: float) -> dict[str, Any]:
    """DDP steps of a small MLP with 0.1 s of other work each: each step's start and seconds, the parameters."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire.backend as backend

    _init(rank, world, net, timeout_s)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(rank)
    starts, times = [], []
    try:
        model = DDP(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            x = torch.randn(16, 64, generator=gen)
            t0 = time.perf_counter()
            starts.append(t0 - backend._origin)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x[:, :8]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            time.sleep(0.1)
    except Exception as exc:  # noqa: BLE001 - what every rank raised, and when, is the measurement
        failed = [e for e in backend.events() if e.error]
        issued = failed[0].issued if failed else time.perf_counter()
        return {"error": f"{type(exc).__name__}: {exc}", "raised_after_issue": time.perf_counter() - issued,
                "starts": starts, "times": times}
    return {"starts": starts, "times": times, "checksum": float(sum(p.detach().double().sum() for p in
                                                                      model.parameters()))}


def _count(net: str, nbytes: int, seconds: float) -> int:
    """Ops the model fits into ``seconds`` (every rank runs the same number), 2 ms of host time each."""
    from gradwire.net import NetworkModel

    model, t, n = NetworkModel(net, 2), 0.0, 0
    while t < seconds:
        t += model.cost("all_reduce", nbytes, start=t).seconds + 0.002
        n += 1
    return n


def schedule(nbytes: int) -> dict[str, Any]:
    from gradwire.launch import spawn
    from gradwire.net import NetworkModel

    got = spawn(ops, 2, (SCHEDULE, nbytes, _count(SCHEDULE, nbytes, 9.0)), timeout=300)
    model = NetworkModel(SCHEDULE, 2)
    rows = []
    for rank, series in enumerate(got):
        for start, seconds in series[1:]:  # the first op also waits for the peer's first call
            expected = model.cost("all_reduce", nbytes, start=start).seconds
            cond = model.condition(start)[0]
            crossing = start + expected > model.condition(start)[1]
            rows.append({"rank": rank, "start_s": start, "measured_s": seconds, "model_s": expected,
                         "error": seconds / expected - 1, "crossing": crossing,
                         "bandwidth": cond.bandwidth or model.spec.bandwidth})
    worst = max(rows, key=lambda r: abs(r["measured_s"] - r["model_s"]) - 0.002)
    ok = all(r["model_s"] * 0.95 - 0.002 <= r["measured_s"] <= r["model_s"] * 1.05 + 0.002 for r in rows)
    return {"net": SCHEDULE, "bytes": nbytes, "ops": len(rows), "crossing_ops": sum(r["crossing"] for r in rows),
            "worst_error": worst["error"], "worst": worst, "passed": ok, "rows": rows}


def outage() -> dict[str, Any]:
    from gradwire.launch import spawn

    base = OUTAGE.split(",outage")[0]
    steps = 90
    plain = spawn(training, 2, (base, steps, 30.0), timeout=300)
    held = spawn(training, 2, (OUTAGE, steps, 30.0), timeout=300)
    out: dict[str, Any] = {"net": OUTAGE, "steps": steps, "ranks": []}
    passed = True
    for a, b in zip(plain, held):
        met = [(s, t) for s, t in zip(b["starts"], b["times"]) if s < 8.0 and s + t > 3.0]
        if not met or "error" in b:
            passed = False
            out["ranks"].append({"error": b.get("error", "the training met no outage"), "starts": b["starts"][:3]})
            continue
        start, took = max(met, key=lambda m: m[1])
        remainder = 8.0 - max(start, 3.0)
        same = a["checksum"] == b["checksum"]
        median = statistics.median(b["times"])
        passed &= same and abs(took - median - remainder) <= 0.1 * remainder
        out["ranks"].append({"step_start_s": start, "step_s": took, "outage_left_s": remainder,
                             "median_step_s": median, "same_parameters": same})
    short = spawn(training, 2, (OUTAGE, steps, 3.0), timeout=300)
    out["short_timeout"] = [{"error": r.get("error", "")[:300], "raised_after_issue_s": r.get("raised_after_issue")}
                            for r in short]
    passed &= all("down from" in r.get("error", "") and 3.0 - 0.05 <= r["raised_after_issue"] <= 4.0 for r in short)
    out["passed"] = passed
    return out


def shared(nbytes: int) -> dict[str, Any]:
    from gradwire.launch import spawn
    from gradwire.net import NetworkModel

    net = f"bandwidth=100mbit,latency=1ms,link=bench-{uuid.uuid4().hex[:8]}"
    alone = NetworkModel(net, 2).cost("all_reduce", nbytes).seconds
    solo = [s for _, s in spawn(ops, 2, (net, nbytes, 10), timeout=300)[0][1:]]
    both: list[list[float]] = []

    def job() -> None:
        both.append([s for _, s in spawn(ops, 2, (net, nbytes, 20), timeout=300)[0]])

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    together = [statistics.median(series[3:-3]) for series in both]
    passed = abs(statistics.median(solo) / alone - 1) <= 0.1 and all(abs(t / (2 * alone) - 1) <= 0.1
                                                                      for t in together)
    return {"net": net, "bytes": nbytes, "model_alone_s": alone, "alone_median_s": statistics.median(solo),
            "together_median_s": together, "share": [alone / t for t in together], "passed": passed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=4 << 20, help="all_reduce size of the schedule check")
    p.add_argument("--only", choices=["schedule", "outage", "shared"], action="append")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    parts = args.only or ["schedule", "outage", "shared"]
    result: dict[str, Any] = {}
    if "schedule" in parts:
        result["schedule"] = schedule(args.bytes)
        s = result["schedule"]
        print(f"schedule: {s['ops']} ops ({s['crossing_ops']} across a change), worst {s['worst_error']:+.1%} "
              f"-> {'pass' if s['passed'] else 'FAIL'}")
    if "outage" in parts:
        result["outage"] = o = outage()
        print(f"outage: {o['ranks']}; short timeout {o['short_timeout']} -> {'pass' if o['passed'] else 'FAIL'}")
    if "shared" in parts:
        result["shared"] = sh = shared(1 << 20)
        print(f"shared link: alone {sh['alone_median_s']:.3f} s (model {sh['model_alone_s']:.3f}), together "
              f"{sh['together_median_s']} -> share {sh['share']} -> {'pass' if sh['passed'] else 'FAIL'}")
    rows = result.get("schedule", {}).pop("rows", [])
    write_results(args.out, rows, **result)


if __name__ == "__main__":
    main()
