"""The shared benchmark driver: sweep sizes, time each collective, check its output.

Per collective and size, as nccl-tests does: ``-w`` untimed calls, a barrier,
``-n`` timed calls back to back (out-of-place, then in-place), then one more
call on fresh input whose output is compared element by element with the
expected values. The time of a row is the mean over ranks of each rank's
mean time per call; ``#wrong`` is the sum over ranks.

Clock: with the gradwire backend, time is read from :func:`gradwire.clock`,
which is wall time in realtime mode and the simulated clock in sim mode
(``clock=sim``: nothing waits, so a long sweep on a slow simulated network
finishes quickly and still reports the simulated times). On the simulated
clock a collective's time is the network model's, and the arithmetic it
needs (a reducing collective's additions, :meth:`Collective.reduction`) is
priced on the spec's roofline device (:func:`reduction_seconds`) and added:
the backend's own work is never charged, so the row would otherwise hold
the network alone. Added after the transfer, not pipelined with the next
chunk's: an upper bound where a library overlaps the two.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Callable

from gradwire.bench.collectives import COLLECTIVES, Buffers, Collective, RankSetup, check_world
from gradwire.bench.config import DTYPES, BenchConfig

if TYPE_CHECKING:
    from gradwire.net import NetSpec, NetworkModel

__all__ = ["BenchResult", "CORRUPT_ENV", "BenchRow", "reduction_seconds", "run", "run_in_group", "run_rank",
           "under_torchrun"]

#: test-only: a collective name whose checked output each rank corrupts before comparing
CORRUPT_ENV = "GRADWIRE_BENCH_CORRUPT"

OUT_OF_PLACE, IN_PLACE = "out-of-place", "in-place"


@dataclass
class BenchRow:
    """One measured (collective, size, placement)."""

    op: str
    size: int
    """bytes, nccl-tests convention of ``op``"""
    count: int
    """elements in ``size``"""
    dtype: str
    redop: str
    """reduce op, or ``none`` for a collective that does not reduce"""
    root: int
    """root rank, -1 for a collective without one"""
    placement: str
    """``out-of-place`` or ``in-place``"""
    time_us: float | None
    """mean time per call in microseconds; None when the placement does not exist"""
    algbw: float | None
    """size / time in GB/s (1e9 bytes/s, as nccl-tests)"""
    busbw: float | None
    """algbw times the collective's bus factor, GB/s"""
    wrong: int | None
    """elements that differ from the expected output, summed over ranks; None if unchecked"""
    model_us: float | None = None
    """the network model's price of this op and size in microseconds, if a network is modelled"""


@dataclass
class BenchResult:
    """Everything one run measured."""

    config: BenchConfig
    world_size: int
    backend: str
    net: NetSpec | None
    """the network that priced the model column (None: no model column)"""
    simulated: bool
    """whether the backend simulated that network (gradwire) or it only priced rows"""
    ranks: list[str] = field(default_factory=list)
    """one line per rank: host, pid, device"""
    rows: list[BenchRow] = field(default_factory=list)

    @property
    def wrong(self) -> int:
        """Wrong elements over every row."""
        return sum(r.wrong or 0 for r in self.rows)

    def avg_busbw(self, op: str | None = None) -> float:
        """Mean bus bandwidth over the measured rows (of ``op``), GB/s."""
        vals = [r.busbw for r in self.rows if r.busbw is not None and (op is None or r.op == op)]
        return sum(vals) / len(vals) if vals else 0.0


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) already started this process as one rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(config: BenchConfig) -> BenchResult:
    """Run the benchmark: spawn ``config.world_size`` ranks, or be one rank under torchrun."""
    import torch

    if config.device_type == "cuda" and not torch.cuda.is_available():
        what = "backend nccl needs" if config.backend == "nccl" else "--tensors cuda needs"
        raise ValueError(f"{what} CUDA GPUs and this machine has none; use gloo or gradwire on cpu")
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        check_world(config, world)
        return run_rank(rank, world, config, external=True)
    from gradwire.launch import spawn

    check_world(config, config.world_size)
    return spawn(run_rank, config.world_size, (config,), timeout=config.timeout)[0]


