"""Seconds from a failure to the error every survivor raises, on gloo and on gradwire.

Scenarios (group timeout 10 s unless stated):
- a peer dies mid-training (``os._exit`` or SIGKILL) under plain DDP (no comm
  hook: DDP's reducer consumes the backend's future in C++), or in a loop of
  async all_reduces waited on through ``get_future().wait()``; 2 and 4 ranks;
- a peer stalls (alive, silent) past the group timeout;
- a 64 MiB all_reduce on ``bandwidth=1mbit`` (minutes modelled) against the
  10 s group timeout, blocking and async; ``work.wait(timeout=5 s)`` on it;
  the same in virtual time (wall seconds to the error, and simulated seconds).

Writes benchmarks/results/failure_timing.json.

    python benchmarks/failure_timing.py
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import queue as queue_mod
import signal
import sys
import time
from pathlib import Path
from typing import Any

from _results import write_results

TIMEOUT_S = 10.0


def _flush(q: Any, item: tuple) -> None:
    q.put(item)
    q.close()
    q.join_thread()


def _train(rank: int, world: int, port: int, q: Any, backend: str, how: str, path: str) -> None:
    """Train; the last rank fails at step 3; the others report what they raised and when."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if backend == "gradwire":
        import gradwire

        gradwire.configure("10gbe")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    if path == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

        def step() -> None:
            ddp(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
    else:
        buf = torch.ones(1 << 14)

        def step() -> None:
            dist.all_reduce(buf, async_op=True).get_future().wait()

    result: dict = {"raised": None}
    for i in range(400):
        if i == 3 and rank == world - 1:
            _flush(q, (rank, "died", time.time()))
            if how == "exit":
                os._exit(3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(TIMEOUT_S + 60)
            os._exit(0)
        try:
            step()
        except Exception as exc:  # noqa: BLE001
            result = {"raised": type(exc).__name__, "message": str(exc)[:200], "at": time.time()}
            break
        time.sleep(0.01)
    _flush(q, (rank, "result", result))
    os._exit(0)


def _dead_peer(backend: str, world: int, how: str, path: str) -> dict:
    import torch.multiprocessing as mp

    from gradwire.launch import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_train, args=(r, world, port, q, backend, how, path), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    died, results = None, {}
    deadline = time.monotonic() + 120
    while len(results) < world - 1 and time.monotonic() < deadline:
        try:
            rank, kind, value = q.get(timeout=0.2)
        except queue_mod.Empty:
            continue
        if kind == "died":
            died = value
        else:
            results[rank] = value
    for p in procs:
        p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    codes = [p.exitcode for p in procs[:-1]]
    raised = [r for r in results.values() if r.get("raised")]
    return {"backend": backend, "world": world, "how": how, "path": path,
            "survivors_raising": len(raised), "survivors": world - 1,
            "seconds_to_error": [round(r["at"] - died, 2) for r in raised] if died else None,
            "errors": sorted({r["raised"] for r in raised}), "exit_codes": codes,
            "first_message": raised[0]["message"] if raised else None}


def _timeouts(rank: int, world: int, net: str) -> dict:
    import torch
    import torch.distributed as dist

    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    big = torch.ones((64 << 20) // 4)
    out = {}
    for name, fn in (("blocking", lambda: dist.all_reduce(big)),
                     ("async_wait", lambda: dist.all_reduce(big, async_op=True).wait()),
                     ("wait_timeout_5s", lambda: dist.all_reduce(big, async_op=True).wait(
                         timeout=datetime.timedelta(seconds=5)))):
        wall, sim = time.perf_counter(), gradwire.clock()
        try:
            fn()
            err = None
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {exc}"
        out[name] = {"wall_s": round(time.perf_counter() - wall, 2), "simulated_s": round(gradwire.clock() - sim, 2),
                     "error": err}
        if name == "blocking":
            out["model_s"] = gradwire.stats().as_dict()["all_reduce"]["model_seconds"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "failure_timing.json")
    args = p.parse_args()
    from gradwire.launch import spawn

    rows = []
    for world in (2, 4):
        for how, path in (("exit", "ddp"), ("kill", "ddp"), ("stall", "ddp"), ("exit", "future")):
            for backend in ("gloo", "gradwire"):
                row = _dead_peer(backend, world, how, path)
                rows.append(row)
                print(f"{backend} n={world} {how:5s} {path:6s}: {row['survivors_raising']}/{row['survivors']} raised "
                      f"{row['errors']} after {row['seconds_to_error']} s; exit codes {row['exit_codes']}", flush=True)
    timeouts = {}
    for clock in ("realtime", "virtual"):
        net = "bandwidth=1mbit,latency=1ms" + (",clock=virtual" if clock == "virtual" else "")
        timeouts[clock] = spawn(_timeouts, 2, (net,), timeout=300)[0]
        print(clock, json.dumps(timeouts[clock], indent=1), flush=True)
    write_results(args.out, rows, group_timeout_s=TIMEOUT_S, timeouts_64MiB_1mbit=timeouts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
