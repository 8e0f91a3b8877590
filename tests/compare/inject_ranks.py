"""Rank functions: strategies applied to DDP models built the way Lightning, the HF Trainer and Accelerate build them.

Each case installs the injection (as ``gradwire compare -- CMD`` does in every
rank), builds a DDP model with the options a stack sets, trains a few steps
in the stack's shape (a closure, clipping, a GradScaler, ``no_sync()``
accumulation, unused parameters, buffers) and returns what happened: the
injection's status and reason, the parameters, and whether every rank ended
on the same ones.
"""
from __future__ import annotations

import copy
import datetime
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4


def _init(rank: int, world: int) -> None:
    import gradwire

    torch.set_num_threads(1)
    gradwire.configure("loopback")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))


class Net(nn.Module):
    """Two layers of more than a compressor's minimum size; an optional branch that forward never uses."""

    def __init__(self, unused: bool = False, norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.BatchNorm1d(64) if norm else nn.Identity()
        self.fc2 = nn.Linear(64, 32)
        self.spare = nn.Linear(32, 32) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


def _data(rank: int, steps: int = STEPS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7 + rank)
    return [torch.randn(16, 32, generator=gen) for _ in range(steps)]


def _loss(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(module(x), x.flip(1))


def _closure(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """What Lightning hands ``optimizer.step``: zero_grad, forward and backward, the loss returned."""
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _loss(ddp, x)
        loss.backward()
        return loss
    return closure


def _params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _same_on_every_rank(params: list[torch.Tensor]) -> bool:
    flat = torch.cat([p.reshape(-1) for p in params])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def _run(strategy: str, train: Callable[[], nn.Module]) -> dict[str, Any]:
    """Train under ``strategy``; the injection's record, the parameters, and whether the ranks agree."""
    from gradwire.compare.inject import StrategyNotApplied, StrategyRefused, install, uninstall

    injection = install(strategy, adam_warmup=2)
    out: dict[str, Any] = {}
    try:
        module = train()
        injection.close()
        params = _params(module.module if isinstance(module, DDP) else module)
        out["params"] = params
        out["same"] = _same_on_every_rank(params)
    except (StrategyRefused, StrategyNotApplied) as exc:
        out["raised"] = str(exc)
    finally:
        uninstall()
    out.update(injection.record())
    return out


def _model(**kwargs: Any) -> nn.Module:
    torch.manual_seed(0)
    return Net(**kwargs)


def plain(rank: int, closure: bool, optimizer: str = "sgd") -> Callable[[], nn.Module]:
    """The usual loop, or Lightning's shape: ``optimizer.step(closure)`` runs zero_grad, forward and backward."""
    def train() -> nn.Module:
        ddp = DDP(_model())
        opt: torch.optim.Optimizer = (torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
                                      if optimizer == "sgd" else torch.optim.AdamW(ddp.parameters(), lr=1e-2))
        for x in _data(rank):
            if closure:
                opt.step(_closure(ddp, opt, x))
            else:
                opt.zero_grad()
                _loss(ddp, x).backward()
                opt.step()
        return ddp
    return train


def lbfgs(rank: int) -> Callable[[], nn.Module]:
    def train() -> nn.Module:
        ddp = DDP(_model())
        opt = torch.optim.LBFGS(ddp.parameters(), lr=0.5, max_iter=3)
        for x in _data(rank, 2):
            opt.step(_closure(ddp, opt, x))
        return ddp
    return train


def clipped(rank: int) -> Callable[[], nn.Module]:
    """The HF Trainer's shape: clip the gradient norm between backward and step."""
    def train() -> nn.Module:
        ddp = DDP(_model(unused=True), find_unused_parameters=True)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for x in _data(rank):
            opt.zero_grad()
            _loss(ddp, x).backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.1)
            opt.step()
        return ddp
    return train


def mixed(rank: int, scaled: bool) -> Callable[[], nn.Module]:
    """bf16 autocast (the gradients stay fp32: the parameters are), with or without a GradScaler."""
    def train() -> nn.Module:
        ddp = DDP(_model())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", enabled=scaled)
        for x in _data(rank):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = _loss(ddp, x)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return ddp
    return train


def accumulated(rank: int) -> Callable[[], nn.Module]:
    """Gradient accumulation: one micro-batch inside ``no_sync()``, then the synchronised one."""
    def train() -> nn.Module:
        ddp = DDP(_model())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        data = _data(rank, 2 * STEPS)
        for a, b in zip(data[::2], data[1::2]):
            opt.zero_grad()
            with ddp.no_sync():
                _loss(ddp, a).backward()
            _loss(ddp, b).backward()
            opt.step()
        return ddp
    return train


def ddp_options(rank: int, **options: Any) -> Callable[[], nn.Module]:
    """DDP built with the options a stack sets (unused parameters, static graph, buffers, bucket views)."""
    norm = options.pop("norm", False)
    unused = options.get("find_unused_parameters", False)

    def train() -> nn.Module:
        ddp = DDP(_model(unused=unused, norm=norm), **options)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for x in _data(rank):
            opt.zero_grad()
            _loss(ddp, x).backward()
            opt.step()
        return ddp
    return train


#: the threshold of :func:`clip_records`, far below the average gradient's norm (about 1 for this model)
CLIP_NORM = 0.05


def clip_records(rank: int, records: list[dict[str, Any]], optimizer: str = "sgd") -> Callable[[], nn.Module]:
    """Clipped steps, each recorded: ``.grad`` as the script reads it before the clip, this rank's own gradient
    (an undistributed twin at the same parameters), and the update the step applied (SGD, lr 1, no momentum:
    the update is the gradient stepped on)."""
    def train() -> nn.Module:
        ddp = DDP(_model(), bucket_cap_mb=0.004)  # two buckets: the norm is over every bucket, not one
        opt = torch.optim.SGD(ddp.parameters(), lr=1.0)
        for x in _data(rank):
            twin = copy.deepcopy(ddp.module)
            _loss(twin, x).backward()
            opt.zero_grad()
            _loss(ddp, x).backward()
            params = list(ddp.parameters())
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])  # a script logging the norm
            read = torch.cat([p.grad.reshape(-1) for p in params]).clone()
            torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
            before = torch.cat([p.detach().reshape(-1) for p in params])
            opt.step()
            after = torch.cat([p.detach().reshape(-1) for p in params])
            records.append({"read": read, "norm": float(norm), "update": before - after,
                            "own": torch.cat([p.grad.reshape(-1) for p in twin.parameters()])})
        return ddp
    return train


