"""One process (world size 1, gloo) that applies strategies to small DDP models the way a script builds them.

Each case installs the injection, builds what a script builds, takes a few
steps and reports the injection's status and what it saw; the injection is
uninstalled between cases.
"""
from __future__ import annotations

import datetime
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def _steps(module: nn.Module, opt: torch.optim.Optimizer, n: int = 3, sched: Any = None) -> None:
    for _ in range(n):
        x = torch.randn(8, 32)
        loss = nn.functional.mse_loss(module(x), x[:, :4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()


def _case(strategy: str, script: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    from gradwire.compare.inject import StrategyNotApplied, StrategyRefused, install, uninstall

    injection = install(strategy, adam_warmup=2)
    out: dict[str, Any] = {}
    try:
        out.update(script())
    except (StrategyRefused, StrategyNotApplied) as exc:
        out["raised"] = f"{type(exc).__name__}: {exc}"
    finally:
        uninstall()
    out.update(injection.record())
    return out


def sgd_moved() -> dict[str, Any]:
    ddp = DDP(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    _steps(ddp, opt)
    return {"momentum": opt.param_groups[0]["momentum"], "weight_decay": opt.param_groups[0]["weight_decay"]}


def nesterov() -> dict[str, Any]:
    ddp = DDP(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    _steps(ddp, opt)
    return {"momentum": opt.param_groups[0]["momentum"]}


def rmsprop() -> dict[str, Any]:
    ddp = DDP(_model())
    opt = torch.optim.RMSprop(ddp.parameters(), lr=1e-3)
    _steps(ddp, opt)
    return {}


def adamw_scheduled() -> dict[str, Any]:
    ddp = DDP(_model())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # made before the first forward
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(ddp, opt, n=4, sched=sched)
    return {"bucket_view": ddp.gradient_as_bucket_view, "lr": opt.param_groups[0]["lr"],
            "warnings": [str(w.message) for w in caught if "lr_scheduler" in str(w.message)],
            "step": float(opt.state[next(iter(ddp.parameters()))]["step"])}


def no_ddp() -> dict[str, Any]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    _steps(model, opt)
    return {"trained": True}


def second_ddp() -> dict[str, Any]:
    DDP(_model())
    DDP(_model())
    return {}


def own_hook() -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp = DDP(_model())
    ddp.register_comm_hook(None, allreduce_hook)
    return {}


def sgd_clipped(first_clip: int = 0) -> Callable[[], dict[str, Any]]:
    """SGD with momentum and decay, clipping the gradient norm from step ``first_clip`` on."""
    def script() -> dict[str, Any]:
        ddp = DDP(_model())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
        for step in range(3):
            x = torch.randn(8, 32)
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), x[:, :4]).backward()
            if step >= first_clip:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.1)
            opt.step()
        return {"momentum": opt.param_groups[0]["momentum"], "weight_decay": opt.param_groups[0]["weight_decay"],
                "momentum_buffer": opt.state[next(iter(ddp.parameters()))].get("momentum_buffer") is not None}
    return script


def no_optimizer() -> dict[str, Any]:
    ddp = DDP(_model())
    ddp(torch.randn(8, 32)).sum().backward()
    return {}


def cases(rank: int, world: int) -> dict[str, dict[str, Any]]:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    return {
        "onebit_sgd": _case("onebit", sgd_moved),
        "onebit_nesterov": _case("onebit", nesterov),
        "onebit_rmsprop": _case("onebit", rmsprop),
        "localsgd_rmsprop": _case("localsgd:2", rmsprop),
        "delayed_adamw": _case("onebit+delayed", adamw_scheduled),
        "handler_adamw": _case("onebit+handler", adamw_scheduled),
        "fp16_nesterov": _case("torch-fp16", nesterov),
        "onebit_no_ddp": _case("onebit", no_ddp),
        "sync_no_ddp": _case("sync", no_ddp),
        "onebit_second_ddp": _case("onebit", second_ddp),
        "sync_second_ddp": _case("sync", second_ddp),
        "onebit_own_hook": _case("onebit", own_hook),
        "onebit_no_optimizer": _case("onebit", no_optimizer),
        "onebit_clipped": _case("onebit", sgd_clipped()),
        "onebit_clips_late": _case("onebit", sgd_clipped(first_clip=1)),
    }
