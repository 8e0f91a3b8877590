"""Rank functions for the API-completeness tests: what model-parallel libraries call on a group."""
from __future__ import annotations

import datetime
import time
from typing import Any, Callable

import torch
import torch.distributed as dist


def _init(rank: int, world: int, backend: str, net: str | None) -> None:
    if backend == "gradwire":
        import gradwire

        gradwire.configure(net)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - compared between backends
        return ("error", type(exc).__name__, str(exc).splitlines()[0][:200])


def _vals(rank: int, n: int, salt: int = 0) -> torch.Tensor:
    return ((torch.arange(n, dtype=torch.float32) * 3 + rank * 5 + salt) % 7) + 1


def api_suite(rank: int, world: int, backend: str, net: str | None) -> dict:
    _init(rank, world, backend, net)
    import torch.distributed._functional_collectives as funcol

    out: dict[str, Any] = {}
    w = dist.group.WORLD
    out["names"] = (w.group_name, w.group_desc)
    sub = dist.new_group(list(range(world)), group_desc="my_sub")
    out["sub_names"] = (sub.group_name, sub.group_desc)

    def subgroups() -> Any:
        mine, _ = dist.new_subgroups(world // 2)
        t = _vals(rank, 3)
        dist.all_reduce(t, group=mine)
        return mine.group_name is not None, t

    out["new_subgroups"] = _try(subgroups)

    def destroy() -> Any:
        g = dist.new_group([0, 1])
        t = _vals(rank, 2)
        if rank < 2:
            dist.all_reduce(t, group=g)
        dist.destroy_process_group(g)
        return t, g in dist.distributed_c10d._world.pg_map

    out["destroy_subgroup"] = _try(destroy)

    def mesh() -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        m = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        t = _vals(rank, 4)
        dist.all_reduce(t, group=m.get_group("tp"))
        return m["dp"].get_group().group_desc, t

    out["device_mesh"] = _try(mesh)

    def batch_p2p() -> Any:
        send, recv = _vals(rank, 5), torch.zeros(5)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return recv

    out["batch_isend_irecv"] = _try(batch_p2p)

    def coalesced(kind: str, async_ops: bool, device: Any = None) -> Any:
        with dist._coalescing_manager(device=device, async_ops=async_ops) as cm:
            if kind == "all_reduce":
                ts = [_vals(rank, 3), _vals(rank, 5, 1)]
                for t in ts:
                    dist.all_reduce(t)
            elif kind == "all_gather":
                ts = [torch.zeros(2 * world), torch.zeros(4 * world)]
                for i, t in enumerate(ts):
                    dist.all_gather_into_tensor(t, _vals(rank, t.numel() // world, i))
            else:
                ts = [torch.zeros(2), torch.zeros(4)]
                for i, t in enumerate(ts):
                    dist.reduce_scatter_tensor(t, _vals(rank, t.numel() * world, i))
        if async_ops:
            cm.wait()
        return ts

    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        out[f"coalesced_{kind}_async"] = _try(lambda: coalesced(kind, True))
        out[f"coalesced_{kind}_sync"] = _try(lambda: coalesced(kind, False))

    def device_coalesced() -> Any:
        send, recv = _vals(rank, 4), torch.zeros(4)
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            dist.isend(send, (rank + 1) % world)
            dist.irecv(recv, (rank - 1) % world)
        cm.wait()
        return recv

    out["device_coalescing"] = _try(device_coalesced)
    # gloo refuses this mode at its start and torch leaves the group marked as coalescing: clear the mark,
    # or every later all_reduce would be queued instead of run
    dist.distributed_c10d._world.pg_coalesce_state.pop(dist.distributed_c10d._get_default_group(), None)
    ts = [_vals(rank, 3), _vals(rank, 6, 2)]
    out["allreduce_coalesced"] = _try(lambda: (dist.all_reduce_coalesced(ts), ts)[1])
    def done(ts: list) -> list:
        return [funcol.wait_tensor(t).clone() for t in ts]

    out["funcol_all_gather_coalesced"] = _try(
        lambda: done(funcol.all_gather_into_tensor_coalesced([_vals(rank, 2), _vals(rank, 3, 1)], w)))
    out["funcol_reduce_scatter_coalesced"] = _try(
        lambda: done(funcol.reduce_scatter_tensor_coalesced([_vals(rank, 2 * world), _vals(rank, 4 * world, 1)],
                                                            "sum", [0, 0], w)))
    out["funcol_all_reduce_coalesced"] = _try(
        lambda: done(funcol.all_reduce_coalesced([_vals(rank, 2), _vals(rank, 3, 1)], "avg", w)))

    def any_source() -> Any:
        t = torch.zeros(3)
        if rank == 0:
            got = [dist.recv(t) for _ in range(world - 1)]
            return sorted(got)
        dist.send(_vals(rank, 3), 0)
        return None

    out["recv_any_source"] = _try(any_source)
    out["monitored_barrier"] = _try(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=10)))
    if backend == "gradwire":
        import gradwire

        gradwire.reset_stats()
        with dist._coalescing_manager(async_ops=True) as cm:
            for n in (1000, 3000):
                dist.all_gather_into_tensor(torch.zeros(n * world), torch.ones(n))
        cm.wait()
        out["priced"] = gradwire.stats().as_dict()["all_gather"]
    dist.barrier()
    # last: gloo reports a failed op again at its next barrier
    out["int_reduce_avg"] = _try(lambda: dist.reduce(torch.ones(2, dtype=torch.int64), 0, op=dist.ReduceOp.AVG))
    out["int_all_reduce_avg"] = _try(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG))
    return out


def mismatches(rank: int, world: int, backend: str) -> dict:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL: the ranks call collectives of different shapes, then different ops."""
    dist.set_debug_level_from_env()  # torch read the environment at import, before spawn's env was applied
    _init(rank, world, backend, "10gbe")
    calls = {
        "shape": lambda: dist.all_reduce(torch.ones(3 + rank)),
        "op": lambda: dist.all_reduce(torch.ones(3)) if rank == 0 else dist.broadcast(torch.ones(3), 0),
    }
    out = {}
    for kind, call in calls.items():
        try:
            call()
            out[kind] = {"error": None}
        except Exception as exc:  # noqa: BLE001
            out[kind] = {"error": type(exc).__name__, "message": str(exc)[:600]}
    return out
