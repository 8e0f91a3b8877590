"""Rank functions of the simulated clock's tests (spawned; they return plain data)."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from gradwire.device import DEVICES, op_seconds

#: a ring all_reduce of 4 MiB on 100 Mbit/s between 2 ranks takes about 0.35 s
NET = "bandwidth=100mbit,latency=1ms,protocol=none,clock=sim,device=a100"
ELEMENTS = 1 << 20


def _init(rank: int, world: int, net: str, timeout: float = 60.0) -> None:
    import gradwire

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))


def _compute(n: int, a: torch.Tensor | None = None) -> float:
    """n 512x512 fp32 matmuls; returns what the a100 roofline charges for them."""
    a = torch.randn(512, 512) if a is None else a
    for _ in range(n):
        a @ a
    flops, nbytes = 2 * 512 ** 3, 3 * 512 * 512 * 4
    return n * op_seconds(DEVICES["a100"], flops, nbytes, False)


def overlap(rank: int, world: int, matmuls: int) -> dict:
    """An async all_reduce, compute, then wait: the clock reads max(compute, comm), not their sum."""
    import gradwire

    _init(rank, world, NET)
    t = torch.ones(ELEMENTS)
    a = torch.randn(512, 512)
    dist.barrier()
    t0 = gradwire.clock()
    work = dist.all_reduce(t, async_op=True)
    c0 = gradwire.clock()
    compute = _compute(matmuls, a)
    computed = gradwire.clock() - c0
    work.wait()
    total = gradwire.clock() - t0
    model = gradwire.stats().as_dict()["all_reduce"]["model_seconds"]
    dist.destroy_process_group()
    return {"total": total, "computed": computed, "compute": compute, "model": model, "value": t[0].item()}


def late_peer(rank: int, world: int, matmuls: int) -> dict:
    """Rank 1 computes before a blocking all_reduce: the op starts when rank 1 issues it, on both ranks."""
    import gradwire

    _init(rank, world, NET)
    t = torch.ones(ELEMENTS)
    dist.barrier()
    t0 = gradwire.clock()
    if rank == 1:
        _compute(matmuls)
    late = gradwire.clock() - t0
    dist.all_reduce(t)
    total = gradwire.clock() - t0
    model = gradwire.stats().as_dict()["all_reduce"]["model_seconds"]
    dist.destroy_process_group()
    return {"late": late, "total": total, "model": model}


def train(rank: int, world: int, net: str, strategy: str, steps: int) -> dict:
    """A short training of the bundled CNN; its per-step times on the simulated clock."""
    from gradwire.train.loop import TrainConfig, train_worker

    result = train_worker(rank, world, TrainConfig(strategy=strategy, net=net, model="cnn", epochs=1,
                                                     max_steps=steps))
    return {"steps": result.step_seconds, "exposed": result.step_exposed, "checksum": result.param_checksum}


def own_timers(rank: int, world: int, matmuls: int) -> dict:
    """A script's own time.perf_counter() and time.time() around its compute (GRADWIRE_SIM_TIME=1)."""
    import threading
    import time

    _init(rank, world, "local,clock=sim,device=a100")
    a = torch.randn(512, 512)
    p0, w0 = time.perf_counter(), time.time()
    priced = _compute(matmuls, a)
    seen = {"perf": time.perf_counter() - p0, "time": time.time() - w0, "priced": priced}
    from gradwire.backend.simclock import _REAL_PERF_COUNTER

    other: list[float] = []
    thread = threading.Thread(target=lambda: other.append(abs(time.perf_counter() - _REAL_PERF_COUNTER())))
    thread.start()
    thread.join()
    seen["other_thread_is_real"] = other[0] < 0.01
    dist.destroy_process_group()
    return seen


def _chained(fut: torch.futures.Future, late: bool) -> torch.futures.Future:
    """``fut``, once done when ``late``: its callbacks then run at once on this thread (a fast host's case)."""
    while late and not fut.done():
        time.sleep(0.001)
    return fut


def callback_wait(rank: int, world: int, matmuls: int, late: bool = False) -> dict:
    """A callback issues a collective and waits for it on its future, then computes (PyTorch's PowerSGD hook)."""
    import gradwire

    _init(rank, world, NET)
    first, second = torch.ones(ELEMENTS), torch.ones(ELEMENTS)
    a = torch.randn(512, 512)
    dist.barrier()
    t0 = gradwire.clock()
    seen: dict = {}

    def then(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()
        seen["issued"] = gradwire.clock() - t0
        dist.all_reduce(second, async_op=True).get_future().wait()
        seen["waited"] = gradwire.clock() - t0
        seen["priced"] = _compute(matmuls, a)
        seen["computed"] = gradwire.clock() - t0
        return second

    _chained(dist.all_reduce(first, async_op=True).get_future(), late).then(then).wait()
    seen["value"] = second[0].item()
    dist.destroy_process_group()
    return seen


def chained_hooks(rank: int, world: int) -> dict:
    """Two buckets through ``one_bucket_at_a_time`` of a hook whose future is a ``then`` of its all_reduce's
    (PyTorch's hooks return such futures): when each hook starts, from the barrier. The second bucket comes
    once the first exchange really ended (as when this host is fast): its hook runs at once, in this thread."""
    import gradwire
    from gradwire.exchange.futures import one_bucket_at_a_time

    _init(rank, world, NET)
    starts: list[float] = []

    def hook(state: object, bucket: torch.Tensor) -> torch.futures.Future:
        starts.append(gradwire.clock())
        return dist.all_reduce(bucket, async_op=True).get_future().then(lambda f: f.value()[0])

    run = one_bucket_at_a_time(hook)
    first, second = torch.ones(ELEMENTS), torch.ones(ELEMENTS)
    dist.barrier()
    t0 = gradwire.clock()
    run(None, first).wait()
    run(None, second).wait()
    seen = {"starts": [s - t0 for s in starts], "value": second[0].item()}
    dist.destroy_process_group()
    return seen


def callback_wait_fails(rank: int, world: int, late: bool) -> dict:
    """A callback waits for a collective that the simulated network finishes only past the group's timeout."""
    _init(rank, world, NET, timeout=0.2)
    small, large = torch.ones(1), torch.ones(ELEMENTS)  # the large one needs about 0.34 s
    seen: dict = {}

    def then(fut: torch.futures.Future) -> None:
        fut.value()
        try:
            dist.all_reduce(large, async_op=True).get_future().wait()
        except Exception as exc:  # noqa: BLE001 - what the callback sees is the result
            seen["error"] = type(exc).__name__
            seen["message"] = str(exc)

    _chained(dist.all_reduce(small, async_op=True).get_future(), late).then(then).wait()
    dist.destroy_process_group()
    return seen