def run_rank(rank: int, world: int, config: BenchConfig, external: bool = False) -> BenchResult:
    """One rank's whole benchmark: join the group, measure, (under torchrun) leave.

    ``external`` is True when an outside launcher (torchrun) started this
    process; otherwise the launcher owns teardown (see :mod:`gradwire.launch`).
    """
    import torch
    import torch.distributed as dist

    import gradwire

    if config.backend == "gradwire":
        gradwire.configure(config.net)
    if not external:
        # Spawned ranks share this machine's cores. torch sized its thread pool
        # at import, before the launcher's OMP_NUM_THREADS applied; more threads
        # than cores made the copy of an out-of-place call many times slower.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if config.device_type == "cuda":  # ranks beyond the GPU count share them (gradwire: on gloo)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(config.backend, rank=rank, world_size=world,
                            timeout=timedelta(seconds=config.timeout))
    try:
        return run_in_group(config)
    finally:
        if external:
            dist.destroy_process_group()


def run_in_group(config: BenchConfig) -> BenchResult:
    """Measure on the already initialised default group (every rank calls this; all get the same rows).

    ``config.backend`` must name the group's backend: it picks the clock and
    whether the network model is the group's own.
    """
    import torch
    import torch.distributed as dist

    import gradwire
    from gradwire.net import NetworkModel
    from gradwire.net.spec import resolve_topology

    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(config, world)
    cuda = config.device_type == "cuda"
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
    model = gradwire.network() if config.backend == "gradwire" else None
    if model is not None and model.is_zero:
        model = None
    if model is None and config.net and config.backend != "gradwire":  # the model column of a real network
        model = NetworkModel(resolve_topology(config.net, world, os.environ), world)
    result = BenchResult(config, world, config.backend, model.spec if model else None,
                         simulated=model is not None and config.backend == "gradwire")
    me = f"Rank {rank:2d} Group 0 Pid {os.getpid():6d} on {socket.gethostname():>10} device {device}"
    names: list[str | None] = [None] * world
    dist.all_gather_object(names, me)
    result.ranks = [str(n) for n in names]
    ctx = RankSetup(rank, world, getattr(torch, DTYPES[config.dtype]), config.redop, config.root, device)
    result.rows = _sweep(config, ctx, _clock(config, device), model)
    return result


def _clock(config: BenchConfig, device: "object") -> Callable[[], float]:
    import torch

    import gradwire

    read = gradwire.clock if config.backend == "gradwire" else time.perf_counter
    if getattr(device, "type", "cpu") != "cuda":
        return read

    def synced() -> float:
        torch.cuda.synchronize()
        return read()

    return synced


def _sweep(config: BenchConfig, ctx: RankSetup, clock: Callable[[], float],
           model: NetworkModel | None) -> list[BenchRow]:
    from gradwire.bench.progress import progress_bar

    elem = _elem_size(ctx)
    plan = [(COLLECTIVES[op], lay) for op in config.ops
            for lay in dict.fromkeys(COLLECTIVES[op].layout(n, elem, ctx.world) for n in config.sizes)
            if lay.count > 0]
    rows: list[BenchRow] = []
    with progress_bar(len(plan), enabled=config.progress and ctx.rank == 0) as advance:
        for coll, lay in plan:
            model_us = coll.model_seconds(model, lay.size) * 1e6 if model is not None else None
            for in_place in (False, True):
                if in_place and not coll.has_in_place:
                    rows.append(_row(coll, lay, config, ctx, IN_PLACE, None, None, model_us))
                    continue
                warmup = 0 if in_place else config.warmup
                seconds, wrong = _measure(coll, lay, config, ctx, clock, in_place, warmup)
                rows.append(_row(coll, lay, config, ctx, IN_PLACE if in_place else OUT_OF_PLACE,
                                 seconds, wrong, model_us))
            advance(f"{coll.name} {lay.size} B")
    return rows