def clip_cases(rank: int, world: int, strategies: list[str], adam: bool = False) -> list[dict[str, Any]]:
    """:func:`clip_records` (``adam``: :func:`adam_clip_records`) under each strategy in turn in one process group."""
    _init(rank, world)
    records_of = adam_clip_records if adam else clip_records
    out = []
    for strategy in strategies:
        records: list[dict[str, Any]] = []
        run = _run(strategy, records_of(rank, records))
        run["records"] = records
        out.append(run)
    return out


CASES: dict[str, Callable[..., Callable[[], nn.Module]]] = {
    "plain": lambda rank: plain(rank, False),
    "closure": lambda rank: plain(rank, True),
    "adamw-plain": lambda rank: plain(rank, False, "adamw"),
    "adamw-closure": lambda rank: plain(rank, True, "adamw"),
    "lbfgs": lbfgs,
    "clipped": clipped,
    "scaled": lambda rank: mixed(rank, True),
    "bf16": lambda rank: mixed(rank, False),
    "accumulated": accumulated,
    "unused": lambda rank: ddp_options(rank, find_unused_parameters=True),
    "static": lambda rank: ddp_options(rank, static_graph=True),
    "buffers": lambda rank: ddp_options(rank, norm=True, broadcast_buffers=True),
    "views": lambda rank: ddp_options(rank, gradient_as_bucket_view=True),
}


