"""Rank functions for the overlap tests (module level: spawn pickles them by name)."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import nn


def _init(rank: int, world: int, net: str | None = None) -> None:
    import gradwire

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def _batches(rank: int, steps: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + rank)
    return [(torch.rand(batch, 1, 8, 8, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(steps)]


def handler_vs_ddp(rank: int, world: int, steps: int) -> dict[str, list[torch.Tensor]]:
    """Train the CNN N steps with DDP and with AsyncGradientHandler from the same start."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire.strategies import AsyncGradientHandler, broadcast_module
    from gradwire.train import build_model

    _init(rank, world)
    data, loss_fn, out = _batches(rank, steps), nn.CrossEntropyLoss(), {}
    for kind in ("ddp", "handler"):
        model = build_model("cnn", seed=rank)  # different per rank: the start must come from rank 0
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if kind == "ddp":
            module: nn.Module = DDP(model)
        else:
            broadcast_module(model)
            module, handler = model, AsyncGradientHandler(model)
            handler.attach(opt)
        for x, y in data:
            opt.zero_grad()
            loss_fn(module(x), y).backward()
            if kind == "handler":
                handler.synchronize()
            opt.step()
        out[kind] = [p.detach().clone() for p in model.parameters()]
    return out


def handler_misuse(rank: int, world: int) -> dict[str, str]:
    """Step before synchronize, and a second backward before synchronize: both must raise."""
    from gradwire.strategies import AsyncGradientHandler, broadcast_module

    _init(rank, world, "bandwidth=10mbit,latency=20ms")
    model = nn.Linear(64, 10)
    broadcast_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = AsyncGradientHandler(model)
    handler.attach(opt)
    x = torch.ones(4, 64)
    out: dict[str, str] = {}
    model(x).sum().backward()
    out["pending"] = str(handler.pending)
    before = model.weight.detach().clone()
    try:
        opt.step()
        out["step"] = "no error"
    except RuntimeError as exc:
        out["step"] = str(exc)
    out["unchanged"] = str(torch.equal(before, model.weight))
    try:
        model(x).sum().backward()
        out["twice"] = "no error"
    except RuntimeError as exc:
        out["twice"] = str(exc)
    handler.synchronize()
    opt.step()  # allowed now
    out["after"] = str(handler.pending)
    return out


def train_many(rank: int, world: int, net: str, configs: list) -> list:
    """Run several TrainConfigs one after the other on one process group."""
    from gradwire.train import train_rank

    _init(rank, world, net)
    return [train_rank(c) for c in configs]