def _elem_size(ctx: RankSetup) -> int:
    import torch

    return torch.empty(0, dtype=ctx.dtype).element_size()


def _measure(coll: Collective, lay: Buffers, config: BenchConfig, ctx: RankSetup,
             clock: Callable[[], float], in_place: bool, warmup: int) -> tuple[float, int | None]:
    """Mean seconds per call (mean over ranks) and wrong elements (sum over ranks)."""
    import torch
    import torch.distributed as dist

    send, recv = coll.buffers(ctx, lay, in_place)
    for _ in range(warmup):
        coll.run(ctx, send, recv, in_place)
    dist.barrier()
    t0 = clock()
    for _ in range(config.iters):
        coll.run(ctx, send, recv, in_place)
    seconds = (clock() - t0) / config.iters + reduction_seconds(coll, lay, ctx.world, config)
    wrong = _check(coll, lay, ctx, in_place) if config.check else 0
    both = torch.tensor([seconds, float(wrong)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(both)
    return both[0].item() / ctx.world, (int(both[1].item()) if config.check else None)


def reduction_seconds(coll: Collective, lay: Buffers, world: int, config: BenchConfig) -> float:
    """Seconds of one call's arithmetic on the simulated cluster's roofline device (module doc); 0 elsewhere.

    Only on the simulated clock with a roofline device (a named one, TFLOPS/GBps,
    ``:xF``): ``host`` prices this host's CPU time, which the backend's paused
    meter does not see, and no device at all prices no compute.
    """
    net = config.net
    if config.backend != "gradwire" or net is None or net.clock != "sim" or not net.device:
        return 0.0
    from gradwire.device import op_seconds, parse_device

    spec = parse_device(net.device)
    if spec.kind != "roofline" or spec.device is None:
        return 0.0
    flops, nbytes, ops = coll.reduction(lay, world)
    if not ops:
        return 0.0
    half = config.dtype in ("half", "float16", "bfloat16")
    return ops * op_seconds(spec.device, flops / ops, nbytes // ops, half)


def _check(coll: Collective, lay: Buffers, ctx: RankSetup, in_place: bool) -> int:
    """Run once on fresh input and count the elements of this rank's output that are wrong."""
    import torch

    send, recv = coll.buffers(ctx, lay, in_place)
    coll.run(ctx, send, recv, in_place)
    expected = coll.expected(ctx, lay)
    if expected is None:
        return 0
    got = recv.detach().cpu()
    if os.environ.get(CORRUPT_ENV) == coll.name and got.numel():
        got = got.clone()
        got[0] += 1  # deliberate wrong result, to test that #wrong and the exit code see it
    want = expected.to(ctx.dtype)
    if not ctx.dtype.is_floating_point:
        return int((got != want).sum().item())
    rtol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}.get(ctx.dtype, 1e-12)
    ok = torch.isclose(got.double(), want.double(), rtol=rtol, atol=0.0)
    return int((~ok).sum().item())


def _row(coll: Collective, lay: Buffers, config: BenchConfig, ctx: RankSetup, placement: str,
         seconds: float | None, wrong: int | None, model_us: float | None) -> BenchRow:
    redop = config.redop if coll.reduces else "none"
    root = config.root if coll.rooted else -1
    if seconds is None:
        return BenchRow(coll.name, lay.size, lay.count, config.dtype, redop, root, placement, None, None, None, None, model_us)
    algbw = lay.size / seconds / 1e9 if seconds > 0 else float("inf")
    return BenchRow(coll.name, lay.size, lay.count, config.dtype, redop, root, placement, seconds * 1e6,
               algbw, algbw * coll.bus_factor(ctx.world), wrong, model_us)