def cases(rank: int, world: int, runs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each (strategy, case) in turn in one process group."""
    _init(rank, world)
    return [_run(strategy, CASES[case](rank)) for strategy, case in runs]


def torchft_rounds(rank: int, world: int, strategy: str, steps: int) -> dict[str, Any]:
    """AdamW under ``strategy`` (torchft's DiLoCo) for ``steps``: the injection's record, whether the ranks end
    on one model, and the bytes that went over the gradwire groups torchft made."""
    import gradwire

    _init(rank, world)

    def train() -> nn.Module:
        ddp = DDP(_model())
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        for x in _data(rank, steps):
            opt.zero_grad()
            _loss(ddp, x).backward()
            opt.step()
        return ddp

    out = _run(strategy, train)
    out["torchft_bytes"] = sum(e.payload_bytes for e in gradwire.events() if e.group.startswith("torchft_"))
    out["torchft_ops"] = sum(1 for e in gradwire.events() if e.group.startswith("torchft_") and e.op == "all_reduce")
    dist.destroy_process_group()
    return out


def torchft_rank_leaves(rank: int, world: int, strategy: str, steps: int, leaver: int, leave_at: int
                        ) -> dict[str, Any]:
    """AdamW under ``strategy`` (torchft's DiLoCo, a group timeout of 10 s) where rank ``leaver`` stops after
    ``leave_at`` steps and ends (its process with it, its Manager unclosed: a script that stopped early); every
    other rank's error (or none) and the seconds it trained after that."""
    import gradwire
    from gradwire.compare.inject import install

    torch.set_num_threads(1)
    gradwire.configure("loopback")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=10))
    injection = install(strategy, adam_warmup=2)
    ddp = DDP(_model())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    left_at = None
    try:
        for step, x in enumerate(_data(rank, steps)):
            if step == leave_at:
                left_at = time.monotonic()
                if rank == leaver:
                    return {"left": True}
            opt.zero_grad()
            _loss(ddp, x).backward()
            opt.step()
    except Exception as exc:  # what the survivor met
        return {"raised": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - (left_at or 0.0)}
    return {"raised": None, "seconds": time.monotonic() - (left_at or 0.0)}


def adam_clip_records(rank: int, records: list[dict[str, Any]]) -> Callable[[], nn.Module]:
    """AdamW, clip_grad_norm_ below the average's norm, each step recorded: the norm the script logs and the one
    its clip took, the average gradient's exact norm (the ranks' own gradients gathered), ``.grad`` before and
    after the clip, this rank's own gradient, the parameters before and after the step, whether the ranks agree."""
    import gradwire

    def exchanged() -> int:  # bytes this rank sent on groups other than the default one (the exchange's)
        default = dist.distributed_c10d._get_default_group().group_name
        return sum(e.wire_bytes for e in gradwire.events() if e.group != default)

    def train() -> nn.Module:
        ddp = DDP(_model(), bucket_cap_mb=0.004)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.1)
        for x in _data(rank, 6):
            sent = exchanged()
            twin = copy.deepcopy(ddp.module)
            _loss(twin, x).backward()
            own = torch.cat([p.grad.reshape(-1) for p in twin.parameters()])
            gathered = [torch.empty_like(own) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, own)
            exact = sum(gathered) / len(gathered)
            opt.zero_grad()
            _loss(ddp, x).backward()
            params = list(ddp.parameters())
            logged = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
            read = torch.cat([p.grad.reshape(-1) for p in params]).clone()
            clipped_by = float(torch.nn.utils.clip_grad_norm_(params, CLIP_NORM))
            after_clip = torch.cat([p.grad.reshape(-1) for p in params]).clone()
            before = torch.cat([p.detach().reshape(-1) for p in params])
            opt.step()
            after = torch.cat([p.detach().reshape(-1) for p in params])
            records.append({"logged": logged, "clip_norm": clipped_by, "exact_norm": float(exact.norm()),
                            "exact": exact, "own": own, "read": read, "after_clip": after_clip,
                            "before": before, "after": after, "same": _same_on_every_rank(params),
                            "exchanged": exchanged() - sent})
        return ddp
    return train