class _Recorder:
    """Stands in for the optimizer: records the gradient each step would apply, changes nothing."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.applied: list[torch.Tensor] = []

    def step(self) -> None:
        self.applied.append(torch.cat([p.grad.reshape(-1) for p in self.params]).clone())


def delayed_updates(rank: int, world: int, names: list[str], steps: int) -> dict[str, dict]:
    """Per strategy: this rank's local gradients, what ``step``/``finish`` applied, every rank's mean gradient."""
    from gradwire.strategies import parse_strategy
    from gradwire.train import build_model

    _init(rank, world)
    loss_fn, out = nn.CrossEntropyLoss(), {}
    for name in names:
        strategy = parse_strategy(name).build(momentum=0.9)
        model = build_model("cnn", seed=rank)  # different per rank: the start must come from rank 0
        module = strategy.wrap(model)
        recorder = _Recorder(list(model.parameters()))
        local = []
        for x, y in _batches(rank, steps):
            for p in model.parameters():
                p.grad = None
            loss_fn(module(x), y).backward()
            local.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
            strategy.step(recorder)
        strategy.finish(recorder)
        stacked = torch.stack(local)
        gathered = [torch.empty_like(stacked) for _ in range(world)]
        dist.all_gather(gathered, stacked)
        out[name] = {"local": stacked, "applied": recorder.applied, "mean": torch.stack(gathered).mean(0),
                     "skipped": getattr(strategy, "skipped", 0),
                     "per_parameter_steps": getattr(strategy, "per_parameter_steps", 0)}
    return out


def exposure(rank: int, world: int, names: list[str], steps: int, compute_s: float) -> dict[str, tuple]:
    """Per strategy: (modelled seconds, waited seconds, network-waited seconds) with ``compute_s`` of fake compute."""
    import time

    import gradwire
    from gradwire.strategies import parse_strategy, split_exposed, step_comm_seconds

    # Linear(64, 10): 2.6 KB, about 21 ms per all_reduce: long beside a busy host's scheduling delays, which
    # count as other waits, not the network's
    _init(rank, world, "bandwidth=1mbit,latency=100us")
    out = {}
    for name in names:
        strategy = parse_strategy(name).build(momentum=0.9)
        model = nn.Linear(64, 10)
        module = strategy.wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=strategy.optimizer_momentum)
        windows, waits = [], []
        x = torch.ones(8, 64)
        dist.barrier()
        for _ in range(steps):
            t0 = gradwire.clock()
            opt.zero_grad()
            module(x).sum().backward()
            strategy.step(opt)
            time.sleep(compute_s)  # the rest of the step's compute, after the exchange was launched
            windows.append((t0, gradwire.clock()))
            waits.append(strategy.pop_waits())
        strategy.finish(opt)
        events = gradwire.events()
        comm, _ = step_comm_seconds(events, windows)
        network = split_exposed(events, waits)
        out[name] = (sum(comm), sum(b - a for w in waits for a, b in w), sum(network))
    return out


def cpu_and_cuda(rank: int, world: int, names: list[str], steps: int) -> dict[str, dict]:
    """Per strategy: the same training (start, data, steps) on CPU and on CUDA; final parameters and losses."""
    from gradwire.backend import groups
    from gradwire.strategies import parse_strategy
    from gradwire.train import build_model

    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.backends.cudnn.deterministic = True
    _init(rank, world)
    loss_fn, out = nn.CrossEntropyLoss(), {}
    for name in names:
        out[name] = {}
        for device in ("cpu", "cuda"):
            strategy = parse_strategy(name).build(momentum=0.9)
            model = build_model("cnn", seed=rank).to(device)  # the start comes from rank 0
            try:
                module = strategy.wrap(model)
            except RuntimeError as exc:  # torch-powersgd on CPU where CUDA is (torch_hooks.py)
                out[name][device] = {"refused": str(exc)}
                continue
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=strategy.optimizer_momentum)
            strategy.attach(opt)
            losses = []
            for x, y in _batches(rank, steps, batch=32):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(module(x.to(device)), y.to(device))
                loss.backward()
                strategy.step(opt)
                losses.append(loss.item())
            strategy.finish(opt)
            params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            out[name][device] = {"params": params.cpu(), "losses": losses, "on_device": params.device.type}
    out["inner"] = sorted({str(g.cuda_inner) for g in groups().values()})
    return out


def strategy_resume(rank: int, world: int, name: str, steps: int, save_at: int | None = None,
                    resume_at: int | None = None, path: str = "") -> torch.Tensor:
    """Train ``steps`` steps of a strategy; ``save_at``: checkpoint (model, optimizer, strategy) and stop;
    ``resume_at``: a new model, strategy and optimizer load it and train the rest. Returns the final parameters."""
    from gradwire.strategies import build_strategy
    from gradwire.train import build_model

    _init(rank, world)
    strategy = build_strategy(name, momentum=0.9)
    model = build_model("cnn", seed=0)
    module = strategy.wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=strategy.optimizer_momentum)
    start = 0
    if resume_at is not None:
        ckpt = torch.load(f"{path}.rank{rank}", weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        strategy.load_state_dict(ckpt["strategy"])
        start = resume_at
    loss_fn = nn.CrossEntropyLoss()
    batches = _batches(rank, steps)
    for x, y in batches[start:save_at]:
        opt.zero_grad()
        loss_fn(module(x), y).backward()
        strategy.step(opt)
    if save_at is not None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "strategy": strategy.state_dict()},
                   f"{path}.rank{rank}")
        return torch.empty(0)
    strategy.finish(opt)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def powersgd_many_buckets(rank: int, world: int, net: str, steps: int) -> float:
    """PyTorch's PowerSGD hook over many small DDP buckets on a slow simulated network; the parameters' sum."""
    import torch.distributed as dist

    import gradwire
    from gradwire.strategies import build_strategy
    from gradwire.train.models import build_model

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world)
    strategy = build_strategy("torch-powersgd:1:start=2")
    strategy.bucket_cap_mb = 0.25  # mlp-deep's 2 M parameters in about 35 buckets
    model = build_model("mlp-deep", seed=0)
    module = strategy.wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    strategy.attach(opt)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        module(torch.randn(16, 64, generator=gen)).square().mean().backward()
        strategy.step(opt)
    strategy.finish(opt)
    total = float(sum(p.double().sum() for p in model.parameters()))
    dist.destroy_process_group()
    return total
