"""Rank functions for tests/exchange/test_schemes.py (spawn pickles them by name).

Each trains the same small float64 model twice on every rank's own data:
once with plain DDP and the optimizer as written (the reference), once with
the optimizer's momentum (and, for Adam, the frozen variance) moved into a
``CompressionState`` with the ``none`` compressor, the exchange's DDP hook and
``scheme.step()``. float64 keeps the rounding of the two orders of additions
far below what a wrong formula would change.
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).double()


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank % 100)
    return [(torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randn(8, 4, generator=g, dtype=torch.float64))
            for _ in range(STEPS)]


#: the frozen-variance step alone: no refreshes, floor or clipping (what torch's step with v held does)
FROZEN = {"refresh": False, "variance_floor": 0.0, "max_update_rms": None, "precondition": False}


def _train(rank: int, make_opt: Callable[[Any], torch.optim.Optimizer], schemed: bool,
           adam_warmup: int = 3, freeze_reference_at: int | None = None, adam: dict | None = None,
           data_rank: int | None = None) -> dict[str, Any]:
    from gradwire.exchange import CompressionState
    from gradwire.exchange.schemes import scheme_for
    from gradwire.hooks import scheme_hook

    model = _model()
    ddp = DDP(model)
    opt = make_opt(ddp.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # lr read every step
    scheme = None
    if schemed:
        state = CompressionState("none")
        scheme = scheme_for(opt, state, adam_warmup=adam_warmup, **(FROZEN if adam is None else adam))
        ddp.register_comm_hook(scheme, scheme_hook)
    frozen: dict[nn.Parameter, torch.Tensor] = {}
    for step, (x, y) in enumerate(_batches(rank if data_rank is None else data_rank), start=1):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        if scheme is not None:
            scheme.step()
        else:
            if freeze_reference_at is not None and step > freeze_reference_at:
                # torch's own AdamW step with the variance held: choose the previous exp_avg_sq so that
                # beta2 * prev + (1 - beta2) g^2 = v_hat * (1 - beta2^t), what the step reads as v_hat
                b2 = opt.param_groups[0]["betas"][1]
                for p in model.parameters():
                    target = frozen[p] * (1 - b2 ** step)
                    opt.state[p]["exp_avg_sq"].copy_((target - (1 - b2) * p.grad * p.grad) / b2)
            opt.step()
            if freeze_reference_at is not None and step == freeze_reference_at:
                b2 = opt.param_groups[0]["betas"][1]
                frozen = {p: opt.state[p]["exp_avg_sq"] / (1 - b2 ** step) for p in model.parameters()}
        sched.step()
    out = {"params": [p.detach().clone() for p in model.parameters()],
           "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
           "state": [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
                     for p in model.parameters()]}
    if scheme is not None:
        out["scheme"] = {"steps": scheme.steps, "exchange_momentum": scheme.state.momentum,
                         "describe": scheme.describe(), "frozen": getattr(scheme, "frozen", None),
                         "refreshes": getattr(scheme, "refreshes", None)}
        if getattr(scheme, "frozen", False):
            out["denominators"] = [scheme.denominators[p].clone() for p in model.parameters()]
            out["local_v"] = [scheme.local_v[p].clone() for p in model.parameters() if p in scheme.local_v]
    return out


def schemes_vs_plain(rank: int, world: int) -> dict[str, Any]:
    """SGD (momentum + L2 decay), SGD maximize, AdamW and Adam: plain vs schemed, on this rank."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2)  # noqa: E731
    sgd_max = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, weight_decay=1e-2, maximize=True)  # noqa: E731
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)  # noqa: E731
    adam = lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.95))  # noqa: E731
    out = {}
    for name, make in (("sgd", sgd), ("sgd_maximize", sgd_max)):
        out[name] = (_train(rank, make, False), _train(rank, make, True))
    for name, make in (("adamw", adamw), ("adam", adam)):
        out[name] = (_train(rank, make, False, freeze_reference_at=3), _train(rank, make, True, adam_warmup=3))
    # the exchange in the preconditioner's units: with an exact exchange, the same steps to rounding
    out["adamw_units"] = (out["adamw"][0], _train(rank, adamw, True, adam_warmup=3,
                                                  adam={**FROZEN, "precondition": True}))
    # refreshes after steps 4 and 8 (2 and 4 times the warm-up of 2), levels followed every step;
    # once with every rank on the same data (no noise between the ranks), once on its own
    refreshed = {"refresh": True, "track_every": 1}
    out["refresh_same"] = _train(rank, adamw, True, adam_warmup=2, adam=refreshed, data_rank=0)
    out["refresh_own"] = _train(rank, adamw, True, adam_warmup=2, adam=refreshed)
    # the warm-up alone: with the freeze past the last step the scheme is torch's Adam, bit for bit
    out["adamw_warmup_only"] = (_train(rank, adamw, False), _train(rank, adamw, True, adam_warmup=STEPS + 1))
    return out


