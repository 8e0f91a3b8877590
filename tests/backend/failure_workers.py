"""Rank functions for the failure tests, and a launcher that lets one rank die on purpose.

``gradwire.launch.spawn`` treats any rank that dies as the group's failure. Here
a death is the experiment: :func:`run_with_victim` collects what the survivors
report and kills whatever is left at the deadline.
"""
from __future__ import annotations

import datetime
import os
import queue as queue_mod
import signal
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradwire.launch import free_port, rank_context


def _entry(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple, q: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    try:
        value = fn(rank, world, q, *args)
    except BaseException as exc:  # noqa: BLE001 - the parent must see it
        value = {"harness_error": f"{type(exc).__name__}: {exc}"}
    _send_and_flush(q, (rank, "result", value))
    os._exit(0)  # the result is delivered; skip a teardown that may abort (see gradwire.launch)


def run_with_victim(fn: Callable[..., Any], world: int, args: tuple = (), timeout: float = 60.0) -> dict:
    """Run ``fn(rank, world, queue, *args)`` on ``world`` ranks; one of them is expected to die.

    Returns ``{"results": {rank: value}, "died": unix time the victim posted, "exitcodes": [...]}``.
    """
    ctx = rank_context()
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    died = None
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world - 1 and time.monotonic() < deadline:
            try:
                rank, kind, value = q.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if kind == "died":
                died = value
            else:
                results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=2)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return {"results": results, "died": died, "exitcodes": [p.exitcode for p in procs]}


def _send_and_flush(q: Any, item: tuple) -> None:
    """Put ``item`` and wait until it left this process (``os._exit`` would drop the queue's buffer)."""
    q.put(item)
    q.close()
    q.join_thread()


def _die(q: Any, rank: int, how: str, stall_s: float) -> None:
    _send_and_flush(q, (rank, "died", time.time()))
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(stall_s)  # "stall": alive, silent, past the group timeout
    os._exit(0)


def train_until_peer_fails(rank: int, world: int, q: Any, how: str, path: str, timeout_s: float,
                           net: str = "10gbe") -> dict:
    """Train until the last rank dies (or stalls) at step 3; report what this rank raised and when.

    ``path``: ``ddp`` (DDP's built-in reducer: no comm hook), ``future`` (async all_reduce,
    ``get_future().wait()``), ``wait`` (async all_reduce, ``Work.wait()``).
    """
    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    step_fn: Callable[[], None]
    if path == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

        def step_fn() -> None:
            ddp(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
    else:
        buf = torch.ones(1 << 14)

        def step_fn() -> None:
            work = dist.all_reduce(buf, async_op=True)
            work.get_future().wait() if path == "future" else work.wait()

    for step in range(400):
        if step == 3 and rank == world - 1:
            _die(q, rank, how, stall_s=timeout_s + 60)
        try:
            step_fn()
        except Exception as exc:  # noqa: BLE001 - what a survivor sees is the result
            return {"raised": type(exc).__name__, "runtime_error": isinstance(exc, RuntimeError),
                    "message": str(exc)[:400], "at": time.time(), "step": step}
        time.sleep(0.01)
    return {"raised": None, "step": 400}


def timeouts(rank: int, world: int, net: str, timeout_s: float, slow_bytes: int, wait_bytes: int,
             wait_s: float) -> dict:
    """An op the network needs longer for than the group timeout; a wait(timeout=...) shorter than its op."""
    import gradwire

    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    out: dict = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        wall, sim = time.perf_counter(), gradwire.clock()
        try:
            fn()
            err = None
        except Exception as exc:  # noqa: BLE001
            err = (type(exc).__name__, isinstance(exc, dist.DistBackendError), str(exc))
        out[name] = {"error": err, "wall": time.perf_counter() - wall, "sim": gradwire.clock() - sim}

    small = torch.ones(wait_bytes // 4) * (rank + 1)
    work = dist.all_reduce(small, async_op=True)
    attempt("wait_short", lambda: work.wait(timeout=datetime.timedelta(seconds=wait_s)))
    attempt("wait_again", lambda: work.wait())
    out["value"] = small[:2].tolist()
    # a timed-out op still holds the simulated link, so the later ones queue behind it
    big = torch.ones(slow_bytes // 4)
    attempt("blocking", lambda: dist.all_reduce(big))
    attempt("async_wait", lambda: dist.all_reduce(big, async_op=True).wait())
    attempt("future", lambda: dist.all_reduce(big, async_op=True).get_future().wait())
    out["model"] = {op: s["model_seconds"] / max(s["calls"], 1) for op, s in gradwire.stats().as_dict().items()}
    return out
