"""Rank functions for the backend tests (module level: spawn pickles by name)."""
from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64)
SIZES = (0, 1, 7, 1001)


def _init(rank: int, world: int, backend: str, net: str | None = None, timeout_s: float = 60) -> None:
    if backend == "gradwire":
        import gradwire

        gradwire.configure(net)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))


def _inp(n: int, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    vals = (torch.arange(n) * 3 + rank * 5 + salt) % 7 + 1  # 1..7: exact in every dtype, products stay small
    return vals.to(dtype)


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - compared between backends
        return ("error", type(exc).__name__)


def op_suite(rank: int, world: int, backend: str, net: str | None = None) -> dict:
    """Run every op on every dtype and size; return the results by name."""
    _init(rank, world, backend, net)
    out: dict = {}
    for dtype in DTYPES:
        for n in SIZES:
            key = f"{dtype}-{n}"
            ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
            if n <= 7:
                ops.append(dist.ReduceOp.PRODUCT)
            if dtype == torch.int64:
                ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
            for op in ops:
                t = _inp(n, dtype, rank)
                out[f"all_reduce-{op}-{key}"] = _try(lambda: (dist.all_reduce(t, op=op), t.clone())[1])
            t = _inp(n, dtype, rank)
            out[f"all_reduce_async-{key}"] = _try(lambda: (dist.all_reduce(t, async_op=True).wait(), t.clone())[1])
            t = _inp(n, dtype, rank)
            out[f"broadcast-{key}"] = _try(lambda: (dist.broadcast(t, src=world - 1), t.clone())[1])
            t = _inp(n, dtype, rank)
            out[f"reduce-{key}"] = _try(lambda: (dist.reduce(t, dst=0), t.clone())[1])
            outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
            out[f"all_gather-{key}"] = _try(lambda: (dist.all_gather(outs, _inp(n, dtype, rank)), [o.clone() for o in outs])[1])
            big = torch.zeros(n * world, dtype=dtype)
            out[f"all_gather_into_tensor-{key}"] = _try(lambda: (dist.all_gather_into_tensor(big, _inp(n, dtype, rank)), big.clone())[1])
            r = torch.zeros(n, dtype=dtype)
            ins = [_inp(n, dtype, rank, salt=i) for i in range(world)]
            out[f"reduce_scatter-{key}"] = _try(lambda: (dist.reduce_scatter(r, ins), r.clone())[1])
            r2 = torch.zeros(n, dtype=dtype)
            out[f"reduce_scatter_tensor-{key}"] = _try(
                lambda: (dist.reduce_scatter_tensor(r2, torch.cat(ins)), r2.clone())[1])
            a_in = _inp(n * world, dtype, rank)
            a_out = torch.zeros(n * world, dtype=dtype)
            out[f"all_to_all_single-{key}"] = _try(lambda: (dist.all_to_all_single(a_out, a_in), a_out.clone())[1])
            # uneven splits: rank r sends (i + 1) * (n % 3 + 1) elements to rank i
            unit = n % 3 + 1
            in_splits = [(i + 1) * unit for i in range(world)]
            out_splits = [(rank + 1) * unit] * world
            u_in = _inp(sum(in_splits), dtype, rank)
            u_out = torch.zeros(sum(out_splits), dtype=dtype)
            out[f"all_to_all_uneven-{key}"] = _try(
                lambda: (dist.all_to_all_single(u_out, u_in, out_splits, in_splits), u_out.clone())[1])
            g_list = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == 0 else None
            out[f"gather-{key}"] = _try(
                lambda: (dist.gather(_inp(n, dtype, rank), g_list, dst=0), [g.clone() for g in g_list or []])[1])
            s_out = torch.zeros(n, dtype=dtype)
            s_list = [_inp(n, dtype, 0, salt=i) for i in range(world)] if rank == 0 else None
            out[f"scatter-{key}"] = _try(lambda: (dist.scatter(s_out, s_list, src=0), s_out.clone())[1])
            # send/recv around a ring
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            got = torch.zeros(n, dtype=dtype)
            def ring():
                reqs = [dist.isend(_inp(n, dtype, rank), nxt), dist.irecv(got, prv)]
                for q in reqs:
                    q.wait()
                return got.clone()
            out[f"sendrecv-{key}"] = _try(ring)
    l_in = [_inp(3, torch.float32, rank, salt=i) for i in range(world)]
    l_out = [torch.zeros(3) for _ in range(world)]
    out["all_to_all_list"] = _try(lambda: (dist.all_to_all(l_out, l_in), [t.clone() for t in l_out])[1])
    out["barrier"] = _try(lambda: (dist.barrier(), "ok")[1])
    sub = dist.new_group([0, 1])
    if rank < 2:
        t = _inp(5, torch.float32, rank)
        dist.all_reduce(t, group=sub)
        out["subgroup"] = t
    return out


def avg_allreduce(rank: int, world: int) -> list:
    _init(rank, world, "gradwire", "loopback")
    t = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return t.tolist()


def timed_allreduce(rank: int, world: int, backend: str, net: str | None, nbytes: int, iters: int, warmup: int = 2) -> dict:
    """Median seconds of blocking all_reduce of ``nbytes`` fp32."""
    _init(rank, world, backend, net)
    t = torch.ones(nbytes // 4)
    times = []
    for i in range(warmup + iters):
        dist.barrier() if backend == "gloo" else None
        t0 = time.perf_counter()
        dist.all_reduce(t)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    times.sort()
    result = {"median": times[len(times) // 2], "times": times}
    if backend == "gradwire":
        import gradwire

        result["stats"] = gradwire.stats().as_dict()
    return result


def overlap(rank: int, world: int, net: str, n_ops: int, nbytes: int, compute_s: float) -> dict:
    """Issue n async all_reduces, optionally compute, then wait; return timings."""
    _init(rank, world, "gradwire", net)
    import gradwire

    bufs = [torch.ones(nbytes // 4) for _ in range(n_ops)]
    dist.all_reduce(torch.ones(1))
    t0 = time.perf_counter()
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    issued = time.perf_counter() - t0
    if compute_s:
        end = time.perf_counter() + compute_s
        while time.perf_counter() < end:
            pass
    for w in works:
        w.wait()
    total = time.perf_counter() - t0
    per_op = gradwire.stats().ops["all_reduce"].model_seconds / (n_ops + 1)
    return {"issued": issued, "total": total, "model_per_op": per_op}


def ddp_train(rank: int, world: int, backend: str, net: str | None, steps: int = 5, hook: str | None = None) -> list:
    _init(rank, world, backend, net)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = DDP(model, bucket_cap_mb=0.001)
    if hook is not None:
        ddp.register_comm_hook(None, getattr(default_hooks, hook))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(16, 20, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def die_mid_collective(rank: int, world: int) -> None:
    _init(rank, world, "gradwire", "1gbe", timeout_s=20)
    dist.all_reduce(torch.ones(8))
    if rank == 1:
        os._exit(7)
    dist.all_reduce(torch.ones(1 << 20))
    dist.all_reduce(torch.ones(1 << 20))


def accounting(rank: int, world: int, trace_path: str) -> dict:
    """Stats, reset, event log and trace export on one rank."""
    _init(rank, world, "gradwire", "1gbe")
    import json

    import gradwire

    gradwire.reset_stats()
    t = torch.ones(1 << 18)  # 1 MiB
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    w = dist.all_reduce(t, async_op=True)
    w.get_future().wait()
    s = gradwire.stats()
    path = gradwire.export_trace(f"{trace_path}.{rank}")
    trace = json.loads(path.read_text())
    after = gradwire.stats(reset=True)
    from gradwire.backend import groups

    return {"stats": s.as_dict(), "events": len(gradwire.events()), "trace": trace, "after_reset": after.as_dict(),
            "empty": gradwire.stats().as_dict(), "cuda_inner": [g.cuda_inner for g in groups().values()]}


def unsupported_op(rank: int, world: int) -> str:
    _init(rank, world, "gradwire", "loopback")
    try:
        dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0))
    except NotImplementedError as exc:
        return str(exc)
    return "no error"


def bad_topology(rank: int, world: int) -> str:
    try:
        _init(rank, world, "gradwire", "1gbe,topology=2x4")
    except ValueError as exc:
        return str(exc)
    return "no error"


def cuda_ops(rank: int, world: int) -> dict:
    """The ops DDP and the compression hooks use, on CUDA tensors; which inner backend ran them."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
    _init(rank, world, "gradwire", "10gbe")
    import gradwire

    # a point-to-point op first, on a group of its own: it must not wait for a choice that
    # only a collective can make (the ranks outside the pair would never join it)
    pair = dist.new_group([0, 1])
    hello = torch.full((2,), float(rank), device="cuda")
    if rank == 0:
        dist.send(hello, 1, group=pair)
    elif rank == 1:
        dist.recv(hello, 0, group=pair)
    t = torch.ones(1000, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    b = torch.full((5,), float(rank), device="cuda")
    dist.broadcast(b, src=world - 1)
    rows = torch.empty(world, 4, dtype=torch.uint8, device="cuda")
    dist.all_gather(list(rows.unbind(0)), torch.full((4,), rank, dtype=torch.uint8, device="cuda"))
    send = torch.arange(world, dtype=torch.uint8, device="cuda") + 10 * rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    w = dist.all_reduce(torch.ones(3, device="cuda"), async_op=True)
    w.get_future().wait()
    mine, got = torch.full((6,), float(rank), device="cuda"), torch.empty(6, device="cuda")
    peer = (rank + 1) % world
    first, then = (lambda: dist.send(mine, peer), lambda: dist.recv(got, peer))
    for fn in ((first, then) if rank == 0 else (then, first)):
        fn()
    stats = gradwire.stats().as_dict()
    from gradwire.backend import groups

    return {"all_reduce": t.cpu().tolist()[:3], "broadcast": b.cpu().tolist(), "all_gather": rows.cpu().tolist(),
            "all_to_all": recv.cpu().tolist(), "recv": got.cpu().tolist(), "hello": hello.cpu().tolist(),
            "inner": [str(g.cuda_inner) for g in groups().values()],  # in creation order: default, pair
            "calls": {op: stats[op]["calls"] for op in ("all_reduce", "broadcast", "all_gather", "all_to_all", "send",
                                                        "recv") if op in stats}}


def virtual_sendrecv(rank: int, world: int, net: str, nbytes: int, pause_s: float) -> dict:
    """isend to the next rank, recv from the previous; rank 0 pauses in between.

    Rank 1 posts its recv at once, so rank 0's isend completes for real during rank 0's pause,
    before rank 0 issues its own recv.
    """
    import time

    import gradwire

    _init(rank, world, "gradwire", net)
    send, recv = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    dist.barrier()
    t0 = gradwire.clock()
    req = dist.isend(send, (rank + 1) % world)
    time.sleep(pause_s if rank == 0 else 0.0)
    dist.recv(recv, (rank - 1) % world)
    req.wait()
    elapsed = gradwire.clock() - t0
    stats = gradwire.stats().as_dict()["send"]
    dist.destroy_process_group()
    return {"elapsed": elapsed, "model_per_op": stats["model_seconds"] / stats["calls"]}