def local_moments_resume(rank: int, world: int, split: int, compressor: str, delayed: bool = False) -> dict[str, Any]:
    """LocalMomentsAdam in a hand-written loop that clips: ``STEPS`` steps straight, then ``split`` steps, a
    checkpoint as users write it (rank 0 saves the model and ``scheme.state_dict()``, a collective), fresh
    objects loading it before ``DDP(...)``, and the remaining steps. Both runs' parameters, the norms the clip
    took and whether the ranks agree after every step."""
    import io

    from gradwire.exchange import CompressionState, LocalMomentsAdam
    from gradwire.hooks import scheme_hook

    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    batches = _batches(rank)

    def build(saved: dict[str, Any] | None = None) -> tuple[DDP, Any]:
        model = _model()
        if saved is not None and not delayed:
            model.load_state_dict(saved["model"])  # before DDP, which broadcasts rank 0's parameters
        ddp = DDP(model)
        if saved is not None and delayed:
            model.load_state_dict(saved["model"])  # each rank's own, after DDP's broadcast
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.1)
        scheme = LocalMomentsAdam(opt, CompressionState(compressor, min_compress_numel=0), exact_first=False,
                                  delayed=delayed)
        if saved is not None:
            scheme.load_state_dict(saved["scheme"])
        ddp.register_comm_hook(scheme, scheme_hook)
        return ddp, scheme

    def train(ddp: DDP, scheme: Any, steps: list) -> tuple[list[float], list[bool]]:
        norms, same = [], []
        for x, y in steps:
            scheme.optimizer.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            params = list(ddp.parameters())
            norm = scheme.global_norm([p.grad for p in params])
            torch.nn.utils.clip_grads_with_norm_(params, 0.05, norm)
            scheme.step()
            norms.append(float(norm))
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            same.append(all(torch.equal(gathered[0], g) for g in gathered))
        return norms, same

    ddp, scheme = build()
    norms, same = train(ddp, scheme, batches)
    straight = [p.detach().clone() for p in ddp.parameters()]

    ddp, scheme = build()
    first, _ = train(ddp, scheme, batches[:split])
    state = scheme.state_dict()  # every rank calls it; rank 0 saves
    blob = io.BytesIO()
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(), "scheme": state}, blob)
    payload = [blob.getvalue()]
    dist.broadcast_object_list(payload, src=0)  # the file every rank reads
    saved = torch.load(io.BytesIO(payload[0]), weights_only=False)
    if delayed:  # the replicas differ by their latest own directions: each rank resumes its own model
        saved["model"] = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    ddp, scheme = build(saved)
    second, _ = train(ddp, scheme, batches[split:])
    resumed = [p.detach().clone() for p in ddp.parameters()]
    dist.destroy_process_group()
    return {"straight": straight, "resumed": resumed, "norms": norms, "norms_resumed": first + second,
            "same": same}


def local_moments_vs_adamw(rank: int, world: int, delayed: bool) -> dict[str, Any]:
    """LocalMomentsAdam with the ``none`` exchange and every rank on the same data (the ranks agree, so
    ``rho`` is 1 and each rank's moments are the average's) against torch's AdamW under plain DDP, both
    clipping by norm below the gradient's: the parameters after every step, and ``finish``'s."""
    from gradwire.exchange import CompressionState, LocalMomentsAdam
    from gradwire.hooks import scheme_hook

    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    runs: list[list[torch.Tensor]] = []
    for schemed in (False, True):
        ddp = DDP(_model())
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.1)
        scheme = None
        if schemed:
            scheme = LocalMomentsAdam(opt, CompressionState("none"), exact_first=False, delayed=delayed)
            ddp.register_comm_hook(scheme, scheme_hook)
        trace = []
        for x, y in _batches(0):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            params = list(ddp.parameters())
            if scheme is None:
                torch.nn.utils.clip_grad_norm_(params, 0.05)
                opt.step()
            else:
                torch.nn.utils.clip_grads_with_norm_(params, 0.05, scheme.global_norm([p.grad for p in params]))
                scheme.step()
            trace.append(torch.cat([p.detach().reshape(-1) for p in params]).clone())
        if scheme is not None:
            scheme.finish()
            trace.append(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).clone())
        runs.append(trace)
    dist.destroy_process_group()
    return {"adamw": runs[0], "scheme": runs[1]}
